# Sourced by run.sh. pg_dump -Fc of a database with live records and seen messages, then
# pg_restore into a fresh database (and the same with a plain SQL dump through psql).

section "dump and restore: records survive exactly once, and work"
DB=sec_dump
DUMP=$SEC_DIR/dump
mkdir -p "$DUMP"
chown postgres: "$DUMP" 2>/dev/null
newdb $DB
sql postgres $DB -v role=sec_app -f "$HERE/sql/grants.sql"

# Records of every kind, made through the API by the application role.
sql sec_app $DB <<'SQL' >/dev/null
SELECT idempotency.idem_complete('dump', 'k-done', token, 201, '{"id": "ch_1", "n": [1, 2.5, "é"]}', '{"Location": "/c/1"}')
  FROM idempotency.idem_claim('dump', 'k-done', 'fp-done');
SELECT * FROM idempotency.idem_claim('dump', 'k-open', 'fp-open', NULL, '1 hour');
SELECT * FROM idempotency.idem_claim('dump', 'k-ckpt', NULL, NULL, '1 millisecond');
SELECT idempotency.idem_checkpoint('dump', 'k-ckpt', token, 'charged', '{"gw": "gw_9"}', '1 millisecond')
  FROM idempotency.keys WHERE key = 'k-ckpt';
SELECT pg_sleep(0.02);
SELECT * FROM idempotency.idem_claim('dump', 'k-ckpt', NULL, NULL, '1 hour');
SELECT * FROM idempotency.idem_claim('dump', 'k-exp', NULL, '1 millisecond');
SELECT idempotency.idem_seen('dump', 'm-live');
SELECT idempotency.idem_seen('dump', 'm-exp', '1 millisecond');
SELECT count(idempotency.idem_complete('bulk', 'b' || i, (idempotency.idem_claim('bulk', 'b' || i)).token, 200, jsonb_build_object('i', i)))
  FROM generate_series(1, 1000) AS i;
SQL
# The periods the sweep makes (tables made after CREATE EXTENSION, not its members) and the
# rows moved into them must come back attached to the extension's tables.
sql postgres $DB -c "SELECT count(*) FROM idempotency.partitions_maintain()" >/dev/null
rows_by_partition() { # rows_by_partition DB: each partition of keys and messages with the rows in it
    val postgres "$1" "SELECT string_agg(p || ':' || n, ',' ORDER BY p) FROM (
        SELECT tableoid::regclass::text AS p, count(*) AS n FROM idempotency.keys GROUP BY 1
        UNION ALL SELECT tableoid::regclass::text, count(*) FROM idempotency.messages GROUP BY 1) AS t"
}
PERIODS=$(rows_by_partition $DB)
check "source: the sweep made periods and moved the 1001 completed records into them" 1001 \
    "$(val postgres $DB "SELECT count(*) FROM idempotency.keys AS k JOIN idempotency.partitions AS p ON p.partition_name = k.tableoid::regclass::text WHERE p.kind = 'period'")"
TOK_OPEN=$(val postgres $DB "SELECT token FROM idempotency.keys WHERE key = 'k-open'")
# The RLS recipe too (after the rows: sec_app has no policy, so with RLS on it sees nothing).
sql postgres $DB -f "$HERE/sql/rls.sql"
rows_digest() { # rows_digest DB: a digest of every row of both tables
    val postgres "$1" "SELECT (SELECT count(*) || ':' || md5(string_agg(k::text, E'\n' ORDER BY scope, key)) FROM idempotency.keys k)
                           || '/' || (SELECT count(*) || ':' || md5(string_agg(m::text, E'\n' ORDER BY scope, message_id)) FROM idempotency.messages m)"
}
SOURCE=$(rows_digest $DB)
check "source: 1004 records (completed, in_progress, taken over with a checkpoint, expired) and 2 messages" "1004 2" \
    "$(echo "$SOURCE" | sed -E 's/:[0-9a-f]+//g; s#/# #')"

if as_postgres pg_dump -h "$MAIN/socket" -p "$MAIN_PORT" -U postgres -Fc -f "$DUMP/db.dump" $DB 2>"$DUMP/pg_dump.err"; then
    check "pg_dump -Fc succeeds without a message" "" "$(cat "$DUMP/pg_dump.err")"
else
    fail "pg_dump -Fc" "$(cat "$DUMP/pg_dump.err")"
fi
sql postgres postgres -c "CREATE DATABASE sec_restored"
if as_postgres pg_restore -h "$MAIN/socket" -p "$MAIN_PORT" -U postgres -d sec_restored "$DUMP/db.dump" 2>"$DUMP/pg_restore.err"; then
    check "pg_restore into a fresh database succeeds and reports no error" "" "$(cat "$DUMP/pg_restore.err")"
