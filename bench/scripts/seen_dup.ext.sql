-- A duplicate delivery of a pre-populated message id ('s-<n>').
\set n random(1, :nkeys)
SELECT idempotency.idem_seen('orders-consumer', 's-' || :n::text);
