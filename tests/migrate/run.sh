#!/usr/bin/env bash
# Moving a database from PostgreSQL 15 to 18 as a DBA would.
#   1. A 15 database holding completed, in-progress, expired and seen records (and a
#      TOASTed response); what 15 answers for them is written down.
#   2. pg_dump -Fc of it (18's, and 15's: see section 2 why both), pg_restore into an 18 cluster
#      with the extension installed: completed keys replay the same bytes; in-progress keys
#      answer in_progress (409) and their old tokens still fence (a wrong token gets IK002),
#      checkpoint and complete; seen ids stay seen; expired records count as expired and are
#      claimed afresh; the application's own table is there.
#   3. pg_upgrade 15 -> 18 of the same cluster: the same checks if it works. If it fails
#      because 18 rejects the pg_attver column option 15 writes (the failure reported in
#      issue 14), a skip line says so (not counted as passed); any other failure is a FAIL.
# Installs the extension (cargo pgrx install --release) into a major that lacks it.
#   tests/migrate/run.sh [DIR] [PORT15] [PORT18]
set -uo pipefail
. "$(dirname "$0")/../lib.sh" || exit 2
cd "$ROOT" || exit 2
DIR=$(realpath -m "${1:-$(dir_of migrate)}")
PORT15=${2:-$(port_of migrate 15)}
PORT18=${3:-$(port_of migrate 18)}
BIN15=$(pg_bindir 15)
BIN18=$(pg_bindir 18)
export PATH="$HOME/.cargo/bin:$PATH"

for major in 15 18; do
    use_major "$major" || { fail "PostgreSQL $major is not installed (scripts/install-deps.sh)"; finish migrate; exit; }
    extension_installed && continue
    echo "installing the extension into PostgreSQL $major (cargo pgrx install --release --features pg$major)"
    cargo pgrx install --release --no-default-features --features "pg$major" --pg-config "$(pg_config_for "$major")" \
        >"$DIR.install$major.log" 2>&1 || { tail -20 "$DIR.install$major.log"; fail "cargo pgrx install into PostgreSQL $major"; finish migrate; exit; }
done

rm -rf "$DIR"
mkdir -p "$DIR"
cleanup() {
    cluster_stop "$DIR/pg15"
    cluster_stop "$DIR/pg18"
    cluster_stop "$DIR/upgraded"
}
trap cleanup EXIT
# psql (18's, it reads both) against a cluster: sql DIR PORT ARGS...
# DB: the database the checks run in (each restore gets its own).
DB=app
sql() { local d=$1 p=$2; shift 2; "$BIN18/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$d/socket" -p "$p" -U postgres -d "$DB" "$@"; }

# --- 1. the 15 database -------------------------------------------------------------------------
use_major 15
cluster_fresh "$DIR/pg15" "$PORT15" || { fail "start the 15 cluster"; finish migrate; exit; }
"$BIN15/psql" -X -q -h "$DIR/pg15/socket" -p "$PORT15" -U postgres -d postgres -c "CREATE DATABASE app"
sql "$DIR/pg15" "$PORT15" >/dev/null <<'SQL' || { fail "write the records on 15"; finish migrate; exit; }
CREATE EXTENSION idempotency;
-- The application's own table, written in the same transactions as its records.
CREATE TABLE public.charges (id text PRIMARY KEY, amount int NOT NULL);
INSERT INTO public.charges SELECT 'ch_' || i, 100 * i FROM generate_series(1, 20) AS i;
SET search_path = idempotency, public;
-- 20 completed, with bodies in several scripts, numbers, nulls; one of 300 kB (TOASTed)
SELECT idem_complete('mig', 'done-' || i,
         (idem_claim('mig', 'done-' || i, idem_fingerprint(jsonb_build_object('n', i)))).token,
         200 + i % 3,
         jsonb_build_object('id', i, 'text', repeat('é€😀 ', i), 'num', 1.5e300 / i, 'small', 0.1 * i,
                            'list', jsonb_build_array(i, NULL, true, 'ü')),
         jsonb_build_object('Location', '/r/' || i))
  FROM generate_series(1, 20) AS i;
SELECT idem_complete('mig', 'done-big', (idem_claim('mig', 'done-big')).token, 201,
         jsonb_build_object('blob', repeat(md5('x'), 10000)));
