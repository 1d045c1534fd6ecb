# Sourced by run.sh. The row-level-security recipe (sql/rls.sql): tenant roles bound to the
# scopes that begin with their own name and a colon.

section "rls: each tenant uses its own scopes"
DB=sec_rls
newdb $DB
sql postgres $DB -f "$HERE/sql/rls.sql"
check "the recipe enables RLS on both tables" "t|t" \
    "$(val postgres $DB "SELECT (SELECT relrowsecurity FROM pg_class WHERE oid = 'idempotency.keys'::regclass), (SELECT relrowsecurity FROM pg_class WHERE oid = 'idempotency.messages'::regclass)")"

# Tenant B's records: completed, in_progress (an hour's lease), stale, about to expire; a message.
sql tenant_b $DB <<'SQL' >/dev/null
SELECT idempotency.idem_complete('tenant_b:POST /charges', 'kb-done', token, 201, '{"secret": "b"}')
  FROM idempotency.idem_claim('tenant_b:POST /charges', 'kb-done', 'fp');
SELECT * FROM idempotency.idem_claim('tenant_b:POST /charges', 'kb-open', 'fp', NULL, '1 hour');
SELECT * FROM idempotency.idem_claim('tenant_b:POST /charges', 'kb-stale', NULL, NULL, '1 millisecond');
SELECT * FROM idempotency.idem_claim('tenant_b:POST /charges', 'kb-exp', NULL, '1 millisecond');
SELECT idempotency.idem_seen('tenant_b:queue', 'm1');
SQL
TOK_B=$(val postgres $DB "SELECT token FROM idempotency.keys WHERE key = 'kb-open'")
b_rows() { val postgres $DB "SELECT string_agg(key || ':' || status || ':' || attempts || ':' || (token = '$TOK_B'), ',' ORDER BY key) FROM idempotency.keys WHERE scope LIKE 'tenant\_b:%'"; }
B_BEFORE=$(b_rows)

out=$(sql tenant_a $DB <<'SQL'
\set VERBOSITY terse
SELECT 'claim=' || outcome FROM idempotency.idem_claim('tenant_a:POST /charges', 'ka1', 'fp');
SELECT token AS tok FROM idempotency.keys WHERE key = 'ka1' \gset
SELECT 'retry=' || outcome FROM idempotency.idem_claim('tenant_a:POST /charges', 'ka1', 'fp');
SELECT 'checkpoint=' || (idempotency.idem_checkpoint('tenant_a:POST /charges', 'ka1', :'tok', 'step') IS NOT NULL);
SELECT idempotency.idem_complete('tenant_a:POST /charges', 'ka1', :'tok', 201, '{"id": "a1"}');
\echo complete=:SQLSTATE
SELECT 'replay=' || outcome || '/' || response_body::text FROM idempotency.idem_claim('tenant_a:POST /charges', 'ka1', 'fp');
SELECT 'lookup=' || count(*) FROM idempotency.idem_lookup('tenant_a:POST /charges', 'ka1');
SELECT 'release=' || idempotency.idem_release('tenant_a:POST /charges', 'ka2', token)
  FROM idempotency.idem_claim('tenant_a:POST /charges', 'ka2');
SELECT 'seen=' || idempotency.idem_seen('tenant_a:queue', 'm1') || '/' || idempotency.idem_seen('tenant_a:queue', 'm1');
SELECT 'stale=' || outcome FROM idempotency.idem_claim('tenant_a:POST /charges', 'ka-stale', NULL, NULL, '1 millisecond');
SELECT 'expiring=' || outcome FROM idempotency.idem_claim('tenant_a:POST /charges', 'ka-exp', NULL, '1 millisecond');
SELECT pg_sleep(0.05);
SELECT 'reclaim=' || string_agg(key || '/' || attempts, ',') FROM idempotency.idem_reclaim_stale(100, false);
SELECT 'sweep=' || idempotency.idem_sweep();
SELECT 'visible=' || count(*) || '/' || count(*) FILTER (WHERE NOT starts_with(scope, 'tenant_a:')) FROM idempotency.keys;
SELECT 'visible_messages=' || count(*) FILTER (WHERE NOT starts_with(scope, 'tenant_a:')) FROM idempotency.messages;
SQL
)
check "tenant A claims its own key" claimed "$(field claim "$out")"
check "tenant A's retry answers in_progress" in_progress "$(field retry "$out")"
check "tenant A checkpoints its claim" true "$(field checkpoint "$out")"
check "tenant A completes its claim" 00000 "$(field complete "$out")"
check "tenant A's retry replays its response" 'replay/{"id": "a1"}' "$(field replay "$out")"
check "tenant A looks its record up" 1 "$(field lookup "$out")"
check "tenant A releases its own claim" true "$(field release "$out")"
check "tenant A de-duplicates its own messages" "true/false" "$(field seen "$out")"
check "tenant A's idem_reclaim_stale takes over only A's stale claim (B's is left)" "ka-stale/2" "$(field reclaim "$out")"
check "tenant A's idem_sweep deletes only A's expired record (B's is left)" 1 "$(field sweep "$out")"
check "tenant A's SELECT on idempotency.keys shows only A's rows (none of B's)" 0 "$(field visible "$out" | cut -d/ -f2)"
check "tenant A's SELECT on idempotency.messages shows none of B's rows" 0 "$(field visible_messages "$out")"
check "tenant B's records were not touched by A's reclaim and sweep" "$B_BEFORE" "$(b_rows)"

