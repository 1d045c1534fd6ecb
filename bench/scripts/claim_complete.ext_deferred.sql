-- The same-transaction path (0.6.0): a fresh claim held without a write (deferred => true),
-- then its complete, which INSERTs the completed record once; one transaction.
\set k random(1, 9223372036854775806)
BEGIN;
SELECT token FROM idempotency.idem_claim('acct_42 POST /charges', 'n-' || :k::text, 'sha256:4f2d', deferred => true) \gset
SELECT idempotency.idem_complete('acct_42 POST /charges', 'n-' || :k::text, :token::uuid, 201, '{"id": "ch_1", "amount": 500, "currency": "usd"}'::jsonb, '{"Location": "/charges/ch_1"}'::jsonb);
COMMIT;
