# Shared by bench/run.sh, bench/expiry.sh, bench/profile.sh, bench/variants.sh and
# bench/checks.sh. Source it; it sets ROOT (the repository), BENCH (this folder) and, from
# tests/lib.sh, PG_MAJOR / PGBIN (PostgreSQL 15 unless PG_MAJOR says 18; its bin directory
# first on PATH), cluster_fresh / cluster_stop (clusters owned by the postgres OS user,
# socket in DIR/socket) and port_of; and defines the helpers below.

. "$(dirname "${BASH_SOURCE[0]}")/../tests/lib.sh" || exit 2
# shellcheck disable=SC2034 # for the scripts that source this file
BENCH=$ROOT/bench
# shellcheck disable=SC2034 # for the scripts that source this file
PY=/usr/bin/python3

# q SQL...: one psql call against $DB on the cluster of $CDIR/$PORT, unaligned, no headers.
# shellcheck disable=SC2153 # PORT and CDIR are the sourcing script's
q() { psql -X -q -v ON_ERROR_STOP=1 -h "$CDIR/socket" -p "$PORT" -U postgres -d "${DB:-postgres}" -At "$@"; }
# admin SQL...: q against the database postgres (to create or drop $DB).
admin() { DB=postgres q "$@"; }

# The machine and server, for the record.
machine_info() {
    echo "date:        $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "nproc:       $(nproc)"
    echo "cpu:         $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
    echo "memory:      $(free -h | awk '/^Mem:/ {print $2 " total, " $7 " available"}')"
    echo "load:        $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min)"
    echo "server:      $(q -c 'SELECT version()')"
    echo "extension:   $(sha256sum "$("$PGBIN/pg_config" --pkglibdir)/idempotency.so" | cut -c1-16) (sha256 of idempotency.so), repo at $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)$(git -C "$ROOT" diff --quiet HEAD -- src sql 2>/dev/null || echo ' + uncommitted changes in src/ or sql/')"
    echo "settings:    $(q -c "SELECT string_agg(name || '=' || current_setting(name), ', ' ORDER BY name) FROM pg_settings WHERE source NOT IN ('default', 'override') AND name NOT IN ('unix_socket_directories', 'listen_addresses', 'lc_messages', 'lc_monetary', 'lc_numeric', 'lc_time', 'log_timezone', 'TimeZone', 'default_text_search_config', 'DateStyle', 'dynamic_shared_memory_type', 'application_name', 'client_encoding', 'transaction_isolation', 'default_transaction_isolation')")"
}

# The next transaction id to be assigned, and the WAL insert position: read without taking one.
xid_next() { q -c 'SELECT pg_snapshot_xmax(pg_current_snapshot())'; }
wal_lsn() { q -c 'SELECT pg_current_wal_insert_lsn()'; }
wal_diff() { q -c "SELECT pg_wal_lsn_diff('$2', '$1')::bigint"; }

# variant_sql NAME: SQL that turns idempotency.keys as installed (releases 0.2.0 and 0.3.0) into a schema
# variant, for measuring what a part of the schema costs (bench/variants.sh, profile.sh).
variant_sql() {
    case $1 in
        installed) echo "" ;;
        # Release 0.1.0's table: three CHECK constraints, and a partial index whose predicate
        # idem_complete's UPDATE implies (so on a big table it scans every claim in flight).
        v010) echo "ALTER TABLE idempotency.keys
                  ADD CONSTRAINT keys_status_check CHECK (status IN ('in_progress', 'completed')),
                  ADD CONSTRAINT keys_lease_check CHECK ((status = 'in_progress') = (locked_until IS NOT NULL)),
                  ADD CONSTRAINT keys_response_check CHECK ((status = 'completed') = (response_status IS NOT NULL));
                  DROP INDEX idempotency.keys_in_progress_idx;
                  CREATE INDEX keys_in_progress_idx ON idempotency.keys (locked_until) WHERE status = 'in_progress';" ;;
        # Experiments, not proposals: without the index idem_sweep reads expired records by
        # (noexpidx; the sweep would scan the table), without the index idem_reclaim_stale and
        # idempotency.stats read claims in flight by (hot; completing a claim becomes a HOT
        # update), and with neither (pkonly).
        noexpidx) echo "DROP INDEX idempotency.keys_expires_at_idx;" ;;
        hot) echo "DROP INDEX idempotency.keys_in_progress_idx;" ;;
        pkonly) echo "$(variant_sql noexpidx) $(variant_sql hot)" ;;
        *) echo "unknown variant $1" >&2; return 1 ;;
    esac
}
