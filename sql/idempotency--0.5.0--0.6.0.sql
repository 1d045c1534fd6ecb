-- idempotency 0.5.0 -> 0.6.0. Frozen once released, as every upgrade script.
-- It brings a database at 0.5.0 to exactly what a fresh install of 0.6.0 creates, keeping the
-- data (tests/upgrade/run.sh compares the two). Say here, and in the changelogs, if it
-- rewrites a table or rebuilds an index: the UPDATE blocks writes meanwhile.
-- (Written by scripts/release.sh; with no change to the native SQL it stays as it is.)
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.6.0'" to load this file. \quit

-- Issue 34: claims that write nothing until their record is complete. idem_claim gets the
-- argument `deferred` (default false) and a new C symbol (the library keeps the old one for
-- databases not updated yet). A function's arguments cannot change in place, so it is
-- dropped and created again: grants on it (EXECUTE) must be made again, and the UPDATE
-- fails (rather than drop them) if a view or function of yours depends on it. On Citus,
-- call idempotency.distribute() again afterwards to delegate it.
DROP FUNCTION idempotency.idem_claim(text, text, text, interval, interval, interval, uuid);
CREATE FUNCTION idempotency."idem_claim"(
	"scope" TEXT,
	"key" TEXT,
	"fingerprint" TEXT DEFAULT NULL,
	"ttl" interval DEFAULT NULL,
	"lease" interval DEFAULT NULL,
	"wait" interval DEFAULT NULL,
	"token" uuid DEFAULT NULL,
	"deferred" bool DEFAULT false
) RETURNS idempotency.claim_result
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'idem_claim_deferred_wrapper';

-- The NULL-scope guard (sql/citus.sql), on the new idem_claim.
ALTER FUNCTION idempotency.idem_claim(text, text, text, interval, interval, interval, uuid, boolean)
    SUPPORT idempotency.idem_scope_support;
