-- The floor's duplicate: the INSERT finds the id and does nothing.
\set n random(1, :nkeys)
INSERT INTO processed_messages (scope, message_id, expires_at) VALUES ('orders-consumer', 's-' || :n::text, now() + interval '24 hours') ON CONFLICT DO NOTHING;
