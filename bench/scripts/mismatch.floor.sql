-- The raw floor's retry with another fingerprint: the same two statements as its replay (the
-- INSERT finds the key, the SELECT reads status, fingerprint and response); the application
-- compares the fingerprint. Two autocommit statements, as an application sends them.
\set n random(1, :nkeys)
INSERT INTO idempotency_keys (key, fingerprint, status, expires_at) VALUES ('r-' || :n::text, 'sha256:9e1c', 'in_progress', now() + interval '24 hours') ON CONFLICT (key) DO NOTHING RETURNING id;
SELECT status, fingerprint, response FROM idempotency_keys WHERE key = 'r-' || :n::text;
