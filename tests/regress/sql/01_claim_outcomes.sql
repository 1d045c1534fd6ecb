-- idem_claim and its five outcomes: claimed, in_progress, mismatch, replay, reclaimed.
-- Tokens and timestamps depend on the clock, so they are shown as true/false checks.

-- The first request with a key claims it: the caller now owns an in_progress record and
-- holds its token; http_status is NULL (run the operation). By default the record lives
-- 24 hours (idempotency.default_ttl) and the lease lasts 5 minutes (default_lease).
SELECT outcome, token IS NOT NULL AS has_token, http_status, attempts,
       expires_at = now() + interval '24 hours' AS expires_in_24h,
       locked_until = now() + interval '5 minutes' AS lease_5min
  FROM idempotency.idem_claim('acct_42', 'order-1', 'fp-A');
-- (The application keeps the token idem_claim returned; this test reads it back from the record.)
SELECT token AS tok1 FROM idempotency.keys WHERE scope = 'acct_42' AND key = 'order-1' \gset
SELECT status, attempts, fingerprint FROM idempotency.keys WHERE scope = 'acct_42' AND key = 'order-1';

-- A retry while the owner is still working gets in_progress: answer 409. No token is given.
SELECT outcome, token IS NULL AS no_token, http_status, attempts, locked_until > now() AS lease_running
  FROM idempotency.idem_claim('acct_42', 'order-1', 'fp-A');

-- The same key with another fingerprint is a mismatch (422), and mismatch wins over in_progress.
SELECT outcome, token IS NULL AS no_token, http_status
  FROM idempotency.idem_claim('acct_42', 'order-1', 'fp-B');

-- The owner stores the response: status, body, headers.
SELECT idempotency.idem_complete('acct_42', 'order-1', :'tok1', 201,
       '{"id": "ch_1", "amount": 500}', '{"Location": "/charges/ch_1"}');

-- Every retry now gets replay: http_status is the stored status, headers and body as stored.
SELECT outcome, token IS NULL AS no_token, http_status, response_status, response_headers, response_body, attempts
  FROM idempotency.idem_claim('acct_42', 'order-1', 'fp-A');

-- mismatch also wins over replay: a completed key reused for another request is still a 422.
SELECT outcome, http_status, response_status, response_body
  FROM idempotency.idem_claim('acct_42', 'order-1', 'fp-B');

-- Fingerprints compare with IS DISTINCT FROM: NULL matches NULL ...
SELECT outcome FROM idempotency.idem_claim('acct_42', 'no-fingerprint');
SELECT outcome, http_status FROM idempotency.idem_claim('acct_42', 'no-fingerprint');
-- ... but NULL against 'x', either way round, is a mismatch.
SELECT outcome, http_status FROM idempotency.idem_claim('acct_42', 'no-fingerprint', 'x');
SELECT outcome FROM idempotency.idem_claim('acct_42', 'with-fingerprint', 'x');
SELECT outcome, http_status FROM idempotency.idem_claim('acct_42', 'with-fingerprint');

-- Keys never collide across scopes: order-1 is new for another tenant, or another endpoint.
SELECT outcome, attempts FROM idempotency.idem_claim('acct_7', 'order-1', 'fp-B');
SELECT outcome, attempts FROM idempotency.idem_claim('acct_42:POST /refunds', 'order-1', 'fp-C');
SELECT scope, key, status, fingerprint FROM idempotency.keys WHERE key = 'order-1' ORDER BY scope;

