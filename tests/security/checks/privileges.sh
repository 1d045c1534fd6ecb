# Sourced by run.sh. The privilege model: SECURITY INVOKER functions, EXECUTE for PUBLIC,
# access decided by USAGE on schema idempotency and privileges on its two tables.

section "privileges: the model"
DB=sec_priv
newdb $DB
sql postgres $DB -v role=sec_app -f "$HERE/sql/grants.sql"
sql postgres $DB -c "GRANT USAGE ON SCHEMA idempotency TO sec_usage" \
    -c "GRANT USAGE ON SCHEMA idempotency TO sec_reader" \
    -c "GRANT SELECT ON idempotency.keys, idempotency.messages TO sec_reader"

check "no function or procedure of the extension is SECURITY DEFINER" 0 \
    "$(val postgres $DB "SELECT count(*) FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace AND prosecdef")"
check "EXECUTE is left to PUBLIC (no function has an ACL of its own)" 0 \
    "$(val postgres $DB "SELECT count(*) FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace AND proacl IS NOT NULL")"
check "a role without grants may EXECUTE every function" t \
    "$(val postgres $DB "SELECT bool_and(has_function_privilege('sec_nogrants', oid, 'EXECUTE')) FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace")"
check "PUBLIC has no USAGE on schema idempotency and no privilege on its tables or view" "f|f|f|f|f|f" \
    "$(val postgres $DB "SELECT has_schema_privilege('sec_nogrants', 'idempotency', 'USAGE'),
                               has_table_privilege('sec_nogrants', 'idempotency.keys', 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER'),
                               has_table_privilege('sec_nogrants', 'idempotency.messages', 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER'),
                               has_table_privilege('sec_nogrants', 'idempotency.outbound', 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER'),
                               has_table_privilege('sec_nogrants', 'idempotency.outbound_budget', 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER'),
                               has_table_privilege('sec_nogrants', 'idempotency.stats', 'SELECT')")"
if [ "$PORTABLE" = 0 ]; then
    # The Rust functions qualify every name; those written in SQL or PL/pgSQL (sql/*.sql:
    # distribute, schedule_maintenance, the sending side) pin their search_path. The procedure
    # idem_sweep_all cannot (a SET clause forbids its COMMITs) and qualifies every name.
    check "every SQL and PL/pgSQL function pins its search_path, no C function does (none listed)" "" \
        "$(val postgres $DB "SELECT string_agg(p.proname, ',' ORDER BY p.proname) FROM pg_proc AS p JOIN pg_language AS l ON l.oid = p.prolang
                             WHERE p.pronamespace = 'idempotency'::regnamespace AND p.prokind = 'f'
                               AND (l.lanname = 'c') = (p.proconfig IS NOT NULL)")"
    check "the functions written in SQL or PL/pgSQL include distribute, schedule_maintenance and idem_send" 3 \
        "$(val postgres $DB "SELECT count(*) FROM pg_proc AS p JOIN pg_language AS l ON l.oid = p.prolang
                             WHERE p.pronamespace = 'idempotency'::regnamespace AND l.lanname IN ('sql', 'plpgsql')
                               AND p.proname IN ('distribute', 'schedule_maintenance', 'idem_send')")"
else
    # portable: every function is PL/pgSQL or SQL and pins its search_path; the procedure
    # idem_sweep_all cannot (a SET clause forbids its COMMITs) and qualifies every name.
    check "portable: every function pins its search_path (all but the procedure idem_sweep_all)" idem_sweep_all \
        "$(val postgres $DB "SELECT string_agg(proname, ',' ORDER BY proname) FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace AND proconfig IS NULL")"
fi

TOKEN0=00000000-0000-4000-8000-000000000000
TABLE_CALLS=(
    "idem_claim|SELECT * FROM idempotency.idem_claim('s', 'k');"
    "idem_complete|SELECT idempotency.idem_complete('s', 'k', '$TOKEN0', 200);"
    "idem_checkpoint|SELECT idempotency.idem_checkpoint('s', 'k', '$TOKEN0', 'p');"
    "idem_release|SELECT idempotency.idem_release('s', 'k', '$TOKEN0');"
    "idem_lookup|SELECT * FROM idempotency.idem_lookup('s', 'k');"
    "idem_seen|SELECT idempotency.idem_seen('s', 'm');"
    "idem_sweep|SELECT idempotency.idem_sweep();"
    "idem_reclaim_stale|SELECT * FROM idempotency.idem_reclaim_stale();"
    "idem_reclaim_stale(release => false)|SELECT * FROM idempotency.idem_reclaim_stale(10, false);"
    "CALL idem_sweep_all|CALL idempotency.idem_sweep_all();"
    "the stats view|SELECT * FROM idempotency.stats;"
    "idem_send|SELECT * FROM idempotency.idem_send('s', 'op', 't');"
    "idem_send_next|SELECT * FROM idempotency.idem_send_next();"
    "idem_send_result|SELECT * FROM idempotency.idem_send_result('s', 'op', '$TOKEN0', 200);"
)
OTHER_CALLS=(
    "idem_fingerprint(jsonb)|SELECT idempotency.idem_fingerprint('{\"b\": 1, \"a\": 2}'::jsonb);"
    "idem_fingerprint(bytea)|SELECT idempotency.idem_fingerprint('\\xdeadbeef'::bytea);"
    "schedule_maintenance|SELECT * FROM idempotency.schedule_maintenance();"
)

section "privileges: a role without grants can do nothing"
for call in "${TABLE_CALLS[@]}" "${OTHER_CALLS[@]}"; do
    name=${call%%|*}
    check_match "no grants: $name fails with 42501 (permission denied for schema idempotency)" \
        "^42501 permission denied for schema idempotency$" "$(state_msg sec_nogrants $DB "${call#*|}")"
done

section "privileges: USAGE on the schema alone reaches no table"
for call in "${TABLE_CALLS[@]}"; do
    name=${call%%|*}
    check_match "usage only: $name fails with 42501 (permission denied for table or view)" \
        "^42501 permission denied for (table keys|table messages|table outbound|table outbound_budget|view stats)$" "$(state_msg sec_usage $DB "${call#*|}")"
done
check "usage only: idem_fingerprint(jsonb) works (it touches no table)" \
    "sha256:$(printf '%s' '{"a":2,"b":1}' | sha256sum | cut -d' ' -f1)" \
    "$(val sec_usage $DB "SELECT idempotency.idem_fingerprint('{\"b\": 1, \"a\": 2}'::jsonb)")"
check "usage only: idem_fingerprint(bytea) works" \
    "sha256:$(printf '\xde\xad\xbe\xef' | sha256sum | cut -d' ' -f1)" \
    "$(val sec_usage $DB "SELECT idempotency.idem_fingerprint('\\xdeadbeef'::bytea)")"
check "usage only: schedule_maintenance touches no table; without pg_cron it answers 55000" 55000 \
    "$(state sec_usage $DB "SELECT * FROM idempotency.schedule_maintenance();")"
check "nothing was written by the refused calls" "0|0|0|0" \
    "$(val postgres $DB "SELECT (SELECT count(*) FROM idempotency.keys), (SELECT count(*) FROM idempotency.messages),
                               (SELECT count(*) FROM idempotency.outbound), (SELECT count(*) FROM idempotency.outbound_budget)")"

section "privileges: the docs/security.md recipe gives the whole API"
out=$(sql sec_app $DB <<'SQL'
\set VERBOSITY terse
SELECT 'claim=' || outcome FROM idempotency.idem_claim('acct_1:POST /charges', 'k1', 'fp');
SELECT token AS tok FROM idempotency.keys WHERE key = 'k1' \gset
SELECT 'retry=' || outcome || '/' || http_status FROM idempotency.idem_claim('acct_1:POST /charges', 'k1', 'fp');
SELECT 'mismatch=' || outcome || '/' || http_status FROM idempotency.idem_claim('acct_1:POST /charges', 'k1', 'other');
SELECT 'checkpoint=' || (idempotency.idem_checkpoint('acct_1:POST /charges', 'k1', :'tok', 'step', '{"s": 1}') > now());
SELECT idempotency.idem_complete('acct_1:POST /charges', 'k1', :'tok', 201, '{"id": 1}', '{"Location": "/c/1"}');
\echo complete=:SQLSTATE
SELECT 'replay=' || outcome || '/' || http_status || '/' || response_body::text FROM idempotency.idem_claim('acct_1:POST /charges', 'k1', 'fp');
SELECT 'lookup=' || count(*) FROM idempotency.idem_lookup('acct_1:POST /charges', 'k1');
SELECT 'claim2=' || outcome FROM idempotency.idem_claim('acct_1:POST /charges', 'k2');
SELECT 'release=' || idempotency.idem_release('acct_1:POST /charges', 'k2', token) FROM idempotency.keys WHERE key = 'k2';
SELECT 'seen=' || idempotency.idem_seen('acct_1:queue', 'm1') || '/' || idempotency.idem_seen('acct_1:queue', 'm1');
SELECT 'stale=' || outcome FROM idempotency.idem_claim('acct_1:POST /charges', 'k3', NULL, NULL, '1 millisecond');
SELECT pg_sleep(0.02);
SELECT 'reclaim=' || count(*) FROM idempotency.idem_reclaim_stale(10, false);
SELECT 'release_stale=' || count(*) FROM idempotency.idem_reclaim_stale(10, true);
SELECT 'expiring=' || outcome FROM idempotency.idem_claim('acct_1:POST /charges', 'k4', NULL, '1 millisecond');
SELECT pg_sleep(0.02);
SELECT 'sweep=' || idempotency.idem_sweep();
CALL idempotency.idem_sweep_all();
\echo sweep_all=:SQLSTATE
SELECT 'fingerprint=' || (idempotency.idem_fingerprint('{}'::jsonb) LIKE 'sha256:%');
SELECT 'send=' || state FROM idempotency.idem_send('acct_1:charges', 'order-1', 'https://psp.invalid/charges', '{"amount": 1}');
SELECT 'send_next=' || count(*) FROM idempotency.idem_send_next('https://psp.invalid/charges');
SELECT token AS stok FROM idempotency.outbound WHERE operation = 'order-1' \gset
SELECT 'send_result=' || state FROM idempotency.idem_send_result('acct_1:charges', 'order-1', :'stok', 201, '{"id": 1}');
SQL
)
check "recipe: idem_claim claims" claimed "$(field claim "$out")"
check "recipe: a retry answers in_progress/409" "in_progress/409" "$(field retry "$out")"
check "recipe: another fingerprint answers mismatch/422" "mismatch/422" "$(field mismatch "$out")"
check "recipe: idem_checkpoint renews the lease" true "$(field checkpoint "$out")"
check "recipe: idem_complete stores the response" 00000 "$(field complete "$out")"
check "recipe: a retry replays the stored response" 'replay/201/{"id": 1}' "$(field replay "$out")"
check "recipe: idem_lookup returns the record" 1 "$(field lookup "$out")"
check "recipe: idem_release drops an in_progress claim" true "$(field release "$out")"
check "recipe: idem_seen records, then answers duplicate" "true/false" "$(field seen "$out")"
check "recipe: idem_reclaim_stale(release => false) takes a stale claim over" 1 "$(field reclaim "$out")"
check "recipe: idem_reclaim_stale() finds nothing stale after the takeover" 0 "$(field release_stale "$out")"
check "recipe: idem_sweep deletes the expired record" 1 "$(field sweep "$out")"
check "recipe: CALL idem_sweep_all works" 00000 "$(field sweep_all "$out")"
check "recipe: idem_fingerprint works" true "$(field fingerprint "$out")"
check "recipe: idem_send records a send" pending "$(field send "$out")"
check "recipe: idem_send_next hands it out" 1 "$(field send_next "$out")"
check "recipe: idem_send_result stores the answer" "done" "$(field send_result "$out")"
check "recipe: the stats view needs its own grant (42501 without it)" 42501 \
    "$(state sec_app $DB "SELECT * FROM idempotency.stats;")"
sql postgres $DB -c "GRANT SELECT ON idempotency.stats TO sec_app"
check "recipe + GRANT SELECT ON idempotency.stats: monitoring works" 00000 \
    "$(state sec_app $DB "SELECT * FROM idempotency.stats;")"

section "privileges: the monitoring lines of docs/security.md's recipe, as written there"
# The lines granting to "monitoring", read from the doc itself so that the doc is what is tested.
# shellcheck disable=SC2016  # the backticks are the Markdown fence, not a command
MONITORING_RECIPE=$(sed -n '/^```sql$/,/^```$/p' "$ROOT/docs/security.md" | grep ' TO monitoring;' | sed 's/ *--.*//')
check "docs/security.md shows two monitoring grants (schema and view)" 2 "$(printf '%s\n' "$MONITORING_RECIPE" | grep -c 'TO monitoring;')"
sql postgres postgres -c "CREATE ROLE monitoring LOGIN"
check_match "monitoring role before the recipe: stats is refused with 42501" "^42501 permission denied for schema idempotency$" \
    "$(state_msg monitoring $DB "SELECT * FROM idempotency.stats;")"
printf '%s\n' "$MONITORING_RECIPE" | sql postgres $DB -v ON_ERROR_STOP=1 >/dev/null
check "monitoring role with the recipe's lines: stats works" 00000 "$(state monitoring $DB "SELECT * FROM idempotency.stats;")"
check "monitoring role with the recipe's lines: it reads no record" 42501 "$(state monitoring $DB "SELECT * FROM idempotency.keys;")"

section "privileges: the recipe grants data access, nothing more"
for ddl in "TRUNCATE idempotency.keys;" \
           "ALTER TABLE idempotency.keys DISABLE ROW LEVEL SECURITY;" \
           "DROP TABLE idempotency.messages;" \
           "CREATE FUNCTION idempotency.f() RETURNS int LANGUAGE sql AS 'SELECT 1';" \
           "ALTER FUNCTION idempotency.idem_release(text, text, uuid) SECURITY DEFINER;" \
           "CREATE TRIGGER t BEFORE INSERT ON idempotency.keys FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger();"; do
    check "recipe role: '${ddl%% idempotency*} ...' is refused with 42501" 42501 "$(state sec_app $DB "$ddl")"
done
if [ "$PORTABLE" = 0 ]; then
    check "recipe role: 'ALTER EXTENSION ...' is refused with 42501" 42501 "$(state sec_app $DB "ALTER EXTENSION idempotency UPDATE;")"
else
    # portable: installed by psql -f, it is no extension: nothing to alter (42704).
    check "portable: recipe role: 'ALTER EXTENSION ...' finds no extension (42704)" 42704 "$(state sec_app $DB "ALTER EXTENSION idempotency UPDATE;")"
fi

section "privileges: a read-only role (USAGE + SELECT)"
check "reader: idem_lookup works" 1 \
    "$(val sec_reader $DB "SELECT count(*) FROM idempotency.idem_lookup('acct_1:POST /charges', 'k1')")"
check "reader: a claim answered from a read (replay) works" "replay" \
    "$(val sec_reader $DB "SELECT outcome FROM idempotency.idem_claim('acct_1:POST /charges', 'k1', 'fp')")"
check "reader: a claim that must write (a new key) fails with 42501" 42501 \
    "$(state sec_reader $DB "SELECT * FROM idempotency.idem_claim('acct_1:POST /charges', 'new');")"
check "reader: a duplicate idem_seen (a read) answers false" f \
    "$(val sec_reader $DB "SELECT idempotency.idem_seen('acct_1:queue', 'm1')")"
check "reader: a new message id (a write) fails with 42501" 42501 \
    "$(state sec_reader $DB "SELECT idempotency.idem_seen('acct_1:queue', 'm-new');")"
check "reader: idem_sweep fails with 42501 (it locks rows)" 42501 \
    "$(state sec_reader $DB "SELECT idempotency.idem_sweep();")"

if [ "$PORTABLE" = 0 ]; then
    section "privileges: which read path each role's look-ups take (docs/operations.md#read-paths)"
    check "recipe role: idem_claim and idem_seen read their record directly" \
        "keys read directly;messages read directly" \
        "$(read_paths sec_app $DB "SELECT outcome FROM idempotency.idem_claim('acct_1:POST /charges', 'k1', 'fp'); SELECT idempotency.idem_seen('acct_1:queue', 'm1');")"
    check "reader (USAGE + SELECT): a replay is read directly" "keys read directly" \
        "$(read_paths sec_reader $DB "SELECT outcome FROM idempotency.idem_claim('acct_1:POST /charges', 'k1', 'fp');")"
    check "usage only (no SELECT): through SPI, whose 42501 the caller gets" \
        "keys read through SPI: the current user has no SELECT on the whole table;messages read through SPI: the current user has no SELECT on the whole table" \
        "$(read_paths sec_usage $DB "SELECT outcome FROM idempotency.idem_claim('acct_1:POST /charges', 'k1', 'fp'); SELECT idempotency.idem_seen('acct_1:queue', 'm1');")"
    sql postgres postgres -c "CREATE ROLE sec_columns LOGIN" >/dev/null
    sql postgres $DB <<'SQL' >/dev/null
GRANT USAGE ON SCHEMA idempotency TO sec_columns;
GRANT SELECT (scope, key, fingerprint, status, token, attempts, locked_until, expires_at, response_status,
              response_headers, response_body, recovery_point, recovery_data) ON idempotency.keys TO sec_columns;
SQL
    check "a role with SELECT on the columns only: through SPI, which reads what they allow (a replay)" \
        "keys read through SPI: the current user has no SELECT on the whole table" \
        "$(read_paths sec_columns $DB "SELECT outcome FROM idempotency.idem_claim('acct_1:POST /charges', 'k1', 'fp');")"
    check "a role with SELECT on the columns only: the replay's answer" replay \
        "$(val sec_columns $DB "SELECT outcome FROM idempotency.idem_claim('acct_1:POST /charges', 'k1', 'fp')")"
fi

section "privileges: a role granted the tables of 0.4 only (keys, messages)"
sql postgres postgres -c "CREATE ROLE sec_old LOGIN"
sql postgres $DB -c "GRANT USAGE ON SCHEMA idempotency TO sec_old" \
    -c "GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency.keys, idempotency.messages TO sec_old" \
    -c "UPDATE idempotency.outbound SET expires_at = now() - interval '1 second' WHERE operation = 'order-1'" \
    -c "SELECT idempotency.idem_seen('acct_1:queue', 'm-old', interval '1 millisecond')" >/dev/null
sleep 0.02
check "old grants: idem_sweep deletes the expired message and leaves the expired outbound row" "1|1" \
    "$(val sec_old $DB "SELECT idempotency.idem_sweep()")|$(val postgres $DB "SELECT count(*) FROM idempotency.outbound WHERE operation = 'order-1'")"
check "old grants: idem_send is refused with 42501 and writes nothing" "42501|0" \
    "$(state sec_old $DB "SELECT * FROM idempotency.idem_send('acct_1:charges', 'order-2', 't');")|$(val postgres $DB "SELECT count(*) FROM idempotency.outbound WHERE operation = 'order-2'")"
check "the recipe role's idem_sweep then deletes the expired outbound row" "1|0" \
    "$(val sec_app $DB "SELECT idempotency.idem_sweep()")|$(val postgres $DB "SELECT count(*) FROM idempotency.outbound WHERE operation = 'order-1'")"

section "privileges: schedule_maintenance and a squatted schema named cron"
# A database owner (not a superuser) creates a schema named cron with its own
# cron.schedule where pg_cron is not installed; a superuser then calls schedule_maintenance.
newdb sec_cron sec_dbowner
sql sec_dbowner sec_cron <<'SQL'
CREATE SCHEMA cron;
CREATE FUNCTION cron.schedule(text, text, text) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RAISE WARNING 'EVIL-CALLED squatted cron.schedule as %', current_user;
    RETURN 666;
END $$;
SQL
check "squatted cron schema: a superuser's schedule_maintenance answers 55000 (pg_cron is not installed)" 55000 \
    "$(state postgres sec_cron "SELECT * FROM idempotency.schedule_maintenance();")"
check "squatted cron schema: the squatter's cron.schedule never ran" 0 \
    "$(grep -c "EVIL-CALLED squatted cron.schedule" "$MAIN/server.log")"
if [ "$HAVE_CRON" = 1 ]; then
    sql postgres postgres -c "CREATE EXTENSION pg_cron"
    install_extension postgres -h "$MAIN/socket" -p "$MAIN_PORT" -U postgres 2>>"$LOG"
    sql postgres postgres -v role=sec_app -f "$HERE/sql/grants.sql"
    check "with pg_cron: a superuser schedules both jobs" "idempotency-reclaim-stale,idempotency-sweep" \
        "$(val postgres postgres "SELECT string_agg(jobname, ',' ORDER BY jobname) FROM idempotency.schedule_maintenance()")"
    check_match "with pg_cron: the recipe role may not schedule (42501 on schema cron)" "^42501 permission denied for schema cron$" \
        "$(state_msg sec_app postgres "SELECT * FROM idempotency.schedule_maintenance();")"
    val postgres postgres "SELECT count(cron.unschedule(jobid)) FROM cron.job" >/dev/null
else
    skip "schedule_maintenance with a real pg_cron" "pg_cron is not installed into PostgreSQL $PG_MAJOR (Debian's postgresql-15-cron exists for 15 only)"
fi