else
    fail "pg_restore into a fresh database" "$(head -n 5 "$DUMP/pg_restore.err")"
fi
R=sec_restored
# The role the restored records are used by below: the application role. portable: its
# tables are ordinary ones, so the dump carries their row-level security and policies (the
# native edition's dump does not: an extension's tables); sec_app, which no policy names,
# then sees nothing, so the same checks run as sec_maint (BYPASSRLS) with the same grants.
APP_ROLE=sec_app
restored_grants() { :; }
if [ "$PORTABLE" = 1 ]; then
    check "portable: restored: the application role, named by no policy, sees no record (RLS came back with the dump)" 0 \
        "$(val sec_app $R "SELECT count(*) FROM idempotency.keys")"
    APP_ROLE=sec_maint
    restored_grants() { sql postgres "$1" -v role=sec_maint -f "$HERE/sql/grants.sql" >/dev/null; }
    restored_grants $R
fi
check "restored: the extension exists once, same version$(by_edition "" " (portable: none, as in the source: installed by psql -f)")" \
    "$(by_edition "1/$(val postgres $DB "SELECT max(extversion) FROM pg_extension WHERE extname = 'idempotency'")" "0/")" \
    "$(val postgres $R "SELECT count(*) || '/' || coalesce(max(extversion), '') FROM pg_extension WHERE extname = 'idempotency'")"
check "restored: every record and message, exactly once, byte for byte (count and digest of all rows)" "$SOURCE" "$(rows_digest $R)"
check "restored: the same partitions, attached, with the same rows in each" "$PERIODS" "$(rows_by_partition $R)"
check "restored: no (scope, key) twice" 0 \
    "$(val postgres $R "SELECT count(*) - count(DISTINCT (scope, key)) FROM idempotency.keys")"
check "restored: the indexes and constraints are the extension's own" \
    "$(val postgres $DB "SELECT string_agg(indexrelid::regclass::text, ',' ORDER BY indexrelid::regclass::text) FROM pg_index WHERE indrelid IN ('idempotency.keys'::regclass, 'idempotency.messages'::regclass)")" \
    "$(val postgres $R "SELECT string_agg(indexrelid::regclass::text, ',' ORDER BY indexrelid::regclass::text) FROM pg_index WHERE indrelid IN ('idempotency.keys'::regclass, 'idempotency.messages'::regclass)")"
check "restored: the grants on the schema and tables are kept" "t|t|t" \
    "$(val postgres $R "SELECT has_schema_privilege('sec_app', 'idempotency', 'USAGE'), has_table_privilege('sec_app', 'idempotency.keys', 'SELECT, INSERT, UPDATE, DELETE'), has_table_privilege('sec_app', 'idempotency.messages', 'SELECT, INSERT, UPDATE, DELETE')")"

out=$(sql $APP_ROLE $R <<SQL
\\set VERBOSITY terse
SELECT 'replay=' || outcome || '/' || http_status || '/' || response_body::text || '/' || response_headers::text
  FROM idempotency.idem_claim('dump', 'k-done', 'fp-done');
SELECT 'mismatch=' || outcome FROM idempotency.idem_claim('dump', 'k-done', 'other');
SELECT 'open=' || outcome || '/' || http_status FROM idempotency.idem_claim('dump', 'k-open', 'fp-open');
SELECT 'ckpt=' || outcome || '/' || attempts FROM idempotency.idem_claim('dump', 'k-ckpt');
SELECT 'ckpt_lookup=' || recovery_point || '/' || recovery_data::text FROM idempotency.idem_lookup('dump', 'k-ckpt');
SELECT 'expired_lookup=' || count(*) FROM idempotency.idem_lookup('dump', 'k-exp');
SELECT 'seen_live=' || idempotency.idem_seen('dump', 'm-live');
SELECT 'seen_exp=' || idempotency.idem_seen('dump', 'm-exp');
SELECT 'bulk=' || count(*) FILTER (WHERE c.outcome = 'replay' AND c.response_body = jsonb_build_object('i', i))
  FROM generate_series(1, 1000) AS i, idempotency.idem_claim('bulk', 'b' || i) AS c;
SELECT idempotency.idem_complete('dump', 'k-open', '$TOK_OPEN', 200, '{"after": "restore"}');
\\echo complete_open=:SQLSTATE
SELECT 'open_replay=' || outcome || '/' || response_body::text FROM idempotency.idem_claim('dump', 'k-open', 'fp-open');
SELECT 'claim_new=' || outcome FROM idempotency.idem_claim('dump', 'k-new');
SELECT 'claim_expired=' || outcome || '/' || attempts FROM idempotency.idem_claim('dump', 'k-exp');
SELECT 'sweep=' || idempotency.idem_sweep();
SQL
)
check "restored: a completed key replays its stored response" 'replay/201/{"n": [1, 2.5, "é"], "id": "ch_1"}/{"Location": "/c/1"}' "$(field replay "$out")"
check "restored: the stored fingerprint still guards the key (mismatch)" mismatch "$(field mismatch "$out")"
check "restored: an in_progress key answers in_progress/409" "in_progress/409" "$(field open "$out")"
check "restored: a taken-over claim keeps its attempts" "in_progress/2" "$(field ckpt "$out")"
check "restored: its checkpoint is kept" 'charged/{"gw": "gw_9"}' "$(field ckpt_lookup "$out")"
check "restored: an expired record stays absent" 0 "$(field expired_lookup "$out")"
check "restored: a seen message is still a duplicate" false "$(field seen_live "$out")"
check "restored: an expired message is new again" true "$(field seen_exp "$out")"
check "restored: all 1000 bulk records replay their own body" 1000 "$(field bulk "$out")"
check "restored: the original owner's token still completes its claim (fencing tokens survive)" 00000 "$(field complete_open "$out")"
check "restored: then it replays" 'replay/{"after": "restore"}' "$(field open_replay "$out")"
check "restored: new claims work" claimed "$(field claim_new "$out")"
check "restored: a claim replaces the expired record" "claimed/1" "$(field claim_expired "$out")"
check "restored: idem_sweep works (the expired message it replaced is gone; nothing else expired)" 0 "$(field sweep "$out")"

