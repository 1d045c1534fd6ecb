-- search_path hijacking, run by the database owner (who may create schemas): look-alike
-- tables, functions and operators in a schema placed first on search_path, and a temporary
-- table, must change nothing the idempotency functions do. Prints one line per answer.
SET client_min_messages = warning;
CREATE SCHEMA evil;
CREATE TABLE evil.keys (LIKE idempotency.keys);
CREATE TABLE evil.messages (LIKE idempotency.messages);
CREATE TEMP TABLE keys (LIKE idempotency.keys);
CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT '2000-01-01'::timestamptz $$;
CREATE FUNCTION evil.gen_random_uuid() RETURNS uuid LANGUAGE sql AS $$ SELECT '00000000-0000-0000-0000-000000000000'::uuid $$;
CREATE FUNCTION evil.always(text, text) RETURNS boolean LANGUAGE sql AS $$ SELECT true $$;
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.always);
CREATE FUNCTION evil.sha256(bytea) RETURNS bytea LANGUAGE sql AS $$ SELECT '\x00'::bytea $$;
CREATE FUNCTION evil.encode(bytea, text) RETURNS text LANGUAGE sql AS $$ SELECT 'evil' $$;
CREATE FUNCTION evil.jsonb_typeof(jsonb) RETURNS text LANGUAGE sql AS $$ SELECT 'string' $$;
CREATE FUNCTION evil.length(text) RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;
CREATE FUNCTION evil.pg_is_in_recovery() RETURNS boolean LANGUAGE sql AS $$ SELECT true $$;
CREATE FUNCTION evil.current_setting(text, boolean) RETURNS text LANGUAGE sql AS $$ SELECT '1 microsecond' $$;
SET search_path = evil, pg_temp, idempotency, public;

SELECT outcome FROM idempotency.idem_claim('hj', 'k1', 'fp');
SELECT count(*) FROM (SELECT idempotency.idem_complete('hj', 'k1', k.token, 201)
                        FROM idempotency.keys AS k
                       WHERE k.scope OPERATOR(pg_catalog.=) 'hj' AND k.key OPERATOR(pg_catalog.=) 'k1') AS c;
SELECT outcome FROM idempotency.idem_claim('hj', 'k1', 'fp');
SELECT http_status FROM idempotency.idem_claim('hj', 'k1', 'fp');
SELECT outcome FROM idempotency.idem_claim('hj', 'k2');
SELECT outcome FROM idempotency.idem_claim('hj', 'k2');
SELECT idempotency.idem_fingerprint('{"b":[1.5,"x"],"a":1e21}'::jsonb);
-- Nothing went to the look-alikes; no zero token, no year-2000 times, the real lease.
SELECT (SELECT count(*) FROM evil.keys) OPERATOR(pg_catalog.+) (SELECT count(*) FROM pg_temp.keys)
       OPERATOR(pg_catalog.+) (SELECT count(*) FROM idempotency.keys AS k
                                WHERE k.token OPERATOR(pg_catalog.=) '00000000-0000-0000-0000-000000000000'
                                   OR k.created_at OPERATOR(pg_catalog.<) '2020-01-01'
                                   OR k.expires_at OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.+) '23 hours'::interval));
RESET search_path;
DROP SCHEMA evil CASCADE;