-- A failed operation is completed too: a stored 500 is replayed exactly like a 201.
-- (Here the test keeps the token from idem_claim's own answer, as an application does,
-- and checks that it is the record's token.)
SELECT outcome AS outcome500, token AS tok500 FROM idempotency.idem_claim('acct_42', 'order-500', 'fp-A') \gset
SELECT :'outcome500' AS outcome, token = :'tok500' AS token_is_the_records
  FROM idempotency.keys WHERE scope = 'acct_42' AND key = 'order-500';
SELECT idempotency.idem_complete('acct_42', 'order-500', :'tok500', 500, '{"error": "card processor down"}');
SELECT outcome, http_status, response_status, response_headers, response_body
  FROM idempotency.idem_claim('acct_42', 'order-500', 'fp-A');

-- An expired record is treated as absent. Claim and complete with a 10 ms ttl, in one
-- transaction so that both see the same now() ...
BEGIN;
SELECT outcome FROM idempotency.idem_claim('acct_42', 'short-lived', 'fp-A', ttl => '10 ms');
SELECT token AS tok_short FROM idempotency.keys WHERE scope = 'acct_42' AND key = 'short-lived' \gset
SELECT idempotency.idem_complete('acct_42', 'short-lived', :'tok_short', 200);
COMMIT;
SELECT pg_sleep(0.1);
-- ... then, once it expired, the key is claimed afresh: not replay, not mismatch (the old
-- fingerprint is gone with the record), attempts 1, a new token, nothing of the old response.
SELECT outcome, attempts, http_status, response_status, token <> :'tok_short' AS new_token
  FROM idempotency.idem_claim('acct_42', 'short-lived', 'fp-Z');
SELECT status, fingerprint, response_status, attempts FROM idempotency.keys
 WHERE scope = 'acct_42' AND key = 'short-lived';

-- Takeover. A worker claims a job with a 10 ms lease and records a checkpoint (renewing
-- the lease for another 10 ms), then dies.
BEGIN;
SELECT outcome FROM idempotency.idem_claim('acct_42', 'job-1', 'fp-J', lease => '10 ms');
SELECT token AS job_tok1 FROM idempotency.keys WHERE scope = 'acct_42' AND key = 'job-1' \gset
SELECT idempotency.idem_checkpoint('acct_42', 'job-1', :'job_tok1', 'charged', '{"charge_id": "ch_9"}',
       lease => '10 ms') = now() + interval '10 ms' AS lease_renewed;
COMMIT;
SELECT pg_sleep(0.1);
-- Even with its lease ended, the record still refuses another request: mismatch first.
SELECT outcome, http_status FROM idempotency.idem_claim('acct_42', 'job-1', 'fp-other');
-- The retry with the same fingerprint takes it over: reclaimed, attempts 2, a new token,
-- and the last checkpoint to resume from.
SELECT outcome, http_status, attempts, token <> :'job_tok1' AS new_token,
       recovery_point, recovery_data, locked_until = now() + interval '5 minutes' AS new_lease
  FROM idempotency.idem_claim('acct_42', 'job-1', 'fp-J');
SELECT token AS job_tok2 FROM idempotency.keys WHERE scope = 'acct_42' AND key = 'job-1' \gset
-- The new owner now holds a running lease, so the next retry is in_progress again.
SELECT outcome, http_status, attempts FROM idempotency.idem_claim('acct_42', 'job-1', 'fp-J');

-- Fencing: the old owner wakes up. Its token can no longer complete or checkpoint (IK002) ...
SELECT * FROM fixture.try(format($$ SELECT idempotency.idem_complete('acct_42', 'job-1', %L, 201) $$, :'job_tok1'));
SELECT * FROM fixture.try(format($$ SELECT idempotency.idem_checkpoint('acct_42', 'job-1', %L, 'shipped') $$, :'job_tok1'));
-- ... and cannot release the new owner's claim: idem_release answers false.
SELECT idempotency.idem_release('acct_42', 'job-1', :'job_tok1') AS released;
-- The new owner finishes; retries replay its response.
SELECT idempotency.idem_complete('acct_42', 'job-1', :'job_tok2', 201, '{"resumed_from": "charged"}');
SELECT outcome, http_status, response_body, attempts FROM idempotency.idem_claim('acct_42', 'job-1', 'fp-J');
