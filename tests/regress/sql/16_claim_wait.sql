-- idem_claim(..., wait => ...): a duplicate that waits for the owner instead of answering
-- in_progress at once. Concurrent answers (replay, claimed, reclaimed, in_progress on
-- timeout) are in the isolation specs claim-wait-*; here, one session: the arguments.

-- An in_progress claim of another owner, with a long lease.
SELECT outcome FROM idempotency.idem_claim('acct_wait', 'order-1', lease => '1 hour');

-- NULL or zero: answer at once (in_progress), as without wait.
SELECT outcome, http_status FROM idempotency.idem_claim('acct_wait', 'order-1', wait => NULL);
SELECT outcome, http_status FROM idempotency.idem_claim('acct_wait', 'order-1', wait => '0');
-- A short wait that runs out: still in_progress, after waiting.
SELECT clock_timestamp() AS t0 \gset
SELECT outcome, http_status FROM idempotency.idem_claim('acct_wait', 'order-1', wait => '200 ms');
SELECT clock_timestamp() - :'t0'::timestamptz >= interval '200 ms' AS waited;
-- Under REPEATABLE READ (and SERIALIZABLE) the snapshot cannot show the change: at once.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT clock_timestamp() AS t1 \gset
SELECT outcome FROM idempotency.idem_claim('acct_wait', 'order-1', wait => '10 seconds');
SELECT clock_timestamp() - :'t1'::timestamptz < interval '5 seconds' AS answered_at_once;
COMMIT;
-- A wait is cut short by statement_timeout (57014) like any statement.
SET statement_timeout = '300ms';
SELECT outcome FROM idempotency.idem_claim('acct_wait', 'order-1', wait => '10 seconds');
RESET statement_timeout;
-- While waiting it took no transaction id.
BEGIN;
SELECT outcome FROM idempotency.idem_claim('acct_wait', 'order-1', wait => '50 ms');
SELECT txid_current_if_assigned() IS NULL AS no_xid;
COMMIT;

-- Bad input: negative, or more than one hour (22023). Nothing is written.
SELECT * FROM fixture.cases(
    'negative wait', $$SELECT idempotency.idem_claim('acct_wait', 'order-2', wait => '-1 second')$$,
    'over one hour', $$SELECT idempotency.idem_claim('acct_wait', 'order-2', wait => '61 minutes')$$,
    'a day', $$SELECT idempotency.idem_claim('acct_wait', 'order-2', wait => '1 day')$$);
-- One hour exactly is allowed (answered at once here: the key is free).
SELECT outcome FROM idempotency.idem_claim('acct_wait', 'order-3', wait => '1 hour');
DELETE FROM idempotency.keys WHERE scope = 'acct_wait';
