-- idem_seen: de-duplication for at-least-once message consumers. True the first time a
-- message id is seen in a scope (and recorded, in the caller's transaction), false after.

-- The first delivery is new; a redelivery of the same id is a duplicate.
SELECT idempotency.idem_seen('orders-consumer', 'msg-1') AS first_delivery;
SELECT idempotency.idem_seen('orders-consumer', 'msg-1') AS redelivery;
SELECT idempotency.idem_seen('orders-consumer', 'msg-1') AS redelivered_again;

-- Ids are per scope: the same id in another consumer's scope is new there.
SELECT idempotency.idem_seen('billing-consumer', 'msg-1') AS other_scope;
SELECT idempotency.idem_seen('orders-consumer', 'msg-2') AS other_id;
SELECT scope, message_id, expires_at = seen_at + interval '24 hours' AS ttl_24h
  FROM idempotency.messages WHERE scope LIKE '%-consumer' AND message_id IN ('msg-1', 'msg-2')
 ORDER BY scope, message_id;

-- The typical consumer: record the id and do the work in one transaction. When the work
-- fails and the transaction rolls back, the id is forgotten, so the redelivery runs.
BEGIN;
SELECT idempotency.idem_seen('orders-consumer', 'msg-3') AS first_delivery;
-- (the work fails here)
ROLLBACK;
SELECT idempotency.idem_seen('orders-consumer', 'msg-3') AS redelivery_is_new;
SELECT idempotency.idem_seen('orders-consumer', 'msg-3') AS now_a_duplicate;

-- A savepoint rolled back forgets the id as well.
BEGIN;
SAVEPOINT work;
SELECT idempotency.idem_seen('orders-consumer', 'msg-4') AS first_delivery;
ROLLBACK TO SAVEPOINT work;
SELECT idempotency.idem_seen('orders-consumer', 'msg-4') AS seen_again_is_new;
COMMIT;

-- A duplicate is answered from a read: no write, no transaction id.
BEGIN;
SELECT idempotency.idem_seen('orders-consumer', 'msg-1') AS duplicate;
SELECT txid_current_if_assigned() IS NULL AS no_xid;
COMMIT;

-- An id is remembered for ttl (default idempotency.default_ttl); once expired it counts as
-- never seen, whether or not idem_sweep deleted it, and is recorded afresh.
BEGIN;
SELECT idempotency.idem_seen('orders-consumer', 'msg-5', ttl => '10 ms') AS first_delivery;
SELECT idempotency.idem_seen('orders-consumer', 'msg-5', ttl => '10 ms') AS same_transaction_duplicate;
COMMIT;
SELECT pg_sleep(0.1);
SELECT count(*) AS expired_rows FROM idempotency.messages
 WHERE scope = 'orders-consumer' AND message_id = 'msg-5' AND expires_at <= now();
SELECT idempotency.idem_seen('orders-consumer', 'msg-5', ttl => '1 hour') AS expired_is_new;
SELECT idempotency.idem_seen('orders-consumer', 'msg-5') AS duplicate_again;
SELECT expires_at = seen_at + interval '1 hour' AS ttl_1h FROM idempotency.messages
 WHERE scope = 'orders-consumer' AND message_id = 'msg-5';

-- idem_seen and idem_claim keep separate books: a message id is not an idempotency key.
SELECT count(*) AS keys_in_scope FROM idempotency.keys WHERE scope = 'orders-consumer';
SELECT outcome FROM idempotency.idem_claim('orders-consumer', 'msg-1');
