-- The floor of de-duplication: INSERT ... ON CONFLICT DO NOTHING (no expiry semantics).
\set k random(1, 9223372036854775806)
INSERT INTO processed_messages (scope, message_id, expires_at) VALUES ('orders-consumer', 'm-' || :k::text, now() + interval '24 hours') ON CONFLICT DO NOTHING;
