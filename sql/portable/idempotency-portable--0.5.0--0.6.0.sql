-- idempotency PORTABLE EDITION, 0.5.0 -> 0.6.0, as the native sql/idempotency--0.5.0--0.6.0.sql.
-- Frozen once released, as every upgrade file.
--
-- Run once, in one transaction, by the owner of the portable install:
--     psql -v ON_ERROR_STOP=1 -1 -d DB -f sql/portable/idempotency-portable--0.5.0--0.6.0.sql
-- It works unchanged as an extension update script (idempotency--0.5.0--0.6.0.sql next to
-- the control file, or pgtle.install_update_path), then ALTER EXTENSION idempotency UPDATE.
--
-- What changes: (written by scripts/release.sh; with no change to the portable SQL but the
-- version, it stays as it is). tests/upgrade/run.sh checks that 0.5.0 plus this file equals
-- a fresh install of 0.6.0.

-- Only over release 0.5.0: over another release it stops and changes nothing.
DO $$
DECLARE
    installed text;
BEGIN
    IF pg_catalog.to_regprocedure('idempotency.portable_version()') IS NOT NULL THEN
        EXECUTE 'SELECT idempotency.portable_version()' INTO installed;
    END IF;
    IF installed IS DISTINCT FROM '0.5.0' THEN
        RAISE EXCEPTION 'this file upgrades the portable edition 0.5.0, but the release installed here is %',
                        coalesce(installed, 'none (no idempotency.portable_version())')
            USING ERRCODE = '55000', HINT = 'docs/portable.md, "Upgrades": run the upgrade files in order, each once.';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION idempotency.portable_version() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT '0.6.0' $$;
