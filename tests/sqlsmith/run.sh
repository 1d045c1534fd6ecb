#!/usr/bin/env bash
# SQLsmith (Debian's sqlsmith) against the extension's direct read path: random queries over
# the extension's own tables, view and functions (--exclude-catalog: no catalog relations;
# smith_catalog below: no catalog functions but aggregates), with idempotency.direct_read =
# on, on a fresh cluster holding completed, in-progress, stale and expired claims, seen
# messages and outbound requests, so the direct read finds rows.
#   tests/sqlsmith/run.sh
#   SQLSMITH_SEED=N      SQLsmith's seed (default 3: on 0.6.0's objects its 3000 queries
#                        read keys directly 64 times and messages 2200 times; many seeds
#                        reach only one of the two, and a change of the extension's
#                        functions changes what a seed generates: 22, the seed of 0.5.0,
#                        no longer reaches messages)
#   SQLSMITH_QUERIES=N   how many queries SQLsmith generates (default 3000, about 30 s here)
#   SQLSMITH_KEEP=1      keep the cluster's folder (kept anyway when a check fails)
# Checks: SQLsmith ran its queries; the server log holds no crash (a backend terminated by
# a signal or exiting abnormally, a PANIC) and no internal error (XX000); the server still
# answers. A crash prints the query the backend was running. Its own cluster: tests/lib.sh's
# "sqlsmith" row, data in /tmp/idempotency-sqlsmith[-pg18]. Ends with
# "sqlsmith: N passed, M failed".
set -uo pipefail
. "$(dirname "$0")/../lib.sh" || exit 2
cd "$ROOT" || exit 2
DIR=$(dir_of sqlsmith)
PORT=$(port_of sqlsmith)
SEED=${SQLSMITH_SEED:-3}
QUERIES=${SQLSMITH_QUERIES:-3000}
# Enough queries for the checks below to mean something: fewer, and SQLsmith stopped early.
MIN_QUERIES=$((QUERIES * 9 / 10))
DB=smith

q() { psql -X -q -At -v ON_ERROR_STOP=1 -h "$DIR/socket" -p "$PORT" -U postgres -d "$DB" "$@"; }

# Server log lines that mean a backend died, or an internal error (a Rust panic is one).
crash_lines() { # crash_lines LOGFILE
    grep -E "terminated by signal|was terminated by|PANIC|server process .* exited with exit code [^0]| XX000 " "$1" 2>/dev/null
}

if ! command -v sqlsmith >/dev/null; then
    fail "sqlsmith is installed" "apt-get install sqlsmith (scripts/install-deps.sh)"
    finish sqlsmith
    exit 1
fi
if [ "$IDEM_EDITION" = native ] && ! extension_installed; then
    fail "the extension is installed into PostgreSQL $PG_MAJOR" "cargo pgrx install --release --pg-config $PGBIN/pg_config"
    finish sqlsmith
    exit 1
fi

# track_activity_query_size: the crash report's "Failed process was running" holds the whole
# query. The statements of SQLsmith's many ordinary errors are not logged; the error lines
# (with their SQLSTATE, %e) are. autovacuum off: the rows and their statistics stay as the
# setup leaves them (SQLsmith rolls back each query), so a seed's queries and plans, and
# what they call, change little from run to run.
cluster_fresh "$DIR" "$PORT" "track_activity_query_size = 65536" \
    "log_line_prefix = '%m [%p] %e '" "log_min_error_statement = panic" "autovacuum = off" ||
    { fail "start the cluster"; finish sqlsmith; exit 1; }
cleanup() {
    cluster_stop "$DIR"
    if [ "${SQLSMITH_KEEP:-0}" != 1 ] && [ "$failed" -eq 0 ]; then
        rm -rf "$DIR"
    else
        echo "(cluster stopped; its data, server log and SQLsmith's output are kept in $DIR)"
    fi
}
trap cleanup EXIT

# SQLsmith connects as smith, an application role with docs/security.md's grants, not as a
# superuser: every call goes through the privilege checks the direct read makes, as an
# application's would.
q -d postgres -c "CREATE ROLE smith LOGIN" -c "CREATE DATABASE $DB" &&
    install_extension "$DB" -h "$DIR/socket" -p "$PORT" -U postgres &&
    q >/dev/null <<'SQL'
