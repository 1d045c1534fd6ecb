-- Switch a database from the portable edition (installed with psql -f) to the native
-- extension, in one transaction: nothing is lost and claims in flight keep their tokens
-- (every row is copied as it is).
--     psql -v ON_ERROR_STOP=1 -d DB -f sql/portable/switch-portable-to-native.sql
-- Run it as a superuser on a server where the native extension is installed (its files in
-- the server's lib and share directories). Callers wait on the tables' lock while it runs.
-- It refuses (and changes nothing) when objects of yours depend on the portable edition's.
-- Docs: docs/portable.md, "Switching editions".
\set ON_ERROR_STOP 1
BEGIN;
SELECT pg_catalog.count(*) OPERATOR(pg_catalog.=) 0 AS not_an_extension
  FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'idempotency' \gset
\if :not_an_extension
\else
DO $$ BEGIN RAISE EXCEPTION 'idempotency is installed as an extension here (native, or the portable edition through pg_tle): see docs/portable.md' USING ERRCODE = '55000'; END $$;
\endif
\ir switch/save.sql
-- Drops the portable edition's objects, by name (not CASCADE: anything of yours that depends
-- on them makes this fail), and keeps the schema and its grants. The views first: they read
-- partition_bounds(). Dropping keys and messages drops their partitions (the periods too).
DROP VIEW idempotency.stats, idempotency.partitions;
DO $$
DECLARE
    fn record;
BEGIN
    FOR fn IN
        SELECT p.oid::pg_catalog.regprocedure AS signature, p.prokind
          FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.regnamespace
           AND (p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['idem_claim', 'idem_complete', 'idem_checkpoint',
                    'idem_release', 'idem_lookup', 'idem_seen', 'idem_seen_many', 'idem_sweep', 'idem_reclaim_stale',
                    'idem_fingerprint', 'idem_sweep_all', 'schedule_maintenance', 'distribute', 'idem_send',
                    'idem_send_next', 'idem_send_result', 'legacy_drop_when_empty'])
                OR p.proname OPERATOR(pg_catalog.~) '^(portable|send|partitions?)_')
    LOOP
        EXECUTE pg_catalog.format('DROP %s %s', CASE WHEN fn.prokind OPERATOR(pg_catalog.=) 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END, fn.signature);
    END LOOP;
END
$$;
DROP TYPE idempotency.claim_result;
DROP TABLE idempotency.keys, idempotency.messages, idempotency.outbound, idempotency.outbound_budget;
DROP TABLE IF EXISTS idempotency.keys_legacy, idempotency.messages_legacy;
-- The release whose table and functions the portable edition has (0.6.0: a portable install
-- at an older release runs its upgrade files first); ALTER EXTENSION idempotency UPDATE
-- afterwards moves on to the newest.
CREATE EXTENSION idempotency SCHEMA idempotency VERSION '0.6.0';
\ir switch/restore.sql
COMMIT;