-- 5 in_progress with an hour's lease, one with a checkpoint (tokens: see below)
-- 5 expired (completed, past expires_at as if their ttl had run out)
SELECT idem_complete('mig', 'old-' || i, (idem_claim('mig', 'old-' || i)).token, 200, '{"old": true}')
  FROM generate_series(1, 5) AS i;
UPDATE keys SET expires_at = now() - interval '1 minute' WHERE key LIKE 'old-%';
-- 10 seen message ids
SELECT idem_seen('mig-consumer', 'm-' || i) FROM generate_series(1, 10) AS i;
SQL
sql "$DIR/pg15" "$PORT15" -c "SELECT key, (idempotency.idem_claim('mig', key, lease => '1 hour')).token
                               FROM (SELECT 'busy-' || i AS key FROM generate_series(1, 5) AS i) AS k" >"$DIR/tokens" 2>&1
sql "$DIR/pg15" "$PORT15" -c "SELECT idempotency.idem_checkpoint('mig', 'busy-1', '$(sed -n 's/^busy-1|//p' "$DIR/tokens")', 'charged', '{\"charge\": \"ch_1\"}')" >/dev/null ||
    fail "checkpoint on 15"
check "15: five in_progress claims with their tokens" 5 "$(grep -c '^busy-[0-9]|[0-9a-f-]\{36\}$' "$DIR/tokens")"

# What a retry of each completed key answers (replay writes nothing).
replays() { # replays DIR PORT
    sql "$1" "$2" -c "SET search_path = idempotency" -c "
        SELECT k.key, r.outcome, r.http_status, r.response_status, r.response_headers::text,
               md5(r.response_body::text), length(r.response_body::text)
          FROM (SELECT key, CASE WHEN key = 'done-big' THEN NULL
                                 ELSE idem_fingerprint(jsonb_build_object('n', substr(key, 6)::int)) END AS fp
                  FROM keys WHERE key LIKE 'done-%') AS k,
               LATERAL idem_claim('mig', k.key, k.fp) AS r
         ORDER BY k.key"
}
expected_replays=$(replays "$DIR/pg15" "$PORT15")
check "15: 21 completed keys replay" 21 "$(grep -c '|replay|' <<<"$expected_replays")"
cluster_stop "$DIR/pg15"

# The checks on an 18 cluster holding the migrated database: checks_18 LABEL DIR PORT
checks_18() {
    local label=$1 d=$2 p=$3 t1 t2 out
    check "$label: the extension is $(extension_version) on PostgreSQL 18" "$(extension_version)|18" \
        "$(sql "$d" "$p" -c "SELECT extversion, current_setting('server_version_num')::int / 10000 FROM pg_extension WHERE extname = 'idempotency'")"
    check "$label: completed keys replay the same status, headers and body bytes" "$expected_replays" "$(replays "$d" "$p")"
    check "$label: stats (in_progress, completed, stale, expired, messages)" "5|21|0|5|10" \
        "$(sql "$d" "$p" -c "SELECT in_progress, completed, stale, expired, messages FROM idempotency.stats")"
    check "$label: in-progress keys answer in_progress with 409" "$(printf 'in_progress|409\n%.0s' 1 2 3 4 5)" \
        "$(sql "$d" "$p" -c "SELECT r.outcome, r.http_status FROM generate_series(1, 5) AS i, idempotency.idem_claim('mig', 'busy-' || i) AS r")"
    out=$(sql "$d" "$p" -v VERBOSITY=sqlstate -c "SELECT idempotency.idem_complete('mig', 'busy-2', gen_random_uuid(), 200)" 2>&1)
    check "$label: a token that does not own the claim is fenced off (IK002)" "ERROR:  IK002" "$out"
    t1=$(sed -n 's/^busy-1|//p' "$DIR/tokens")
    t2=$(sed -n 's/^busy-2|//p' "$DIR/tokens")
    check "$label: the old token's checkpoint is there" "charged|{\"charge\": \"ch_1\"}" \
        "$(sql "$d" "$p" -c "SELECT recovery_point, recovery_data FROM idempotency.idem_lookup('mig', 'busy-1')")"
    check "$label: the old token renews its lease (idem_checkpoint)" t \
        "$(sql "$d" "$p" -c "SELECT idempotency.idem_checkpoint('mig', 'busy-1', '$t1', 'shipped') > now()")"
    sql "$d" "$p" -c "SELECT idempotency.idem_complete('mig', 'busy-1', '$t1', 201, '{\"charge\": \"ch_1\"}')" \
        -c "SELECT idempotency.idem_complete('mig', 'busy-2', '$t2', 500, '{\"error\": \"declined\"}')" >/dev/null 2>&1
    check "$label: the old tokens complete their claims, which then replay" "replay|201|{\"charge\": \"ch_1\"} replay|500|{\"error\": \"declined\"} " \
        "$(sql "$d" "$p" -c "SELECT r.outcome, r.response_status, r.response_body FROM unnest(ARRAY['busy-1', 'busy-2']) AS k, idempotency.idem_claim('mig', k) AS r" | tr '\n' ' ')"
    check "$label: seen ids stay seen, a new one is new" "0|t" \
        "$(sql "$d" "$p" -c "SELECT count(*) FILTER (WHERE idempotency.idem_seen('mig-consumer', 'm-' || i)), idempotency.idem_seen('mig-consumer', 'm-new') FROM generate_series(1, 10) AS i")"
    check "$label: an expired key is claimed afresh" claimed \
        "$(sql "$d" "$p" -c "SELECT outcome FROM idempotency.idem_claim('mig', 'old-1')")"
    check "$label: the sweep deletes the other expired records" 4 "$(sql "$d" "$p" -c "SELECT idempotency.idem_sweep()")"
}
app_table() { # app_table LABEL DIR PORT
    check "$1: the application's table came along" "20|21000" "$(sql "$2" "$3" -c "SELECT count(*), sum(amount) FROM public.charges")"
}

