-- idem_seen_many(scope, message_ids, ttl): idem_seen for a batch, in one call. Element i is
-- true when message_ids[i] is seen for the first time; an id repeated inside the batch is
-- true only at its first position. Recorded in the caller's transaction like idem_seen.

SELECT idempotency.idem_seen_many('batch-consumer', ARRAY['m1', 'm2', 'm1', 'm3']) AS first_batch;
-- A redelivered batch, partly new.
SELECT idempotency.idem_seen_many('batch-consumer', ARRAY['m3', 'm4', 'm2', 'm4']) AS second_batch;
-- idem_seen and idem_seen_many share the same log.
SELECT idempotency.idem_seen('batch-consumer', 'm4') AS m4_again, idempotency.idem_seen('batch-consumer', 'm5') AS m5_new;
SELECT idempotency.idem_seen_many('batch-consumer', ARRAY['m5', 'm6']) AS third_batch;
-- An empty batch gives an empty array.
SELECT idempotency.idem_seen_many('batch-consumer', ARRAY[]::text[]) AS empty_batch;
-- ttl (default idempotency.default_ttl) sets expires_at, as for idem_seen.
SELECT idempotency.idem_seen_many('batch-consumer', ARRAY['m7'], ttl => '1 hour') AS with_ttl;
SELECT message_id, expires_at = seen_at + interval '1 hour' AS ttl_1h FROM idempotency.messages
 WHERE scope = 'batch-consumer' AND message_id = 'm7';

-- A batch of duplicates is answered from a read: nothing written, no transaction id.
BEGIN;
SELECT idempotency.idem_seen_many('batch-consumer', ARRAY['m1', 'm2', 'm3']) AS duplicates;
SELECT txid_current_if_assigned() IS NULL AS no_xid;
COMMIT;

-- Rolled back with the caller's transaction: the ids are forgotten.
BEGIN;
SELECT idempotency.idem_seen_many('batch-consumer', ARRAY['m8', 'm9']) AS in_rolled_back_txn;
ROLLBACK;
SELECT idempotency.idem_seen_many('batch-consumer', ARRAY['m9', 'm8']) AS after_rollback;

-- Expired ids count as never seen.
UPDATE idempotency.messages SET expires_at = now() - interval '1 second'
 WHERE scope = 'batch-consumer' AND message_id = 'm1';
SELECT idempotency.idem_seen_many('batch-consumer', ARRAY['m1', 'm2']) AS after_expiry;

-- Bad input: a NULL array or scope (22004), a NULL element (22004, naming its position),
-- a bad id or ttl (22023), more than 10,000 ids (22023). Nothing is written.
SELECT * FROM fixture.cases(
    'null array', $$SELECT idempotency.idem_seen_many('batch-consumer', NULL)$$,
    'null scope', $$SELECT idempotency.idem_seen_many(NULL, ARRAY['x1'])$$,
    'null element', $$SELECT idempotency.idem_seen_many('batch-consumer', ARRAY['x1', NULL, 'x2'])$$,
    'empty id', $$SELECT idempotency.idem_seen_many('batch-consumer', ARRAY['x1', ''])$$,
    'control character', $$SELECT idempotency.idem_seen_many('batch-consumer', ARRAY[E'x\n1'])$$,
    'zero ttl', $$SELECT idempotency.idem_seen_many('batch-consumer', ARRAY['x1'], ttl => '0')$$,
    '10,001 ids', $$SELECT idempotency.idem_seen_many('batch-consumer', array_agg('x' || i)) FROM generate_series(1, 10001) i$$);
-- 10,000 ids is the limit, and fine.
SELECT cardinality(idempotency.idem_seen_many('batch-big', array_agg('x' || i))) AS answers
  FROM generate_series(1, 10000) i;
SELECT count(*) AS recorded FROM idempotency.messages WHERE scope = 'batch-big';
DELETE FROM idempotency.messages WHERE scope IN ('batch-consumer', 'batch-big');
