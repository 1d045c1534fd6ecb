-- idem_claim(..., token => ...): claims that are safe to retry. The caller makes a fresh
-- random token per attempt and passes it; when the connection breaks during the claim's
-- COMMIT, the application repeats the very same call and learns whether it owns the key.

-- A new claim made with a token stores that token.
SELECT outcome, token, attempts, http_status
  FROM idempotency.idem_claim('acct_tok', 'order-1', 'fp-A',
                              token => '11111111-1111-4111-8111-111111111111');
SELECT status, token, attempts FROM idempotency.keys WHERE scope = 'acct_tok' AND key = 'order-1';

-- The same call again (its first answer was lost): claimed again, the same token, attempts
-- unchanged, and nothing written (no transaction id, the record untouched).
SELECT fixture.digest() AS before \gset
BEGIN;
SELECT outcome, token, attempts, http_status, locked_until > now() AS lease_running
  FROM idempotency.idem_claim('acct_tok', 'order-1', 'fp-A',
                              token => '11111111-1111-4111-8111-111111111111');
SELECT txid_current_if_assigned() IS NULL AS no_xid;
COMMIT;
SELECT fixture.digest() = :'before' AS nothing_written;

-- Anyone else (no token, or another token) still gets in_progress (409): a token is never
-- taken over through this path while its claim is live.
SELECT outcome, token IS NULL AS no_token, http_status
  FROM idempotency.idem_claim('acct_tok', 'order-1', 'fp-A');
SELECT outcome, token IS NULL AS no_token, http_status
  FROM idempotency.idem_claim('acct_tok', 'order-1', 'fp-A',
                              token => '22222222-2222-4222-8222-222222222222');

-- The fingerprint is still checked first: the same token with another request is a mismatch.
SELECT outcome, http_status
  FROM idempotency.idem_claim('acct_tok', 'order-1', 'fp-B',
                              token => '11111111-1111-4111-8111-111111111111');

-- Once completed, the same token gets replay like every retry: no second run.
SELECT idempotency.idem_complete('acct_tok', 'order-1', '11111111-1111-4111-8111-111111111111', 201,
                                 '{"id": "ch_1"}');
SELECT outcome, token IS NULL AS no_token, http_status, response_body
  FROM idempotency.idem_claim('acct_tok', 'order-1', 'fp-A',
                              token => '11111111-1111-4111-8111-111111111111');

-- A takeover made with a token stores it: the lease of the first owner ended.
SELECT outcome, token FROM idempotency.idem_claim('acct_tok', 'order-2', lease => '10 ms',
                                                  token => '33333333-3333-4333-8333-333333333333');
SELECT pg_sleep(0.05);
SELECT outcome, token, attempts
  FROM idempotency.idem_claim('acct_tok', 'order-2', token => '44444444-4444-4444-8444-444444444444');
-- ... and repeating the takeover's call answers claimed (the caller owns it), attempts unchanged.
SELECT outcome, token, attempts
  FROM idempotency.idem_claim('acct_tok', 'order-2', token => '44444444-4444-4444-8444-444444444444');
-- The old owner's token no longer owns anything: the old owner repeating its call is told in_progress.
SELECT outcome, http_status
  FROM idempotency.idem_claim('acct_tok', 'order-2', token => '33333333-3333-4333-8333-333333333333');
