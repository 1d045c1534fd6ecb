#!/usr/bin/env bash
# Do answers that need no write really write nothing, lock no row and take no transaction id?
#   bench/checks.sh DIR PORT DB      (a cluster and database set up by bench/run.sh)
# Each call runs in its own transaction; before ROLLBACK the same transaction reads
#   - txid_current_if_assigned(): NULL unless the transaction took a transaction id;
#   - pg_locks of its own backend, leaving out AccessShareLock (a plain read's relation lock)
#     and its virtualxid: a write would show RowExclusiveLock, SELECT ... FOR UPDATE RowShareLock;
#   - xmax of the record the call answered from: a row lock (FOR UPDATE / FOR SHARE, or the
#     lock ON CONFLICT DO UPDATE takes) writes the locker's xid there, so 0 means unlocked.
# Prints a Markdown table.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
CDIR=${1:?cluster dir}; PORT=${2:?port}; DB=${3:?database}
S="'acct_42 POST /charges'"

# check IMPL WHAT TABLE-AND-WHERE SQL...: run SQL (one or more statements) in a transaction.
check() {
    local impl=$1 what=$2 row=$3; shift 3
    local sql=""
    for s in "$@"; do
        case $s in \\*) sql+="$s"$'\n' ;; *) sql+="$s;"$'\n' ;; esac
    done
    q <<SQL
BEGIN;
$sql
\\o
SELECT '| $impl | $what | ' || coalesce(txid_current_if_assigned()::text, 'none') || ' | ' ||
       coalesce((SELECT string_agg(mode || ' on ' || coalesce(relation::regclass::text, locktype), ', ' ORDER BY relation::regclass::text)
                   FROM pg_locks
                  WHERE pid = pg_backend_pid() AND locktype <> 'virtualxid'
                    AND NOT (locktype = 'relation' AND mode = 'AccessShareLock')), 'none') || ' | ' ||
       coalesce((SELECT xmax::text FROM $row), 'no row') || ' |';
ROLLBACK;
SQL
}

echo "| implementation | call (answer) | transaction id taken | locks other than AccessShareLock | xmax of the row |"
echo "| --- | --- | --- | --- | --- |"
{
K="idempotency.keys WHERE scope = $S AND key"
check extension "idem_claim (replay)" "$K = 'r-1'" "\\o /dev/null" "SELECT idempotency.idem_claim($S, 'r-1', 'sha256:4f2d')"
check extension "idem_claim (in_progress)" "$K = 'p-1'" "\\o /dev/null" "SELECT idempotency.idem_claim($S, 'p-1', 'sha256:4f2d')"
check extension "idem_claim (mismatch)" "$K = 'r-1'" "\\o /dev/null" "SELECT idempotency.idem_claim($S, 'r-1', 'sha256:other')"
check extension "idem_seen (duplicate)" "idempotency.messages WHERE scope = 'orders-consumer' AND message_id = 's-1'" "\\o /dev/null" "SELECT idempotency.idem_seen('orders-consumer', 's-1')"
check extension "idem_lookup" "$K = 'r-1'" "\\o /dev/null" "SELECT idempotency.idem_lookup($S, 'r-1')"
check extension "idem_claim (claimed, for contrast)" "$K = 'check-new'" "\\o /dev/null" "SELECT idempotency.idem_claim($S, 'check-new', 'sha256:4f2d')"
K="peer.keys WHERE scope = $S AND key"
check "PL/pgSQL peer" "claim (replay)" "$K = 'r-1'" "\\o /dev/null" "SELECT peer.claim($S, 'r-1', 'sha256:4f2d')"
check "PL/pgSQL peer" "claim (in_progress)" "$K = 'p-1'" "\\o /dev/null" "SELECT peer.claim($S, 'p-1', 'sha256:4f2d')"
check "PL/pgSQL peer" "claim (mismatch)" "$K = 'r-1'" "\\o /dev/null" "SELECT peer.claim($S, 'r-1', 'sha256:other')"
check "PL/pgSQL peer" "seen (duplicate)" "peer.messages WHERE scope = 'orders-consumer' AND message_id = 's-1'" "\\o /dev/null" "SELECT peer.seen('orders-consumer', 's-1')"
K="idempotency_keys WHERE key"
check "raw SQL floor" "INSERT ON CONFLICT DO NOTHING + SELECT (replay)" "$K = 'r-1'" "\\o /dev/null" \
    "INSERT INTO idempotency_keys (key, fingerprint, status, expires_at) VALUES ('r-1', 'sha256:4f2d', 'in_progress', now() + interval '24 hours') ON CONFLICT (key) DO NOTHING RETURNING id" \
    "SELECT status, fingerprint, response FROM idempotency_keys WHERE key = 'r-1'"
check "raw SQL floor" "INSERT ON CONFLICT DO NOTHING (duplicate message)" "processed_messages WHERE scope = 'orders-consumer' AND message_id = 's-1'" "\\o /dev/null" \
    "INSERT INTO processed_messages (scope, message_id, expires_at) VALUES ('orders-consumer', 's-1', now() + interval '24 hours') ON CONFLICT DO NOTHING"
} | grep '^|'