section "dump and restore: row-level security on the extension's tables"
check "source: RLS on, with its two policies" "t|2" \
    "$(val postgres $DB "SELECT relrowsecurity, (SELECT count(*) FROM pg_policy WHERE polrelid IN ('idempotency.keys'::regclass, 'idempotency.messages'::regclass)) FROM pg_class WHERE oid = 'idempotency.keys'::regclass")"
if [ "$PORTABLE" = 0 ]; then
    check "restored: pg_dump did not carry RLS or the policies of the extension's tables (re-apply the recipe)" "f|0" \
        "$(val postgres $R "SELECT relrowsecurity, (SELECT count(*) FROM pg_policy WHERE polrelid IN ('idempotency.keys'::regclass, 'idempotency.messages'::regclass)) FROM pg_class WHERE oid = 'idempotency.keys'::regclass")"
    check "restored, before re-applying: a tenant role reads other scopes' rows (all of them)" \
        "$(val postgres $R "SELECT count(*) FROM idempotency.keys")" \
        "$(val tenant_a $R "SELECT count(*) FROM idempotency.keys")"
    sql postgres $R -f "$HERE/sql/rls.sql" 2>>"$LOG" >/dev/null
    check "restored, after re-applying sql/rls.sql: the tenant sees none of them again" 0 \
        "$(val tenant_a $R "SELECT count(*) FROM idempotency.keys")"
else
    # portable: ordinary tables, so pg_dump carries RLS and both policies; nothing to re-apply.
    check "portable: restored: pg_dump carried RLS and the two policies" "t|2" \
        "$(val postgres $R "SELECT relrowsecurity, (SELECT count(*) FROM pg_policy WHERE polrelid IN ('idempotency.keys'::regclass, 'idempotency.messages'::regclass)) FROM pg_class WHERE oid = 'idempotency.keys'::regclass")"
    check "portable: restored, without re-applying the recipe: a tenant role sees none of the other scopes' rows" 0 \
        "$(val tenant_a $R "SELECT count(*) FROM idempotency.keys")"
fi

section "dump and restore: plain SQL format through psql"
sql postgres postgres -c "CREATE DATABASE sec_restored_plain"
if as_postgres pg_dump -h "$MAIN/socket" -p "$MAIN_PORT" -U postgres -Fp -f "$DUMP/db.sql" $DB 2>"$DUMP/pg_dump_plain.err" &&
    psql_at "$MAIN" "$MAIN_PORT" postgres sec_restored_plain -v ON_ERROR_STOP=1 -f "$DUMP/db.sql" >/dev/null 2>"$DUMP/psql_plain.err"; then
    check "plain dump restored with psql -v ON_ERROR_STOP=1, no error" "" "$(cat "$DUMP/pg_dump_plain.err" "$DUMP/psql_plain.err")"
else
    fail "plain dump restored with psql" "$(head -n 5 "$DUMP/psql_plain.err")"
fi
check "plain restore: every record and message, exactly once" "$SOURCE" "$(rows_digest sec_restored_plain)"
restored_grants sec_restored_plain
check "plain restore: a completed key replays" replay \
    "$(val $APP_ROLE sec_restored_plain "SELECT outcome FROM idempotency.idem_claim('dump', 'k-done', 'fp-done')")"
