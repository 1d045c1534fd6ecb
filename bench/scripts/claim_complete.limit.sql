-- The limit of a fresh request (issue 34): the request's transaction with one bare INSERT of
-- the same completed row the extension writes (scope, key, fingerprint, token, the response,
-- expiry in 24 hours) into idempotency.keys, routed to its period like the extension's; no
-- look-up, no lock. The same BEGIN and COMMIT as the ext scripts: the application's own
-- transaction, which holds its business writes.
\set k random(1, 9223372036854775806)
BEGIN;
INSERT INTO idempotency.keys (scope, key, fingerprint, status, token, attempts, response_status, response_headers, response_body, created_at, updated_at, completed_at, expires_at) VALUES ('acct_42 POST /charges', 'n-' || :k::text, 'sha256:4f2d', 'completed', gen_random_uuid(), 1, 201, '{"Location": "/charges/ch_1"}'::jsonb, '{"id": "ch_1", "amount": 500, "currency": "usd"}'::jsonb, now(), now(), now(), now() + interval '24 hours');
COMMIT;
