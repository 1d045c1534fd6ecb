-- Hostile look-alikes, created by the unprivileged role sec_evil in its own schema `evil`.
-- A victim who puts `evil` before pg_catalog on search_path resolves unqualified names
-- here first. Every function, operator, aggregate, view and trigger here calls
-- evil.trap(), which logs "EVIL-CALLED <what> app=<application_name>" as a WARNING (so the
-- server log keeps it even when the error is caught) and then raises SQLSTATE EV001.
-- Any call from inside the extension therefore shows up twice: as a different outcome
-- in the side-by-side comparison and as a line in the server log.
SET search_path = pg_catalog;
SET client_min_messages = warning;

CREATE SCHEMA evil;
GRANT USAGE ON SCHEMA evil TO PUBLIC;

CREATE FUNCTION evil.trap(what text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
    RAISE WARNING 'EVIL-CALLED % app=%', what, pg_catalog.current_setting('application_name');
    RAISE EXCEPTION 'EVIL-CALLED %', what USING ERRCODE = 'EV001';
END $$;

CREATE FUNCTION evil.trap_bool(what text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN PERFORM evil.trap(what); RETURN NULL; END $$;

-- Functions the extension's statements (or a careless rewrite of them) could call unqualified.
CREATE FUNCTION evil.now() RETURNS timestamptz
LANGUAGE plpgsql SET search_path = pg_catalog AS $$ BEGIN PERFORM evil.trap('now()'); RETURN NULL; END $$;
CREATE FUNCTION evil.gen_random_uuid() RETURNS uuid
LANGUAGE plpgsql SET search_path = pg_catalog AS $$ BEGIN PERFORM evil.trap('gen_random_uuid()'); RETURN NULL; END $$;
CREATE FUNCTION evil.unnest(anyarray) RETURNS SETOF anyelement
LANGUAGE plpgsql SET search_path = pg_catalog AS $$ BEGIN PERFORM evil.trap('unnest()'); END $$;
CREATE FUNCTION evil.current_database() RETURNS name
LANGUAGE plpgsql SET search_path = pg_catalog AS $$ BEGIN PERFORM evil.trap('current_database()'); RETURN NULL; END $$;
CREATE FUNCTION evil.to_regnamespace(text) RETURNS regnamespace
LANGUAGE plpgsql SET search_path = pg_catalog AS $$ BEGIN PERFORM evil.trap('to_regnamespace()'); RETURN NULL; END $$;
CREATE FUNCTION evil.to_regprocedure(text) RETURNS regprocedure
LANGUAGE plpgsql SET search_path = pg_catalog AS $$ BEGIN PERFORM evil.trap('to_regprocedure()'); RETURN NULL; END $$;
CREATE FUNCTION evil.jsonb_typeof(jsonb) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog AS $$ BEGIN PERFORM evil.trap('jsonb_typeof()'); RETURN NULL; END $$;
CREATE FUNCTION evil.sha256(bytea) RETURNS bytea
LANGUAGE plpgsql SET search_path = pg_catalog AS $$ BEGIN PERFORM evil.trap('sha256()'); RETURN NULL; END $$;
CREATE FUNCTION evil.pg_sleep(double precision) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog AS $$ BEGIN PERFORM evil.trap('pg_sleep()'); END $$;

-- The extension's own function names: an internal unqualified call would land here.
CREATE FUNCTION evil.idem_sweep(int) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog AS $$ BEGIN PERFORM evil.trap('idem_sweep()'); RETURN NULL; END $$;
CREATE FUNCTION evil.idem_claim(text, text, text DEFAULT NULL, interval DEFAULT NULL, interval DEFAULT NULL) RETURNS record
LANGUAGE plpgsql SET search_path = pg_catalog AS $$ BEGIN PERFORM evil.trap('idem_claim()'); RETURN NULL; END $$;
CREATE FUNCTION evil.idem_reclaim_stale(int DEFAULT 1000, boolean DEFAULT true, interval DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog AS $$ BEGIN PERFORM evil.trap('idem_reclaim_stale()'); RETURN NULL; END $$;

-- Aggregates: count(*), count(x), array_agg(text), min(x), max(x), sum(x).
CREATE FUNCTION evil.agg_step(state bigint) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog AS $$ BEGIN PERFORM evil.trap('count(*)'); RETURN NULL; END $$;
CREATE FUNCTION evil.agg_step_any(state bigint, x anyelement) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog AS $$ BEGIN PERFORM evil.trap('aggregate(x)'); RETURN NULL; END $$;
CREATE FUNCTION evil.agg_step_same(state anyelement, x anyelement) RETURNS anyelement
LANGUAGE plpgsql SET search_path = pg_catalog AS $$ BEGIN PERFORM evil.trap('min/max(x)'); RETURN NULL; END $$;
CREATE FUNCTION evil.agg_step_arr(state text[], x text) RETURNS text[]
LANGUAGE plpgsql SET search_path = pg_catalog AS $$ BEGIN PERFORM evil.trap('array_agg(text)'); RETURN NULL; END $$;
CREATE AGGREGATE evil.count(*) (SFUNC = evil.agg_step, STYPE = bigint, INITCOND = '0');
CREATE AGGREGATE evil.count(anyelement) (SFUNC = evil.agg_step_any, STYPE = bigint, INITCOND = '0');
CREATE AGGREGATE evil.sum(anyelement) (SFUNC = evil.agg_step_any, STYPE = bigint, INITCOND = '0');
CREATE AGGREGATE evil.min(anyelement) (SFUNC = evil.agg_step_same, STYPE = anyelement);
CREATE AGGREGATE evil.max(anyelement) (SFUNC = evil.agg_step_same, STYPE = anyelement);
CREATE AGGREGATE evil.array_agg(text) (SFUNC = evil.agg_step_arr, STYPE = text[]);

-- Operators on the types the extension compares and adds: text, uuid, timestamptz,
-- interval, int, bigint, jsonb. Exact-type matches, so with evil first they win.
DO $$
DECLARE
    pair text[];
    op text;
    fn text;
    n int := 0;
BEGIN
    FOREACH pair SLICE 1 IN ARRAY ARRAY[
        ['text', 'text'], ['uuid', 'uuid'], ['timestamptz', 'timestamptz'],
        ['int4', 'int4'], ['int8', 'int8'], ['int8', 'int4'], ['int4', 'int8'],
        ['interval', 'interval'], ['jsonb', 'jsonb'], ['name', 'name'], ['oid', 'oid'],
        ['regclass', 'regclass'], ['char', 'char']
    ] LOOP
        FOREACH op IN ARRAY ARRAY['=', '<>', '<', '<=', '>', '>=', '+', '||', '~~'] LOOP
            n := n + 1;
            fn := 'evil.op_' || n;
            EXECUTE format(
                'CREATE FUNCTION %s(%s, %s) RETURNS %s LANGUAGE plpgsql SET search_path = pg_catalog '
                'AS $f$ BEGIN PERFORM evil.trap(%L); RETURN NULL; END $f$',
                fn, pair[1], pair[2],
                CASE WHEN op IN ('+', '||') THEN pair[1] ELSE 'boolean' END,
                format('operator %s(%s, %s)', op, pair[1], pair[2]));
            EXECUTE format('CREATE OPERATOR evil.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = %s)',
                           op, pair[1], pair[2], fn);
        END LOOP;
    END LOOP;
    -- timestamptz + interval and timestamptz - interval: how a lease or ttl is added.
    CREATE FUNCTION evil.op_ts_plus(timestamptz, interval) RETURNS timestamptz
    LANGUAGE plpgsql SET search_path = pg_catalog AS $f$ BEGIN PERFORM evil.trap('operator +(timestamptz, interval)'); RETURN NULL; END $f$;
    CREATE OPERATOR evil.+ (LEFTARG = timestamptz, RIGHTARG = interval, FUNCTION = evil.op_ts_plus);
    CREATE OPERATOR evil.- (LEFTARG = timestamptz, RIGHTARG = interval, FUNCTION = evil.op_ts_plus);
END $$;

-- Relations named like the extension's: keys, messages, claim_result, stats. Views over
-- one row that trap when read; INSTEAD OF triggers that trap when written.
CREATE FUNCTION evil.trap_trigger() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN PERFORM evil.trap('write to view ' || TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME); RETURN NULL; END $$;

CREATE VIEW evil.keys AS
SELECT NULL::text AS scope, NULL::text AS key, NULL::text AS fingerprint, 'completed'::text AS status,
       NULL::uuid AS token, 1 AS attempts, NULL::timestamptz AS locked_until,
       NULL::text AS recovery_point, NULL::jsonb AS recovery_data, 200 AS response_status,
       NULL::jsonb AS response_headers, '"evil"'::jsonb AS response_body,
       NULL::timestamptz AS created_at, NULL::timestamptz AS updated_at,
       NULL::timestamptz AS completed_at, 'infinity'::timestamptz AS expires_at
WHERE evil.trap_bool('read of view evil.keys');
CREATE VIEW evil.messages AS
SELECT NULL::text AS scope, NULL::text AS message_id, NULL::timestamptz AS seen_at,
       'infinity'::timestamptz AS expires_at
WHERE evil.trap_bool('read of view evil.messages');
CREATE VIEW evil.claim_result AS
SELECT 'replay'::text AS outcome, NULL::uuid AS token WHERE evil.trap_bool('read of view evil.claim_result');
CREATE VIEW evil.stats AS
SELECT 0::bigint AS in_progress WHERE evil.trap_bool('read of view evil.stats');
CREATE TRIGGER trap INSTEAD OF INSERT OR UPDATE OR DELETE ON evil.keys
    FOR EACH ROW EXECUTE FUNCTION evil.trap_trigger();
CREATE TRIGGER trap INSTEAD OF INSERT OR UPDATE OR DELETE ON evil.messages
    FOR EACH ROW EXECUTE FUNCTION evil.trap_trigger();
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA evil TO PUBLIC;

-- A schema named cron with a cron.schedule(text, text, text), as a database owner could
-- create where pg_cron is not installed: schedule_maintenance must not call it.
CREATE SCHEMA cron;
GRANT USAGE ON SCHEMA cron TO PUBLIC;
CREATE FUNCTION cron.schedule(text, text, text) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog AS $$ BEGIN PERFORM evil.trap('cron.schedule()'); RETURN 666; END $$;