if [ "$PORTABLE" = 0 ]; then
    check "row-level security on: idem_claim and idem_seen read through SPI, which applies the policies" \
        "keys read through SPI: row-level security is enabled on it;messages read through SPI: row-level security is enabled on it" \
        "$(read_paths tenant_a $DB "SELECT outcome FROM idempotency.idem_claim('tenant_a:POST /charges', 'ka1', 'fp'); SELECT idempotency.idem_seen('tenant_a:queue', 'm1');")"
fi

section "rls: tenant A cannot reach tenant B's scopes"
check "idem_lookup of B's completed key returns no row" 0 \
    "$(val tenant_a $DB "SELECT count(*) FROM idempotency.idem_lookup('tenant_b:POST /charges', 'kb-done')")"
check "idem_lookup of B's in_progress key returns no row" 0 \
    "$(val tenant_a $DB "SELECT count(*) FROM idempotency.idem_lookup('tenant_b:POST /charges', 'kb-open')")"
RLS_ERR='^42501 new row violates row-level security policy for table "keys"$'
for key in kb-done kb-open kb-stale brand-new; do
    check_match "idem_claim of B's scope, key $key: 42501 (row-level security), not a replay or a claim" "$RLS_ERR" \
        "$(state_msg tenant_a $DB "SET statement_timeout = '10s'; SELECT * FROM idempotency.idem_claim('tenant_b:POST /charges', '$key', 'fp');")"
done
check "idem_complete of B's claim, even with B's token: IK001 (the record is invisible)" IK001 \
    "$(state tenant_a $DB "SELECT idempotency.idem_complete('tenant_b:POST /charges', 'kb-open', '$TOK_B', 200, '{\"forged\": true}');")"
check "idem_checkpoint of B's claim with B's token: IK001" IK001 \
    "$(state tenant_a $DB "SELECT idempotency.idem_checkpoint('tenant_b:POST /charges', 'kb-open', '$TOK_B', 'forged');")"
check "idem_release of B's claim with B's token: false" f \
    "$(val tenant_a $DB "SELECT idempotency.idem_release('tenant_b:POST /charges', 'kb-open', '$TOK_B')")"
check_match "idem_seen in B's scope (seen id): 42501" '^42501 new row violates row-level security policy for table "messages"$' \
    "$(state_msg tenant_a $DB "SELECT idempotency.idem_seen('tenant_b:queue', 'm1');")"
check_match "idem_seen in B's scope (new id): 42501" '^42501 new row violates row-level security policy for table "messages"$' \
    "$(state_msg tenant_a $DB "SELECT idempotency.idem_seen('tenant_b:queue', 'm-new');")"
check "a scope without the colon ('tenant_a') is not A's: 42501" 42501 \
    "$(state tenant_a $DB "SELECT * FROM idempotency.idem_claim('tenant_a', 'k');")"
check "a longer role-like prefix ('tenant_ab:') is not A's: 42501" 42501 \
    "$(state tenant_a $DB "SELECT * FROM idempotency.idem_claim('tenant_ab:x', 'k');")"
check "LIKE metacharacters do not widen the policy ('tenantXa:' is not A's): 42501" 42501 \
    "$(state tenant_a $DB "SELECT * FROM idempotency.idem_claim('tenantXa:x', 'k');")"
check "a direct UPDATE moving A's row into B's scope: 42501" 42501 \
    "$(state tenant_a $DB "UPDATE idempotency.keys SET scope = 'tenant_b:POST /charges' WHERE key = 'ka1';")"
check "a direct INSERT into B's scope: 42501" 42501 \
    "$(state tenant_a $DB "INSERT INTO idempotency.keys (scope, key, status, token, response_status, created_at, updated_at, expires_at) VALUES ('tenant_b:x', 'k', 'completed', gen_random_uuid(), 200, now(), now(), now() + interval '1 day');")"
