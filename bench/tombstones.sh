#!/usr/bin/env bash
# Tombstones (idempotency.tombstone_ttl): bytes per tombstone against bytes per completed
# record, and the sweep's rate with tombstones on (issue 15). Runs on an already running
# server with the extension installed (PGHOST / PGPORT / PGUSER from the environment), in a
# database of its own that it creates afresh.
#
#   bench/tombstones.sh [--rows N] [--body-bytes B]
#
# N completed records (default 200,000) with a JSON body of about B bytes (default 500)
# and a Location header, all expired. Then, with tombstone_ttl = '7 days':
#   1. CALL idem_sweep_all(10000, '0') turns them into tombstones (rows/s);
#   2. sizes: average row (pg_column_size) and table + indexes per row after VACUUM FULL,
#      for the completed records and for the tombstones;
#   3. the tombstones' end passes; the same CALL deletes them (rows/s);
#   4. for comparison, tombstones off: the sweep deletes N expired completed records.
set -euo pipefail
ROWS=200000
BODY=500
while [ $# -gt 0 ]; do
    case $1 in
        --rows) ROWS=$2; shift 2 ;;
        --body-bytes) BODY=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
DB=idem_bench_tombstones
psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" 2>/dev/null
q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$DB" "$@"; }
q -c "CREATE EXTENSION idempotency"
populate() {
    q -c "INSERT INTO idempotency.keys (scope, key, fingerprint, status, token, attempts, response_status,
              response_headers, response_body, created_at, updated_at, completed_at, expires_at)
          SELECT 'acct_' || (g % 1000), 'key-' || g || '-' || md5(g::text),
                 'sha256:' || encode(sha256(g::text::bytea), 'hex'), 'completed', gen_random_uuid(), 1, 201,
                 jsonb_build_object('Location', '/charges/ch_' || g),
                 jsonb_build_object('id', 'ch_' || g, 'amount', g, 'currency', 'eur',
                                    'description', repeat('x', $BODY - 60)),
                 now() - interval '2 days', now() - interval '2 days', now() - interval '2 days',
                 now() - interval '1 day'
          FROM generate_series(1, $ROWS) g"
    q -c "VACUUM ANALYZE idempotency.keys"
}
sizes() { # sizes LABEL
    q -c "VACUUM FULL idempotency.keys"
    q -F ' ' -c "SELECT '$1', count(*), round(avg(pg_column_size(k.*))), round(pg_relation_size('idempotency.keys')::numeric / count(*)),
                        round(pg_total_relation_size('idempotency.keys')::numeric / count(*))
                 FROM idempotency.keys k"
}
sweep() { # sweep TOMBSTONE_TTL: seconds of CALL idem_sweep_all(10000, '0')
    local t0 t1
    t0=$(date +%s.%N)
    q -c "SET idempotency.tombstone_ttl = '$1'" -c "CALL idempotency.idem_sweep_all(10000, '0')" 2>/dev/null
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'
}
rate() { awk -v n="$1" -v s="$2" 'BEGIN { printf "%.0f rows/s (%.2f s)", n / s, s }'; }

populate
echo "| records | count | avg row (bytes, pg_column_size) | heap per row (bytes) | heap + indexes per row (bytes) |"
echo "| --- | ---: | ---: | ---: | ---: |"
sizes "completed" | awk '{ printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }'
s=$(sweep '7 days')
tomb=$(q -c "SELECT count(*) FROM idempotency.keys WHERE response_body IS NULL AND response_headers IS NULL")
sizes "tombstone" | awk '{ printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }'
echo
echo "sweep, tombstones on, making $tomb tombstones: $(rate "$ROWS" "$s")"
q -c "UPDATE idempotency.keys SET expires_at = expires_at - interval '8 days'"
q -c "VACUUM ANALYZE idempotency.keys"
s=$(sweep '7 days')
echo "sweep, tombstones on, deleting tombstones past their end: $(rate "$ROWS" "$s"), left: $(q -c 'SELECT count(*) FROM idempotency.keys')"
populate
s=$(sweep '0')
echo "sweep, tombstones off, deleting expired completed records: $(rate "$ROWS" "$s"), left: $(q -c 'SELECT count(*) FROM idempotency.keys')"
psql -X -q -d postgres -c "DROP DATABASE $DB"
