#!/usr/bin/env bash
# The portable edition through pg_tle (Trusted Language Extensions: RDS, Aurora, Supabase),
# on a throwaway cluster of PGTLE_PGBIN (default: tests/lib.sh's PGBIN), run by a role that
# holds only pgtle_admin, as docs/portable.md's "Install with pg_tle" says:
#   fresh    sql/portable/pgtle.sql registered, CREATE EXTENSION idempotency: a claim, its
#            replay, a deferred claim, a message, the periods idem_sweep makes
#   update   the previous release (out of git history) registered and created, records
#            written, the upgrade file registered with pgtle.install_update_path, the new
#            release made the default, ALTER EXTENSION UPDATE; the records answer as before
#            and two sweeps move them into the partitions and drop the legacy tables
# pg_tle is not a Debian package and its source cannot be reached from CI, and it refuses the
# name idempotency on a server that holds the native edition's files: where pg_tle is not
# installed in PGTLE_PGBIN's PostgreSQL, or the native files are, the suite is skipped with a
# message. To run it by hand: build pg_tle (github.com/aws/pg_tle, v1.5.2: make; make install
# with PG_CONFIG of a copy of PostgreSQL without the native files), then
#   PGTLE_PGBIN=/path/to/that/bin tests/pgtle/run.sh
# Last line: "pgtle: N passed, M failed".
set -uo pipefail
. "$(dirname "$0")/../lib.sh" || exit 2
cd "$ROOT" || exit 2
PGBIN=${PGTLE_PGBIN:-$PGBIN}
DIR=$(dir_of pgtle)
PORT=$(port_of pgtle)
end_suite() { finish pgtle; exit; }

sharedir=$("$PGBIN/pg_config" --sharedir)
if [ ! -f "$sharedir/extension/pg_tle.control" ]; then
    echo "pgtle: skipped on PostgreSQL $PG_MAJOR: pg_tle is not installed here ($sharedir/extension/pg_tle.control not found)."
    echo "       pg_tle is not a Debian package and CI cannot reach its source: see this script's header to run it by hand."
    end_suite
fi
if [ -f "$sharedir/extension/idempotency.control" ]; then
    echo "pgtle: skipped on PostgreSQL $PG_MAJOR: the native edition's files are installed in $sharedir/extension,"
    echo "       and pg_tle refuses the name idempotency beside them (docs/portable.md): give PGTLE_PGBIN, a PostgreSQL without them."
    end_suite
fi

cluster_fresh "$DIR" "$PORT" "shared_preload_libraries = 'pg_tle'" || { fail "the cluster with pg_tle preloaded did not start"; end_suite; }
trap 'cluster_stop "$DIR"' EXIT
p() { # p ROLE DB [psql args]: quiet, unaligned, stop on error
    local role=$1 db=$2; shift 2
    "$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$DIR/socket" -p "$PORT" -U "$role" -d "$db" "$@"
}
VERSION=$(extension_version)
PREVIOUS=$(scripts/past-releases.sh list portable | tail -n 1)
p postgres postgres -c "CREATE ROLE tle_admin LOGIN" -c "CREATE DATABASE fresh OWNER tle_admin" \
    -c "CREATE DATABASE old OWNER tle_admin" >/dev/null
for db in fresh old; do
    p postgres $db -c "CREATE EXTENSION pg_tle" -c "GRANT pgtle_admin TO tle_admin" 2>/dev/null
done

# fresh
p tle_admin fresh -f sql/portable/pgtle.sql >/dev/null
p tle_admin fresh -c "CREATE SCHEMA idempotency" -c "CREATE EXTENSION idempotency SCHEMA idempotency"
check "fresh: CREATE EXTENSION idempotency through pg_tle, by a pgtle_admin member" "$VERSION" \
    "$(p tle_admin fresh -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")"
out=$(p tle_admin fresh <<'SQL'
SELECT idempotency.idem_complete('s', 'k', token, 201, '{"id": 1}') FROM idempotency.idem_claim('s', 'k', 'fp');
SELECT outcome || '/' || response_status FROM idempotency.idem_claim('s', 'k', 'fp');
BEGIN;
SELECT outcome FROM idempotency.idem_claim('s', 'd', deferred => true);
SELECT idempotency.idem_complete('s', 'd', (SELECT token FROM idempotency.keys WHERE key = 'd'), 200);
COMMIT;
SELECT outcome FROM idempotency.idem_claim('s', 'd');
SELECT idempotency.idem_seen('s', 'm') || '/' || idempotency.idem_seen('s', 'm');
SELECT count(*) > 0 FROM idempotency.partitions_maintain();
SELECT count(*) FROM idempotency.keys AS k JOIN idempotency.partitions AS p
    ON p.partition_name = k.tableoid::regclass::text WHERE p.kind = 'period';
SQL
)
check "fresh: a replay, a deferred claim completed, a message seen twice, periods made and the records moved into them" \
    "replay/201|claimed|replay|true/false|t|2" "$(grep -v '^$' <<<"$out" | paste -sd'|')"

# update from the previous release
{
    echo "SELECT pgtle.install_extension('idempotency', '$PREVIOUS', 'idempotency $PREVIOUS (portable)', \$_pgtle_\$"
    scripts/past-releases.sh show "$PREVIOUS" portable
    echo "\$_pgtle_\$);"
} >"$DIR/previous.sql"
{
    echo "SELECT pgtle.install_update_path('idempotency', '$PREVIOUS', '$VERSION', \$_pgtle_\$"
    grep -v '^\\echo' "sql/portable/idempotency-portable--$PREVIOUS--$VERSION.sql"
    echo "\$_pgtle_\$);"
} >"$DIR/update.sql"
p tle_admin old -f "$DIR/previous.sql" >/dev/null
p tle_admin old -c "CREATE SCHEMA idempotency" -c "CREATE EXTENSION idempotency SCHEMA idempotency VERSION '$PREVIOUS'"
p tle_admin old -c "SELECT count(idempotency.idem_complete('u', 'k' || i, (idempotency.idem_claim('u', 'k' || i)).token, 200)) FROM generate_series(1, 500) AS i" \
    -c "SELECT idempotency.idem_claim('u', 'open')" -c "SELECT idempotency.idem_seen('u', 'm1')" >/dev/null
p tle_admin old -f "$DIR/update.sql" >/dev/null
p tle_admin old -f sql/portable/pgtle.sql >/dev/null
p tle_admin old -c "SELECT pgtle.set_default_version('idempotency', '$VERSION')" -c "ALTER EXTENSION idempotency UPDATE" >/dev/null
check "update: ALTER EXTENSION UPDATE $PREVIOUS -> $VERSION through pg_tle" "$VERSION" \
    "$(p tle_admin old -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")"
out=$(p tle_admin old 2>/dev/null <<'SQL'
SELECT outcome FROM idempotency.idem_claim('u', 'k7');
SELECT outcome FROM idempotency.idem_claim('u', 'open');
SELECT idempotency.idem_seen('u', 'm1');
SELECT idempotency.idem_sweep() >= 0;
SELECT idempotency.idem_sweep() >= 0;
SELECT to_regclass('idempotency.keys_legacy') IS NULL AND to_regclass('idempotency.messages_legacy') IS NULL;
SELECT count(*) FROM idempotency.keys WHERE scope = 'u';
SELECT outcome FROM idempotency.idem_claim('u', 'k7');
SQL
)
check "update: the records replay, answer in_progress, the message is a duplicate; two sweeps move all 501 and drop the legacy tables" \
    "replay|in_progress|f|t|t|t|501|replay" "$(grep -v '^$' <<<"$out" | paste -sd'|')"
end_suite
