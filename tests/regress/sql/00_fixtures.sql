-- Fixtures for every regress test, loaded once: pg_regress runs the tests in order in one
-- database, and every later file uses what this one makes.
--
-- The extension, in the edition IDEM_EDITION names (CREATE EXTENSION idempotency, or the
-- portable edition's script): tests/regress/install_extension.sql (IDEM_INSTALL_SQL, set by
-- tests/Makefile), quietly, so that both editions give this same output.
\set ECHO none
\getenv install_sql IDEM_INSTALL_SQL
\i :install_sql
\set ECHO all
SELECT count(*) > 0 AS idem_claim_installed FROM pg_proc
 WHERE proname = 'idem_claim' AND pronamespace = 'idempotency'::regnamespace;

CREATE SCHEMA fixture;

-- fixture.digest(): an md5 of every row of idempotency.keys and idempotency.messages, to
-- show that a statement wrote nothing.
CREATE FUNCTION fixture.digest() RETURNS text LANGUAGE sql AS $$
    SELECT md5(concat((SELECT string_agg(k::text, ';' ORDER BY k.scope, k.key) FROM idempotency.keys k), '#',
                      (SELECT string_agg(m::text, ';' ORDER BY m.scope, m.message_id) FROM idempotency.messages m))) $$;

-- fixture.try(statement): runs the statement, catches its error and shows its SQLSTATE and
-- message, and whether idempotency.keys and idempotency.messages are unchanged afterwards.
CREATE FUNCTION fixture.try(stmt text, OUT sqlstate text, OUT message text, OUT unchanged boolean)
LANGUAGE plpgsql AS $$
DECLARE
    before text := fixture.digest();
    code text := '00000';
    msg text := '(no error)';
BEGIN
    BEGIN
        EXECUTE stmt;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
    END;
    sqlstate := code;
    message := msg;
    unchanged := fixture.digest() = before;
END $$;

-- fixture.cases(label, statement, label, statement, ...): fixture.try for each pair, one
-- row per case, in order.
CREATE FUNCTION fixture.cases(VARIADIC c text[]) RETURNS TABLE(case_ text, sqlstate text, message text, unchanged boolean)
LANGUAGE sql AS $$
    SELECT c[i], t.* FROM generate_subscripts(c, 1) AS i, fixture.try(c[i + 1]) AS t WHERE i % 2 = 1 ORDER BY i $$;

-- fixture.sha(canonical): the fingerprint a client computes from canonical JSON text it
-- made itself.
CREATE FUNCTION fixture.sha(canonical text) RETURNS text LANGUAGE sql AS $$
    SELECT 'sha256:' || encode(sha256(convert_to(canonical, 'UTF8')), 'hex') $$;

-- fixture.drop_periods(): drops the periods idem_sweep made (the partitions named after a
-- time), so that a plan shows only the partitions a test makes itself. Returns how many.
CREATE FUNCTION fixture.drop_periods() RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    p regclass;
    n int := 0;
BEGIN
    FOR p IN SELECT part FROM idempotency.partition_bounds('idempotency.keys') WHERE NOT is_default AND lower_bound IS NOT NULL
             UNION ALL
             SELECT part FROM idempotency.partition_bounds('idempotency.messages') WHERE NOT is_default AND lower_bound IS NOT NULL
    LOOP
        EXECUTE format('DROP TABLE %s', p);
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;