# --- 2. dump and restore into 18 --------------------------------------------------------------
# 18's pg_dump writes, for every column of a table it dumps, the column option pg_attver that
# Debian's 15.20 keeps in pg_attribute.attoptions (ALTER TABLE ... ALTER COLUMN ... SET
# (pg_attver=...)), which 18 rejects; 15's own pg_dump leaves it out. The extension's tables
# are not affected (CREATE EXTENSION makes them, the dump holds only their rows); the
# application's table is. Both ways are checked:
#   a. 18's pg_dump -Fc, 18's pg_restore: the extension's records all checked; the application
#      table is lost to the pg_attver errors (a skip line says so; any other error is a FAIL)
#   b. 15's pg_dump -Fc, 18's pg_restore --exit-on-error: no error, everything checked
use_major 15
cluster_start "$DIR/pg15" "$PORT15" || { fail "restart the 15 cluster"; finish migrate; exit; }
for way in 18 15; do
    bin=$BIN18
    [ "$way" = 15 ] && bin=$BIN15
    if "$bin/pg_dump" -Fc -h "$DIR/pg15/socket" -p "$PORT15" -U postgres -d app -f "$DIR/dump$way" 2>"$DIR/dump$way.log"; then
        ok "$way's pg_dump -Fc of the 15 database"
    else
        fail "$way's pg_dump -Fc of the 15 database" "$(cat "$DIR/dump$way.log")"
    fi
done
cluster_stop "$DIR/pg15"
use_major 18
cluster_fresh "$DIR/pg18" "$PORT18" || { fail "start the 18 cluster"; finish migrate; exit; }
"$BIN18/psql" -X -q -h "$DIR/pg18/socket" -p "$PORT18" -U postgres -d postgres \
    -c "CREATE DATABASE from18dump" -c "CREATE DATABASE from15dump"

"$BIN18/pg_restore" -h "$DIR/pg18/socket" -p "$PORT18" -U postgres -d from18dump "$DIR/dump18" 2>"$DIR/restore18.log"
DB=from18dump checks_18 "18's dump, restored" "$DIR/pg18" "$PORT18"
# The application's table: its CREATE TABLE goes in one command with the ALTER COLUMN ... SET
# (pg_attver=...) lines, so 18 rejects all of it and the table and its rows are missing.
other_errors=$(grep 'ERROR:' "$DIR/restore18.log" | grep -v 'unrecognized parameter "pg_attver"' |
    grep -v 'relation "public.charges" does not exist')
