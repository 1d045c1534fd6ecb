-- Part of a switch between the editions (sql/portable/switch-*.sql), after the new edition
-- is installed: puts back what save.sql kept. A grant on a function the new edition does
-- not have (an edition's own helper) is left out.
INSERT INTO idempotency.keys SELECT * FROM idem_switch_keys;
INSERT INTO idempotency.messages SELECT * FROM idem_switch_messages;
INSERT INTO idempotency.outbound SELECT * FROM idem_switch_outbound;
INSERT INTO idempotency.outbound_budget SELECT * FROM idem_switch_outbound_budget;

DO $$
DECLARE
    g record;
    target text;
    statement text;
BEGIN
    FOR g IN SELECT * FROM idem_switch_grants ORDER BY privilege OPERATOR(pg_catalog.<>) 'REVOKE PUBLIC' LOOP
        IF g.kind OPERATOR(pg_catalog.=) 'FUNCTION' THEN
            IF pg_catalog.to_regprocedure(pg_catalog.format('idempotency.%I(%s)', g.name, g.args)) IS NULL THEN
                CONTINUE;
            END IF;
            target := pg_catalog.format('ROUTINE idempotency.%I(%s)', g.name, g.args);
        ELSE
            target := pg_catalog.format('TABLE idempotency.%I', g.name);
        END IF;
        IF g.privilege OPERATOR(pg_catalog.=) 'REVOKE PUBLIC' THEN
            EXECUTE pg_catalog.format('REVOKE ALL ON %s FROM PUBLIC', target);
        ELSE
            EXECUTE pg_catalog.format('GRANT %s ON %s TO %s%s', g.privilege, target,
                CASE WHEN g.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                     ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END,
                CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        END IF;
    END LOOP;
    FOR g IN SELECT * FROM idem_switch_rls LOOP
        IF g.enabled THEN
            EXECUTE pg_catalog.format('ALTER TABLE idempotency.%I ENABLE ROW LEVEL SECURITY', g.name);
        END IF;
        IF g.forced THEN
            EXECUTE pg_catalog.format('ALTER TABLE idempotency.%I FORCE ROW LEVEL SECURITY', g.name);
        END IF;
    END LOOP;
    FOR statement IN SELECT p.statement FROM idem_switch_policies AS p LOOP
        EXECUTE statement;
    END LOOP;
END
$$;