check "a direct DELETE of B's rows deletes nothing" "DELETE 0" \
    "$(sql tenant_a $DB -c "\\set QUIET off" -c "DELETE FROM idempotency.keys WHERE scope LIKE 'tenant_b:%'")"
check "tenant B's records are unchanged after all of A's attempts" "$B_BEFORE" "$(b_rows)"
check "tenant B still replays its own response" 'replay|{"secret": "b"}' \
    "$(val tenant_b $DB "SELECT outcome, response_body::text FROM idempotency.idem_claim('tenant_b:POST /charges', 'kb-done', 'fp')")"
check "tenant B still completes its own claim with its token" 00000 \
    "$(state tenant_b $DB "SELECT idempotency.idem_complete('tenant_b:POST /charges', 'kb-open', '$TOK_B', 200);")"

# B holds an uncommitted claim for 3 s; A's claim of the same key must not wait for it.
APP=rls-holder psql_at "$MAIN" "$MAIN_PORT" tenant_b $DB \
    -c "BEGIN" -c "SELECT outcome FROM idempotency.idem_claim('tenant_b:POST /charges', 'kb-tx')" \
    -c "SELECT pg_sleep(3)" -c "COMMIT" >/dev/null 2>>"$LOG" &
holder=$!
BACKGROUND+=("$holder")
sleep 0.5
t0=$(date +%s%N)
st=$(state tenant_a $DB "SET lock_timeout = '2s'; SELECT * FROM idempotency.idem_claim('tenant_b:POST /charges', 'kb-tx');")
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
check "A's claim of a key B holds in an open transaction: 42501 at once, no wait (${ms} ms)" "42501 fast" \
    "$st $([ $ms -lt 1500 ] && echo fast || echo slow)"
wait "$holder"

section "rls: roles outside the policies"
sql postgres $DB -v role=sec_app -f "$HERE/sql/grants.sql"
check "a granted role that no policy names (sec_app) sees no row once RLS is on" 0 \
    "$(val sec_app $DB "SELECT count(*) FROM idempotency.keys")"
check "... and its claims fail with 42501" 42501 \
    "$(state sec_app $DB "SELECT * FROM idempotency.idem_claim('acct:x', 'k');")"
sql tenant_a $DB -c "SELECT * FROM idempotency.idem_claim('tenant_a:POST /charges', 'ka-late', NULL, '1 millisecond')" >/dev/null
sql tenant_b $DB -c "SELECT * FROM idempotency.idem_claim('tenant_b:POST /charges', 'kb-late', NULL, '1 millisecond')" >/dev/null
sleep 0.05
sql postgres $DB -v role=sec_maint -f "$HERE/sql/grants.sql"
expired=$(val postgres $DB "SELECT count(*) || ' records of ' || count(DISTINCT split_part(scope, ':', 1)) || ' tenants' FROM idempotency.keys WHERE expires_at <= now()")
check "a maintenance role with BYPASSRLS sweeps every tenant's expired records ($expired)" "${expired%% *}" \
    "$(val sec_maint $DB "SELECT idempotency.idem_sweep()")"

section "rls: the stats view and the table owner"
sql postgres $DB -c "GRANT SELECT ON idempotency.stats TO idem_tenant"
all_completed=$(val postgres $DB "SELECT completed FROM idempotency.stats")
own_completed=$(val tenant_a $DB "SELECT count(*) FROM idempotency.keys WHERE status = 'completed' AND expires_at > now()")
check "as created, the stats view runs as its owner: tenant A sees all tenants' counts ($all_completed completed, $own_completed of them A's)" \
    "$all_completed more than A's own" \
    "$(val tenant_a $DB "SELECT completed FROM idempotency.stats") $([ "$own_completed" -lt "$all_completed" ] && echo "more than A's own")"
sql postgres $DB -c "ALTER VIEW idempotency.stats SET (security_invoker = true)"
check "with security_invoker = true the stats view counts only A's rows" "$own_completed" \
    "$(val tenant_a $DB "SELECT completed FROM idempotency.stats")"
check "the owner (superuser) is not bound by the policies" \
    "$(val postgres $DB "SELECT count(*) FROM (SELECT DISTINCT split_part(scope, ':', 1) FROM idempotency.keys) s")" 2

section "rls: why the recipe uses starts_with and not LIKE"
newdb sec_rls_like
sql postgres sec_rls_like -f <(sed "s/starts_with(scope, current_user || ':')/scope LIKE current_user || ':%'/" "$HERE/sql/rls.sql")
check "with a LIKE policy the '_' in tenant_a matches any character: A claims in 'tenantXa:'" claimed \
    "$(val tenant_a sec_rls_like "SELECT outcome FROM idempotency.idem_claim('tenantXa:x', 'k')")"