if grep -q 'unrecognized parameter "pg_attver"' "$DIR/restore18.log" && [ -z "$other_errors" ]; then
    skip "18's dump, restored: the application's table" \
        "18's pg_dump writes the pg_attver column option Debian's 15.20 keeps on every column, 18 rejects it, so pg_restore loses every application table (ERROR: unrecognized parameter \"pg_attver\"); the extension's records come through (checked above). Dump with 15's pg_dump instead (checked below)"
else
    [ -n "$other_errors" ] && fail "18's dump: pg_restore's errors other than pg_attver" "$other_errors"
    DB=from18dump app_table "18's dump, restored" "$DIR/pg18" "$PORT18"
fi

if "$BIN18/pg_restore" --exit-on-error -h "$DIR/pg18/socket" -p "$PORT18" -U postgres -d from15dump "$DIR/dump15" 2>"$DIR/restore15.log"; then
    ok "15's dump: 18's pg_restore --exit-on-error, no error"
    DB=from15dump checks_18 "15's dump, restored" "$DIR/pg18" "$PORT18"
    DB=from15dump app_table "15's dump, restored" "$DIR/pg18" "$PORT18"
else
    fail "15's dump: 18's pg_restore --exit-on-error" "$(head -5 "$DIR/restore15.log")"
fi
cluster_stop "$DIR/pg18"

# --- 3. pg_upgrade 15 -> 18 ----------------------------------------------------------------------
# The new cluster: made by cluster_start (its port and socket settings), then stopped, and its
# data checksums turned off (18's initdb turns them on, 15's did not, pg_upgrade wants both alike).
use_major 18
if ! { cluster_fresh "$DIR/upgraded" "$PORT18" && cluster_stop "$DIR/upgraded" &&
        as_postgres "$BIN18/pg_checksums" --disable -D "$DIR/upgraded/data" >/dev/null; }; then
    fail "prepare the new 18 cluster for pg_upgrade"; finish migrate; exit
fi
as_postgres mkdir -p "$DIR/upgraded/work"
# shellcheck disable=SC2016 # expanded by the inner bash
(cd / && runuser -u postgres -- bash -c 'cd "$1" && shift && exec "$@"' _ "$DIR/upgraded/work" \
    "$BIN18/pg_upgrade" -b "$BIN15" -B "$BIN18" -d "$DIR/pg15/data" -D "$DIR/upgraded/data" \
    -p "$PORT15" -P "$PORT18" -s "$DIR/upgraded/work" -U postgres) >"$DIR/pg_upgrade.log" 2>&1
status=$?
if [ "$status" = 0 ]; then
    ok "pg_upgrade 15 -> 18"
    cluster_start "$DIR/upgraded" "$PORT18" || fail "start the upgraded cluster"
    checks_18 "pg_upgrade" "$DIR/upgraded" "$PORT18"
    app_table "pg_upgrade" "$DIR/upgraded" "$PORT18"
    cluster_stop "$DIR/upgraded"
else
    why=$(grep -rh --include='*.log' 'ERROR: .*pg_attver' "$DIR"/upgraded/data/pg_upgrade_output.d 2>/dev/null | head -1 | sed 's/.*ERROR: */ERROR: /')
    if [ -n "$why" ]; then
        skip "pg_upgrade 15 -> 18 and its checks" \
            "pg_upgrade from $("$BIN15/postgres" --version | sed 's/^postgres (PostgreSQL) \([0-9.]*\).*/\1/') to $("$BIN18/postgres" --version | sed 's/^postgres (PostgreSQL) \([0-9.]*\).*/\1/') fails here for every table, not only ours: 18's pg_dump --binary-upgrade writes the pg_attver column option Debian's 15.20 keeps on every column, and 18 rejects it. pg_upgrade says: $(tr -s ' \n' ' ' <<<"$why")"
    else
        tail -30 "$DIR/pg_upgrade.log"
        find "$DIR/upgraded/data" -path '*pg_upgrade_output.d*' -name '*.log' -exec tail -n 20 {} + 2>/dev/null
        fail "pg_upgrade 15 -> 18" "failed (status $status) for a reason other than the known pg_attver one"
    fi
fi

finish migrate