GRANT USAGE ON SCHEMA idempotency TO smith;
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency.keys, idempotency.messages TO smith;
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency.outbound, idempotency.outbound_budget TO smith;
GRANT SELECT ON idempotency.stats TO smith;
-- Each read of a record says in the server log which path it took: the run's reads are
-- counted from there.
ALTER ROLE smith SET log_min_messages = debug1;
-- SQLsmith picks the functions of its expressions among all of pg_proc (--exclude-catalog
-- keeps only catalog relations out), where ours are 19 of some 3000 and a call of idem_claim
-- or idem_seen that is evaluated is rare. It reads the catalog by unqualified name, so
-- smith's search_path (below) puts this schema first, whose pg_proc holds the extension's
-- functions and the catalog's aggregates only: every function a query calls is ours.
CREATE SCHEMA smith_catalog;
CREATE VIEW smith_catalog.pg_proc AS
SELECT * FROM pg_catalog.pg_proc
 WHERE pronamespace = 'idempotency'::regnamespace
    OR (pronamespace = 'pg_catalog'::regnamespace AND prokind = 'a');
GRANT USAGE ON SCHEMA smith_catalog TO smith;
GRANT SELECT ON smith_catalog.pg_proc TO smith;
-- Records of every kind, made through the API. Completed, with responses:
SELECT count(idempotency.idem_complete('acct_' || i % 7 || ' POST /charges', 'done-' || i, c.token, 200 + i % 3,
                                       jsonb_build_object('id', i, 'note', repeat('x', i % 50)),
                                       '{"content-type": "application/json"}'))
  FROM generate_series(1, 2000) AS i,
       LATERAL idempotency.idem_claim('acct_' || i % 7 || ' POST /charges', 'done-' || i,
                                      'fp-' || i) AS c
 WHERE c.outcome = 'claimed';
-- In progress, their leases running:
SELECT count(idempotency.idem_claim('acct_' || i % 7 || ' POST /charges', 'busy-' || i, 'fp-' || i))
  FROM generate_series(1, 500) AS i;
-- In progress, their leases ended (stale) after a checkpoint:
SELECT count(idempotency.idem_checkpoint('acct_' || i % 7 || ' POST /refunds', 'stale-' || i, c.token,
                                         'charged', jsonb_build_object('step', i % 3),
                                         lease => '1 millisecond'))
  FROM generate_series(1, 50) AS i,
       LATERAL idempotency.idem_claim('acct_' || i % 7 || ' POST /refunds', 'stale-' || i) AS c;
-- Completed, their ttl over (expired, not yet swept):
SELECT count(idempotency.idem_complete('acct_' || i % 7 || ' POST /orders', 'old-' || i, c.token, 201))
  FROM generate_series(1, 50) AS i,
       LATERAL idempotency.idem_claim('acct_' || i % 7 || ' POST /orders', 'old-' || i, NULL,
                                      ttl => '1 millisecond') AS c;
-- Seen messages, a few with a short ttl:
SELECT count(idempotency.idem_seen('queue_' || i % 5, 'msg-' || i,
                                   CASE WHEN i % 10 = 0 THEN interval '1 millisecond' END))
  FROM generate_series(1, 2000) AS i;
-- Outbound requests (the sending side), so that queries over those tables find rows too:
SELECT count(*) FROM generate_series(1, 200) AS i,
       LATERAL idempotency.idem_send('acct_' || i % 7 || ' payouts', 'payout-' || i,
                                     'bank-' || i % 3, jsonb_build_object('amount', i)) AS s;
SELECT pg_sleep(0.1);
ANALYZE idempotency.keys, idempotency.messages;
SQL
setup=$?
check "the database with the extension and its records" 0 "$setup"
records=$(q -c "SELECT string_agg(n::text, ' ') FROM (
                  SELECT count(*) FILTER (WHERE status = 'completed' AND expires_at > now()) AS a,
                         count(*) FILTER (WHERE status = 'in_progress' AND locked_until > now()) AS b,
                         count(*) FILTER (WHERE status = 'in_progress' AND locked_until <= now()) AS c,
                         count(*) FILTER (WHERE expires_at <= now()) AS d
                    FROM idempotency.keys) s, LATERAL (VALUES (a), (b), (c), (d)) v(n)")
