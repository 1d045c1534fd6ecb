-- Tombstones: idempotency.tombstone_ttl (default 0, off). With it on, a completed record
-- that expired answers `expired` (http_status 410, response_status the status it had,
-- nothing written) until expires_at + tombstone_ttl, so that a retry after the record's ttl
-- does not run the operation again.

-- Records kept row by row (no time partitions: idempotency.partition_period = 0), as
-- before 0.6.0, which is what this file shows; 22_partitions shows the periods.
SET idempotency.partition_period = 0;
SELECT fixture.drop_periods() >= 0 AS periods_dropped;

-- A completed record with a short ttl, and one left in_progress.
SELECT token AS tok_done FROM idempotency.idem_claim('acct_ts', 'done', 'fp-A', ttl => '50 ms') \gset
SELECT idempotency.idem_complete('acct_ts', 'done', :'tok_done', 201, '{"id": "ch_9"}', '{"Location": "/ch_9"}');
SELECT outcome FROM idempotency.idem_claim('acct_ts', 'abandoned', 'fp-A', ttl => '50 ms');
SELECT outcome FROM idempotency.idem_claim('acct_ts', 'off', 'fp-A', ttl => '50 ms');
SELECT pg_sleep(0.1);

-- Off by default.
SHOW idempotency.tombstone_ttl;
-- Off (the default): an expired record counts as absent, a claim runs as new.
SELECT outcome, attempts FROM idempotency.idem_claim('acct_ts', 'off', 'fp-A');

SET idempotency.tombstone_ttl = '1 hour';
-- On: the expired completed record answers expired, 410, with the status it had; no body.
SELECT fixture.digest() AS before \gset
BEGIN;
SELECT outcome, token IS NULL AS no_token, http_status, response_status, response_body, response_headers, attempts
  FROM idempotency.idem_claim('acct_ts', 'done', 'fp-A');
SELECT txid_current_if_assigned() IS NULL AS no_xid;
COMMIT;
SELECT fixture.digest() = :'before' AS nothing_written;
-- Another fingerprint is still a mismatch (422).
SELECT outcome, http_status FROM idempotency.idem_claim('acct_ts', 'done', 'fp-B');
-- A record that expired in_progress leaves no tombstone: a claim runs as new.
SELECT outcome, attempts FROM idempotency.idem_claim('acct_ts', 'abandoned', 'fp-A');
-- idem_lookup does not return tombstones (they are expired records).
SELECT count(*) AS lookup_rows FROM idempotency.idem_lookup('acct_ts', 'done');
-- stats counts them (its last column); they are expired too.
SELECT tombstones, expired >= tombstones AS counted_in_expired FROM idempotency.stats;

-- The sweep turns expired completed records into tombstones: the response is dropped,
-- what a tombstone answers with is kept.
SELECT idempotency.idem_sweep() AS swept;
SELECT status, fingerprint, response_status, response_body, response_headers, attempts
  FROM idempotency.keys WHERE scope = 'acct_ts' AND key = 'done';
SELECT outcome, http_status, response_status FROM idempotency.idem_claim('acct_ts', 'done', 'fp-A');
-- A second sweep finds nothing more to do.
SELECT idempotency.idem_sweep() AS swept_again;

-- Once expires_at + tombstone_ttl has passed, the tombstone is gone: a claim runs as new,
-- and the sweep deletes such tombstones.
SET idempotency.tombstone_ttl = '10 ms';
SELECT outcome, attempts FROM idempotency.idem_claim('acct_ts', 'done', 'fp-A');
SELECT token AS tok_done2 FROM idempotency.keys WHERE scope = 'acct_ts' AND key = 'done' \gset
SELECT idempotency.idem_complete('acct_ts', 'done', :'tok_done2', 200);
UPDATE idempotency.keys SET expires_at = now() - interval '1 minute' WHERE scope = 'acct_ts' AND key = 'done';
SELECT idempotency.idem_sweep() AS swept;
SELECT count(*) AS left_behind FROM idempotency.keys WHERE scope = 'acct_ts' AND key = 'done';

-- The setting: an interval, 0 or positive; anything else is refused (22023).
SET idempotency.tombstone_ttl = '7 days';
SHOW idempotency.tombstone_ttl;
SELECT * FROM fixture.cases(
    'negative', $$SET idempotency.tombstone_ttl = '-1 hour'$$,
    'not an interval', $$SET idempotency.tombstone_ttl = 'soon'$$);
RESET idempotency.tombstone_ttl;
SHOW idempotency.tombstone_ttl;
DELETE FROM idempotency.keys WHERE scope = 'acct_ts';
