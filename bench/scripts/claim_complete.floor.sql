-- The raw floor: INSERT ... ON CONFLICT (key) DO NOTHING RETURNING id, then an UPDATE by id.
\set k random(1, 9223372036854775806)
BEGIN;
INSERT INTO idempotency_keys (key, fingerprint, status, expires_at) VALUES ('n-' || :k::text, 'sha256:4f2d', 'in_progress', now() + interval '24 hours') ON CONFLICT (key) DO NOTHING RETURNING id \gset
UPDATE idempotency_keys SET status = 'completed', response = '{"status": 201, "headers": {"Location": "/charges/ch_1"}, "body": {"id": "ch_1", "amount": 500, "currency": "usd"}}' WHERE id = :id;
COMMIT;
