-- A five-minute tour of the idempotency extension, run by scripts/setup.sh.
\pset footer off
SET search_path = idempotency, public;

\echo '1. A request arrives with Idempotency-Key k-1001: claim it (no live record -> claimed).'
SELECT outcome, token IS NOT NULL AS got_token, attempts
FROM idem_claim('acct_42:POST /charges', 'k-1001', idem_fingerprint('{"amount": 500}'::jsonb));

\echo '2. A retry arrives while the first is still running -> in_progress, answer 409.'
SELECT outcome, http_status
FROM idem_claim('acct_42:POST /charges', 'k-1001', idem_fingerprint('{"amount": 500}'::jsonb));

\echo '3. The same key reused for another body -> mismatch, answer 422.'
SELECT outcome, http_status
FROM idem_claim('acct_42:POST /charges', 'k-1001', idem_fingerprint('{"amount": 999}'::jsonb));

\echo '4. The first request finishes and stores its response.'
SELECT idem_complete('acct_42:POST /charges', 'k-1001', token, 201,
                     '{"id": "ch_1", "amount": 500}', '{"Location": "/charges/ch_1"}')
FROM keys WHERE scope = 'acct_42:POST /charges' AND key = 'k-1001';

\echo '5. Every later retry gets the stored response (replay), and runs nothing.'
SELECT outcome, http_status, response_body, response_headers
FROM idem_claim('acct_42:POST /charges', 'k-1001', idem_fingerprint('{"amount": 500}'::jsonb));

\echo '6. A message consumer de-duplicates deliveries.'
SELECT idem_seen('orders-consumer', 'msg-77') AS first_delivery,
       idem_seen('orders-consumer', 'msg-77') AS redelivery;

\echo '7. What an operator watches.'
SELECT in_progress, completed, stale, expired FROM stats;
