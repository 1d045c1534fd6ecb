-- Committed first: the claim commits on its own (its in_progress record written into
-- keys_claims), then the complete commits on its own (the record moves to its period).
\set k random(1, 9223372036854775806)
SELECT token FROM idempotency.idem_claim('acct_42 POST /charges', 'n-' || :k::text, 'sha256:4f2d') \gset
SELECT idempotency.idem_complete('acct_42 POST /charges', 'n-' || :k::text, :token::uuid, 201, '{"id": "ch_1", "amount": 500, "currency": "usd"}'::jsonb, '{"Location": "/charges/ch_1"}'::jsonb);
