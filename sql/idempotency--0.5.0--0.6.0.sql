-- idempotency 0.5.0 -> 0.6.0. Frozen once released, as every upgrade script.
-- It brings a database at 0.5.0 to exactly what a fresh install of 0.6.0 creates, keeping the
-- data (tests/upgrade/run.sh compares the two). Say here, and in the changelogs, if it
-- rewrites a table or rebuilds an index: the UPDATE blocks writes meanwhile.
-- (Written by scripts/release.sh; with no change to the native SQL it stays as it is.)
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.6.0'" to load this file. \quit
