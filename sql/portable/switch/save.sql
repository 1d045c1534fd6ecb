-- Part of a switch between the editions (sql/portable/switch-*.sql); runs inside its
-- transaction. Locks the tables (callers wait until the switch commits) and keeps, in
-- temporary tables dropped at commit, what the new edition must get back: every row, the
-- grants on the tables, the view and the functions, and the row-level security policies.
LOCK TABLE idempotency.keys, idempotency.messages, idempotency.outbound, idempotency.outbound_budget
    IN ACCESS EXCLUSIVE MODE;

CREATE TEMP TABLE idem_switch_keys ON COMMIT DROP AS SELECT * FROM idempotency.keys;
CREATE TEMP TABLE idem_switch_messages ON COMMIT DROP AS SELECT * FROM idempotency.messages;
-- A database updated from 0.5.0 may still keep records in keys_legacy / messages_legacy
-- (until idem_sweep has moved them all): they are records like the others.
DO $$
BEGIN
    IF pg_catalog.to_regclass('idempotency.keys_legacy') IS NOT NULL THEN
        LOCK TABLE idempotency.keys_legacy IN ACCESS EXCLUSIVE MODE;
        INSERT INTO idem_switch_keys SELECT * FROM idempotency.keys_legacy;
    END IF;
    IF pg_catalog.to_regclass('idempotency.messages_legacy') IS NOT NULL THEN
        LOCK TABLE idempotency.messages_legacy IN ACCESS EXCLUSIVE MODE;
        INSERT INTO idem_switch_messages SELECT * FROM idempotency.messages_legacy;
    END IF;
END
$$;
CREATE TEMP TABLE idem_switch_outbound ON COMMIT DROP AS SELECT * FROM idempotency.outbound;
CREATE TEMP TABLE idem_switch_outbound_budget ON COMMIT DROP AS SELECT * FROM idempotency.outbound_budget;

-- Grants: kind, object name, argument types (functions), grantee (0: PUBLIC), privilege. The
-- owner of the tables and the view gets ALL on the new ones (the new edition's objects
-- belong to whoever runs the switch); a function whose EXECUTE was revoked from PUBLIC has
-- a row with privilege 'REVOKE PUBLIC'.
CREATE TEMP TABLE idem_switch_grants ON COMMIT DROP AS
SELECT CASE c.relkind WHEN 'v' THEN 'VIEW' ELSE 'TABLE' END AS kind, c.relname::text AS name,
       NULL::text AS args, a.grantee, a.privilege_type AS privilege, a.is_grantable
  FROM pg_catalog.pg_class AS c, pg_catalog.aclexplode(c.relacl) AS a
 WHERE c.relnamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace
   AND c.relname OPERATOR(pg_catalog.=) ANY (ARRAY['keys', 'messages', 'outbound', 'outbound_budget', 'stats', 'partitions'])
   AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
UNION ALL
SELECT CASE c.relkind WHEN 'v' THEN 'VIEW' ELSE 'TABLE' END, c.relname::text, NULL, c.relowner, 'ALL', false
  FROM pg_catalog.pg_class AS c
 WHERE c.relnamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace
   AND c.relname OPERATOR(pg_catalog.=) ANY (ARRAY['keys', 'messages', 'outbound', 'outbound_budget', 'stats', 'partitions'])
UNION ALL
SELECT 'FUNCTION', p.proname::text, pg_catalog.oidvectortypes(p.proargtypes),
       a.grantee, a.privilege_type, a.is_grantable
  FROM pg_catalog.pg_proc AS p, pg_catalog.aclexplode(p.proacl) AS a
 WHERE p.pronamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace
   AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
UNION ALL
SELECT 'FUNCTION', p.proname::text, pg_catalog.oidvectortypes(p.proargtypes),
       0::oid, 'REVOKE PUBLIC', false
  FROM pg_catalog.pg_proc AS p
 WHERE p.pronamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace
   AND p.proacl IS NOT NULL
   AND NOT EXISTS (SELECT FROM pg_catalog.aclexplode(p.proacl) AS a
                    WHERE a.grantee OPERATOR(pg_catalog.=) 0);

-- Row-level security: whether it is on (and forced), and each policy as a CREATE POLICY.
CREATE TEMP TABLE idem_switch_rls ON COMMIT DROP AS
SELECT c.relname::text AS name, c.relrowsecurity AS enabled, c.relforcerowsecurity AS forced
  FROM pg_catalog.pg_class AS c
 WHERE c.relnamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace
   AND c.relname OPERATOR(pg_catalog.=) ANY (ARRAY['keys', 'messages', 'outbound', 'outbound_budget']);
CREATE TEMP TABLE idem_switch_policies ON COMMIT DROP AS
SELECT pg_catalog.format('CREATE POLICY %I ON idempotency.%I AS %s FOR %s TO %s%s%s',
           p.policyname, p.tablename, p.permissive, p.cmd,
           (SELECT pg_catalog.string_agg(CASE WHEN r OPERATOR(pg_catalog.=) 'public' THEN 'PUBLIC'
                                              ELSE pg_catalog.quote_ident(r) END, ', ')
              FROM pg_catalog.unnest(p.roles) AS r),
           ' USING (' OPERATOR(pg_catalog.||) p.qual OPERATOR(pg_catalog.||) ')',
           ' WITH CHECK (' OPERATOR(pg_catalog.||) p.with_check OPERATOR(pg_catalog.||) ')') AS statement
  FROM pg_catalog.pg_policies AS p
 WHERE p.schemaname OPERATOR(pg_catalog.=) 'idempotency'
   AND p.tablename OPERATOR(pg_catalog.=) ANY (ARRAY['keys', 'messages', 'outbound', 'outbound_budget']);
