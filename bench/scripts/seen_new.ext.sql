-- A message id never seen before (random 63-bit ids).
\set k random(1, 9223372036854775806)
SELECT idempotency.idem_seen('orders-consumer', 'm-' || :k::text);
