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

\echo '8. The sending side: an order and its charge, with the charge''s key, in one transaction.'
CREATE TABLE demo_orders (id text PRIMARY KEY, amount int NOT NULL, payment_key text);
BEGIN;
INSERT INTO demo_orders (id, amount) VALUES ('order-42', 500);
UPDATE demo_orders SET payment_key = (SELECT key FROM idem_send('shop', 'order-42:charge', 'payments-gateway',
                                                              '{"order": "order-42", "amount": 500}'))
 WHERE id = 'order-42';
COMMIT;
SELECT state, attempts, key = (SELECT payment_key FROM demo_orders) AS key_kept_with_the_order
FROM outbound WHERE operation = 'order-42:charge';

\echo '9. A sender takes the due send: a lease and a fencing token for this attempt.'
SELECT operation, attempt, token AS send_token FROM idem_send_next('payments-gateway', 10, '30 seconds') \gset
\echo :operation 'attempt' :attempt

\echo '10. It POSTs the request with Idempotency-Key: <key>; the gateway answers 201: recorded.'
SELECT state, attempts FROM idem_send_result('shop', 'order-42:charge', :'send_token', 201, '{"id": "ch_42"}');

\echo '11. The recorded answer, kept with the send (a retry of the operation would reuse the key).'
SELECT state, attempts, response_status, response_body FROM outbound WHERE operation = 'order-42:charge';
