-- The limit: the bare prepared primary-key probe of a pre-populated message id ('s-<n>', as
-- in seen_dup.ext.sql) that idem_seen answers a duplicate from, and nothing else. Autocommit.
\set n random(1, :nkeys)
SELECT 1 FROM idempotency.messages WHERE scope = 'orders-consumer' AND message_id = 's-' || :n::text;
