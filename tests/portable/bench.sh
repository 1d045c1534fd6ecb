#!/usr/bin/env bash
# What the native library buys: native vs portable, per scenario, in one PostgreSQL 18 server
# (the shared /opt/idempotency-pg18, where the native extension is installed), one database
# per edition, pgbench with one client, editions alternating. Not a test: it prints a table.
#
#   tests/portable/bench.sh [SECONDS]      (default 10 per scenario and edition)
#
# Then idem_claim's wait: the delay from the owner's COMMIT (the moment it is sent) to
# each waiter's answer, with 1 waiter (20 rounds) and 50 waiters on one key, and the CPU the
# waiting backends burn (utime + stime from /proc/PID/stat over 5 seconds), per edition.
#
# Port and folder: tests/lib.sh's portable-bench (PORT_BENCH_PORT, PORT_BENCH_DIR; PORT_BENCH_BIN: another
# server with the native extension). bench/run.sh is the project's benchmark; this is
# the portable edition's quick comparison until bench/run.sh measures it.
set -uo pipefail
. "$(dirname "$0")/../lib.sh" || exit 2
SECONDS_EACH=${1:-10}
BIN=${PORT_BENCH_BIN:-$(PG18_VENV=/opt/idempotency-pg18 pg_bindir 18)}
DIR=${PORT_BENCH_DIR:-$(dir_of portable-bench 18)}
PORT=${PORT_BENCH_PORT:-$(port_of portable-bench 18)}
RELEASE=$(portable_script)
[ -f "$("$BIN/pg_config" --pkglibdir)/idempotency.so" ] || { echo "bench: the native extension is not installed in $BIN/.."; exit 2; }

[ -f "$DIR/data/postmaster.pid" ] && as_postgres "$BIN/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null
rm -rf "$DIR" && mkdir -p "$DIR" && chown postgres "$DIR"
as_postgres "$BIN/initdb" -D "$DIR/data" -A trust -U postgres -E UTF8 --locale=C >/dev/null
# synchronous_commit off: the disk's flush (about 5 ms here) would hide what the functions cost.
printf "port = %s\nunix_socket_directories = '%s'\nlisten_addresses = ''\nsynchronous_commit = off\n" "$PORT" "$DIR" >>"$DIR/data/postgresql.conf"
as_postgres "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w start >/dev/null
trap 'as_postgres "$BIN/pg_ctl" -D "$DIR/data" -m fast -w stop >/dev/null' EXIT
psql() { "$BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$DIR" -p "$PORT" -U postgres "$@"; }
psql -d postgres -c "CREATE DATABASE native" -c "CREATE DATABASE portable"
psql -d native -c "CREATE EXTENSION idempotency"
psql -d portable -1 -f "$RELEASE" >/dev/null
for db in native portable; do
    psql -d "$db" -c "SELECT idempotency.idem_complete('bench', 'done', token, 201, '{\"id\": 1}') FROM idempotency.idem_claim('bench', 'done', 'fp')" \
        -c "SELECT idempotency.idem_claim('bench', 'running', 'fp')" \
        -c "CREATE TABLE docs AS SELECT (SELECT jsonb_object_agg('field_' || i, CASE WHEN i % 3 = 0 THEN to_jsonb(i * 1.25) WHEN i % 3 = 1 THEN to_jsonb('value ' || i) ELSE jsonb_build_object('n', i, 'tags', jsonb_build_array('a', 'b')) END) FROM generate_series(1, n) AS i) AS doc, n FROM (VALUES (20), (2000)) AS t(n)" >/dev/null
done

mkdir -p "$DIR/scripts"
cat >"$DIR/scripts/claim_complete.sql" <<'EOF'
\set k random(1, 2000000000)
BEGIN;
SELECT idempotency.idem_complete('bench', 'k' || :k, c.token, 201, '{"id": 1}')
  FROM idempotency.idem_claim('bench', 'k' || :k, 'fp') AS c;
COMMIT;
EOF
echo "SELECT outcome FROM idempotency.idem_claim('bench', 'done', 'fp');" >"$DIR/scripts/replay.sql"
echo "SELECT outcome FROM idempotency.idem_claim('bench', 'running', 'fp');" >"$DIR/scripts/in_progress.sql"
echo "SELECT idempotency.idem_fingerprint(doc) FROM docs WHERE n = 20;" >"$DIR/scripts/fingerprint_600b.sql"
echo "SELECT idempotency.idem_fingerprint(doc) FROM docs WHERE n = 2000;" >"$DIR/scripts/fingerprint_63kb.sql"
cat >"$DIR/scripts/seen.sql" <<'EOF'
\set k random(1, 2000000000)
SELECT idempotency.idem_seen('bench', 'm' || :k);
EOF
# A batch of 100 new ids, and the same batch again and again (all duplicates).
cat >"$DIR/scripts/seen_many_100.sql" <<'EOF'
\set k random(1, 2000000000)
SELECT idempotency.idem_seen_many('bench', array_agg('b' || :k || '-' || i)) FROM generate_series(1, 100) AS i;
EOF
echo "SELECT idempotency.idem_seen_many('bench', array_agg('dup-' || i)) FROM generate_series(1, 100) AS i;" >"$DIR/scripts/seen_many_100_dups.sql"

