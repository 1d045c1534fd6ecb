-- Installs the extension into the current database, in the edition the environment's
-- IDEM_EDITION names: the one place every suite installs it from (tests/lib.sh's
-- install_extension runs this file; tests/regress/sql/00_fixtures.sql includes it).
--   native (default)  CREATE EXTENSION idempotency
--   portable          the plain SQL script $IDEM_PORTABLE_SQL (tests/lib.sh sets it to
--                     sql/portable/idempotency-portable--VERSION.sql)
-- psql 15 or later (\getenv).
\set ON_ERROR_STOP 1
\getenv idem_edition IDEM_EDITION
\if :{?idem_edition}
\else
\set idem_edition native
\endif
SELECT :'idem_edition' = 'native' AS idem_native, :'idem_edition' = 'portable' AS idem_portable \gset
\if :idem_native
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
RESET client_min_messages;
\elif :idem_portable
\getenv idem_portable_sql IDEM_PORTABLE_SQL
\if :{?idem_portable_sql}
SET client_min_messages = warning;
\o /dev/null
\i :idem_portable_sql
\o
RESET client_min_messages;
\else
\warn 'install_extension.sql: IDEM_EDITION=portable needs IDEM_PORTABLE_SQL (the portable script''s path)'
DO $$ BEGIN RAISE EXCEPTION 'IDEM_EDITION=portable needs IDEM_PORTABLE_SQL'; END $$;
\endif
\else
\warn 'install_extension.sql: IDEM_EDITION must be native or portable'
DO $$ BEGIN RAISE EXCEPTION 'IDEM_EDITION must be native or portable'; END $$;
\endif
\unset idem_edition
\unset idem_native
\unset idem_portable
