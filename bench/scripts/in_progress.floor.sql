-- The raw floor's retry: the INSERT finds the key (no row returned), then a SELECT reads the
-- stored status and response. Two autocommit statements, as an application sends them.
\set n random(1, :nkeys)
INSERT INTO idempotency_keys (key, fingerprint, status, expires_at) VALUES ('p-' || :n::text, 'sha256:4f2d', 'in_progress', now() + interval '24 hours') ON CONFLICT (key) DO NOTHING RETURNING id;
SELECT status, fingerprint, response FROM idempotency_keys WHERE key = 'p-' || :n::text;
