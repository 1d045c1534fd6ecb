-- A fresh claim and its complete in one transaction (random 63-bit keys never repeat).
\set k random(1, 9223372036854775806)
BEGIN;
SELECT token FROM peer.claim('acct_42 POST /charges', 'n-' || :k::text, 'sha256:4f2d') \gset
SELECT peer.complete('acct_42 POST /charges', 'n-' || :k::text, :token::uuid, 201, '{"id": "ch_1", "amount": 500, "currency": "usd"}'::jsonb, '{"Location": "/charges/ch_1"}'::jsonb);
COMMIT;
