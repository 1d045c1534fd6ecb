#!/usr/bin/env bash
# What the native library buys: native vs portable, per scenario, in one PostgreSQL 18 server
# (the shared /opt/idempotency-pg18, where the native extension is installed), one database
# per edition, pgbench with one client, editions alternating. Not a test: it prints a table.
#
#   tests/portable/bench.sh [SECONDS]      (default 10 per scenario and edition)
#
# Port 56290, folder /tmp/idem-port-bench. bench/run.sh is the project's benchmark; this is
# the portable edition's quick comparison until bench/run.sh measures it.
set -uo pipefail
. "$(dirname "$0")/../lib.sh" || exit 2
SECONDS_EACH=${1:-10}
BIN=$(PG18_VENV=/opt/idempotency-pg18 pg_bindir 18)
DIR=/tmp/idem-port-bench
PORT=56290
RELEASE=$ROOT/sql/portable/idempotency-portable--0.3.0.sql
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

latency() { # latency DB SCRIPT: pgbench's average latency in ms
    "$BIN/pgbench" -n -h "$DIR" -p "$PORT" -U postgres -c 1 -T "$SECONDS_EACH" -f "$DIR/scripts/$2.sql" "$1" 2>&1 |
        sed -nE 's/^latency average = ([0-9.]+) ms.*/\1/p'
}
printf 'doc sizes: %s\n' "$(psql -d portable -c "SELECT string_agg(n || ' fields: ' || octet_length(doc::text) || ' bytes', ', ' ORDER BY n) FROM docs")"
printf '%-18s %14s %14s %10s\n' scenario "native ms" "portable ms" "ratio"
for s in claim_complete replay in_progress seen fingerprint_600b fingerprint_63kb; do
    native_ms=$(latency native "$s")
    portable_ms=$(latency portable "$s")
    awk -v s="$s" -v n="$native_ms" -v p="$portable_ms" 'BEGIN { printf "%-18s %14.3f %14.3f %9.1fx\n", s, n, p, p / n }'
done
