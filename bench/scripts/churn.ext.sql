-- bench/expiry.sh's high-churn workload: a fresh claim with a short ttl (-D ttl=60s) and its
-- complete, in one transaction; the records expire during the run and the sweeps delete them.
\set k random(1, 9223372036854775806)
BEGIN;
SELECT token FROM idempotency.idem_claim('acct_42 POST /charges', 'n-' || :k::text, 'sha256:4f2d', :ttl::interval) \gset
SELECT idempotency.idem_complete('acct_42 POST /charges', 'n-' || :k::text, :token::uuid, 201, '{"id": "ch_1", "amount": 500, "currency": "usd"}'::jsonb, '{"Location": "/charges/ch_1"}'::jsonb);
COMMIT;