latency() { # latency DB SCRIPT: pgbench's average latency in ms
    "$BIN/pgbench" -n -h "$DIR" -p "$PORT" -U postgres -c 1 -T "$SECONDS_EACH" -f "$DIR/scripts/$2.sql" "$1" 2>&1 |
        sed -nE 's/^latency average = ([0-9.]+) ms.*/\1/p'
}
printf 'doc sizes: %s\n' "$(psql -d portable -c "SELECT string_agg(n || ' fields: ' || octet_length(doc::text) || ' bytes', ', ' ORDER BY n) FROM docs")"
printf '%-18s %14s %14s %10s\n' scenario "native ms" "portable ms" "ratio"
for s in claim_complete replay in_progress seen seen_many_100 seen_many_100_dups fingerprint_600b fingerprint_63kb; do
    native_ms=$(latency native "$s")
    portable_ms=$(latency portable "$s")
    awk -v s="$s" -v n="$native_ms" -v p="$portable_ms" 'BEGIN { printf "%-18s %14.3f %14.3f %9.1fx\n", s, n, p, p / n }'
done

# --- idem_claim's wait -------------------------------------------------------------------

cpu_ticks() { # cpu_ticks PID...: utime + stime of the processes, in clock ticks
    local pid sum=0
    for pid in "$@"; do sum=$((sum + $(sed 's/^.*) //' "/proc/$pid/stat" | awk '{ print $12 + $13 }'))); done
    echo "$sum"
}
# wait_round DB N [MEASURE]: N waiters on a claim held by another session; after MEASURE
# seconds of waiting (their CPU measured then, printed in % of one core) the owner completes
# and commits. Appends each waiter's delay from that COMMIT (ms) to $DIR/delays.
wait_round() {
    local db=$1 n=$2 measure=${3:-0} i pids tok t0 c0 c1 committed
    psql -d "$db" -c "DELETE FROM idempotency.keys WHERE scope = 'wb'"
    tok=$(psql -d "$db" -c "SELECT token FROM idempotency.idem_claim('wb', 'k', 'fp', lease => '1 hour')")
    rm -f "$DIR"/waiter.*
    for i in $(seq "$n"); do
        psql -d "$db" -c "SELECT extract(epoch FROM clock_timestamp()) FROM idempotency.idem_claim('wb', 'k', 'fp', wait => '60 seconds') WHERE outcome = 'replay'" >"$DIR/waiter.$i" &
    done
    for i in $(seq 500); do
        pids=$(psql -d "$db" -c "SELECT string_agg(pid::text, ' ') FROM pg_stat_activity WHERE query LIKE '%wait => %' AND pid <> pg_backend_pid() AND (wait_event = 'PgSleep' OR wait_event_type = 'Extension')")
        [ "$(wc -w <<<"$pids")" -ge "$n" ] && break
        sleep 0.02
    done
    pids=$(psql -d "$db" -c "SELECT string_agg(pid::text, ' ') FROM pg_stat_activity WHERE query LIKE '%wait => %' AND pid <> pg_backend_pid() AND state = 'active'")
    sleep 0.3
    # shellcheck disable=SC2086 # $pids: a list of process ids, split on purpose
    if [ "$measure" -gt 0 ]; then
        c0=$(cpu_ticks $pids); t0=$(date +%s.%N)
        sleep "$measure"
        c1=$(cpu_ticks $pids)
        awk -v c="$((c1 - c0))" -v hz="$(getconf CLK_TCK)" -v t0="$t0" -v t1="$(date +%s.%N)" 'BEGIN { printf "%.2f", 100 * c / hz / (t1 - t0) }'
    fi
    # The owner's clock just before it sends COMMIT: the delay includes the commit itself.
    committed=$(psql -d "$db" -c "BEGIN" -c "SELECT idempotency.idem_complete('wb', 'k', '$tok', 201)" \
        -c "SELECT extract(epoch FROM clock_timestamp())" -c "COMMIT" | tail -n 1)
    wait
    cat "$DIR"/waiter.* | awk -v c="$committed" 'NF { printf "%.3f\n", ($1 - c) * 1000 }' >>"$DIR/delays"
}
percentiles() { sort -n "$DIR/delays" | awk '{ v[NR] = $1 } END { printf "p50 %.1f ms, p99 %.1f ms (%d answers)", v[int(NR * 0.5 + 0.5)], v[int(NR * 0.99 + 0.5)], NR }'; }
if psql -d native -c "SELECT count(*) FROM pg_proc WHERE proname = 'idem_claim' AND pronargs = 7" | grep -qx 1; then
    echo
    printf '%-10s %-44s %-44s %s\n' edition "1 waiter: COMMIT -> answer" "50 waiters: COMMIT -> answer" "waiters' CPU, % of one core (1 / 50)"
    for db in native portable; do
        rm -f "$DIR/delays"
        cpu1=$(wait_round "$db" 1 5)
        for _ in $(seq 19); do wait_round "$db" 1; done
        one=$(percentiles)
        rm -f "$DIR/delays"
        cpu50=$(wait_round "$db" 50 5)
        printf '%-10s %-44s %-44s %s / %s\n' "$db" "$one" "$(percentiles)" "$cpu1" "$cpu50"
    done
else
    echo "wait: the native extension here has no idem_claim wait (release 0.4.0 or later): not measured"
fi