check "completed, in-progress, stale and expired claims" "2000 500 50 50" "$records"
check "seen messages" 2000 "$(q -c "SELECT count(*) FROM idempotency.messages")"

# statement_timeout: a generated pg_sleep, or a claim's wait, ends within a second.
target="host=$DIR/socket port=$PORT user=smith dbname=$DB"
target+=" options='-c idempotency.direct_read=on -c statement_timeout=1s -c lock_timeout=1s"
target+=" -c search_path=smith_catalog,pg_catalog'"

# SQLsmith's sessions read directly: a replay and a duplicate message, with its connection
# string, say so in their DEBUG1 lines (docs/operations.md#read-paths).
paths=$(psql -X -q -At -d "$target" -c "SET client_min_messages = debug1" \
    -c "SELECT (idempotency.idem_claim('acct_1 POST /charges', 'done-1', 'fp-1')).outcome" \
    -c "SELECT idempotency.idem_seen('queue_1', 'msg-1')" 2>&1 | sed -n 's/^DEBUG:  //p' | paste -sd ';')
check "smith's sessions, as SQLsmith connects, read the records directly" \
    "idempotency.keys read directly;idempotency.messages read directly" "$paths"

# The reads above are not the run's: count from here on.
log_start=$(($(wc -l <"$DIR/server.log") + 1))
echo "sqlsmith: seed $SEED, $QUERIES queries (replay: SQLSMITH_SEED=$SEED SQLSMITH_QUERIES=$QUERIES tests/sqlsmith/run.sh)"
as_postgres timeout 600 sqlsmith --target="$target" --seed="$SEED" --exclude-catalog \
    --max-queries="$QUERIES" --verbose >"$DIR/sqlsmith.out" 2>&1
status=$?
check "sqlsmith ran to its end (exit status)" 0 "$status"
ran=$(sed -n 's/^queries: \([0-9]*\).*/\1/p' "$DIR/sqlsmith.out" | tail -n 1)
if [ "${ran:-0}" -ge "$MIN_QUERIES" ]; then
    ok "sqlsmith generated $ran queries (at least $MIN_QUERIES)"
else
    fail "sqlsmith generated at least $MIN_QUERIES queries" "it says '${ran:-nothing}'; its output ends:"
    tail -n 20 "$DIR/sqlsmith.out"
fi
sed -n 's/^error rate: /sqlsmith: error rate (queries PostgreSQL rejected, mostly by type): /p' "$DIR/sqlsmith.out" | tail -n 1

crashes=$(crash_lines "$DIR/server.log")
check "no backend crash, PANIC or internal (XX000) error in the server log" "" "$crashes"
if [ -n "$crashes" ]; then
    echo "the queries the crashed backends were running (server log):"
    # The DETAIL line and the query's further lines (tab-indented, without the log prefix).
    awk '/Failed process was running/ { on = 1; print; next } on && /^\t/ { print; next } { on = 0 }' \
        "$DIR/server.log" | head -n 400
fi
check "the server still answers" 1 "$(q -c "SELECT 1" 2>&1)"

# How often the generated queries reached the read of a record (idem_claim reads keys,
# idem_seen and idem_seen_many messages), and by which path: SQLsmith counts queries only.
reads=$(tail -n +"$log_start" "$DIR/server.log" | sed -n 's/.* DEBUG:  \(idempotency\.[a-z]* read .*\)/\1/p')
printf '%s\n' "$reads" | sed '/^$/d' | sort | uniq -c | sed 's/^ *\([0-9]*\) \(.*\)/sqlsmith: \2: \1 times/'
for table in keys messages; do
    direct=$(printf '%s\n' "$reads" | grep -c "^idempotency\.$table read directly$")
    if [ "$direct" -gt 0 ]; then
        ok "the generated queries read idempotency.$table directly ($direct times)"
    else
        fail "the generated queries read idempotency.$table directly" \
            "never, with seed $SEED and $QUERIES queries: another seed, or more queries"
    fi
done
check "every read of the generated queries took the direct path" "" \
    "$(printf '%s\n' "$reads" | grep ' through SPI' | sort -u)"

finish sqlsmith
