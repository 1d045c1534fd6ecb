-- Switch a database from the native extension to the portable edition, in one transaction:
-- nothing is lost and claims in flight keep their tokens (every row is copied as it is).
--     psql -v ON_ERROR_STOP=1 -d DB -f sql/portable/switch-native-to-portable.sql
-- Run it as the extension's owner (a superuser). Callers wait on the tables' lock while it
-- runs. It refuses (and changes nothing) when objects of yours depend on the extension's
-- (a view on idempotency.keys, say): drop them first and create them again afterwards.
-- Docs: docs/portable.md, "Switching editions".
\set ON_ERROR_STOP 1
BEGIN;
-- The portable edition is release 0.6.0: the native extension must be at 0.6.0 too
-- (ALTER EXTENSION idempotency UPDATE first).
SELECT pg_catalog.count(*) OPERATOR(pg_catalog.=) 1 AS native_at_release
  FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'idempotency'
   AND extversion OPERATOR(pg_catalog.=) '0.6.0' \gset
\if :native_at_release
\else
DO $$ BEGIN RAISE EXCEPTION 'the idempotency extension at version 0.6.0 is not installed in this database' USING ERRCODE = '55000'; END $$;
\endif
\ir switch/save.sql
-- Leaves the schema (and its grants) in place; drops every object of the extension.
DROP EXTENSION idempotency;
\ir idempotency-portable--0.6.0.sql
\ir switch/restore.sql
COMMIT;
