-- Records in time partitions (0.6.0, docs/operations.md#partitions): idem_sweep makes a
-- partition per idempotency.partition_period ahead (to now() + default_ttl + two periods),
-- moves into each the records of the far partition that belong there, and drops a period
-- once every record in it expired (and, for keys, its tombstones ended): no row is deleted.
-- Here a period is 1 second and default_ttl 2 seconds, so that periods end while we watch.
SET search_path = idempotency, public;
SET idempotency.partition_period = '1 second';
SET idempotency.default_ttl = '2 seconds';
SELECT fixture.drop_periods() >= 0 AS periods_dropped;
TRUNCATE keys, messages;

-- Without periods every completed record goes to the far partition, claims in flight to
-- keys_claims.
SELECT token AS tok FROM idem_claim('parts', 'before', 'fp') \gset
SELECT tableoid::regclass AS partition, status FROM keys WHERE key = 'before';
SELECT idem_complete('parts', 'before', :'tok', 200);
SELECT tableoid::regclass AS partition, status FROM keys WHERE key = 'before';

-- The first sweep makes the periods: contiguous, 1 second each, from the current second to
-- past now() + default_ttl + two periods (the sweep's now(), after before_sweep); and the far
-- record of a period moves into it.
SELECT now() AS before_sweep \gset
SELECT idem_sweep() AS deleted;
SELECT count(*) >= 5 AS made_ahead,
       bool_and(upper_bound - lower_bound = interval '1 second') AS one_second_each,
       max(upper_bound) >= :'before_sweep'::timestamptz + interval '4 seconds' AS far_enough,
       min(lower_bound) <= now() AS from_now
  FROM partitions WHERE partition_name LIKE 'keys\_2%' ESCAPE '\';
SELECT count(*) = (SELECT count(*) FROM partitions WHERE partition_name LIKE 'keys\_2%' ESCAPE '\') AS messages_alike
  FROM partitions WHERE partition_name LIKE 'messages\_2%' ESCAPE '\';
SELECT tableoid::regclass::text ~ '^keys_\d{8}t\d{6}$' AS in_a_period, status FROM keys WHERE key = 'before';

-- A deferred claim's record is written once, into the period of its expiry; a record whose
-- expiry lies past the periods goes to the far partition; a message id to its period.
BEGIN;
SELECT token AS tok FROM idem_claim('parts', 'short', 'fp', deferred => true) \gset
SELECT idem_complete('parts', 'short', :'tok', 201);
COMMIT;
SELECT token AS tok FROM idem_claim('parts', 'long', 'fp', ttl => '10 seconds') \gset
SELECT idem_complete('parts', 'long', :'tok', 201);
SELECT idem_seen('parts', 'm-1') AS first_time;
SELECT key, tableoid::regclass::text ~ '^keys_\d{8}t\d{6}$' AS in_a_period,
       tableoid = 'keys_far'::regclass AS far
  FROM keys WHERE scope = 'parts' ORDER BY key;
SELECT tableoid::regclass::text ~ '^messages_\d{8}t\d{6}$' AS in_a_period FROM messages WHERE message_id = 'm-1';
-- Every answer reads the partitions alike.
SELECT key, (SELECT outcome FROM idem_claim('parts', key, 'fp')) AS outcome FROM keys WHERE scope = 'parts' ORDER BY key;
SELECT idem_seen('parts', 'm-1') AS first_time;

-- A longer default_ttl: the next sweep makes the periods out to it, and the far record
-- moves into its own (a move, not a copy: still one record).
SET idempotency.default_ttl = '12 seconds';
SELECT idem_sweep() AS deleted;
SELECT tableoid::regclass::text ~ '^keys_\d{8}t\d{6}$' AS in_a_period, count(*) OVER () AS records
  FROM keys WHERE key = 'long';
SET idempotency.default_ttl = '2 seconds';

-- Three seconds on, 'before', 'short' and 'm-1' have expired, and their periods are over:
-- the sweep drops them whole, deleting no row; 'long' stays, live.
SELECT pg_sleep(3);
-- 'short' is claimed again: its old record is in a period over, as good as gone.
SELECT outcome FROM idem_claim('parts', 'short', 'fp');
SELECT count(*) > 0 AS periods_over FROM partition_bounds('keys') WHERE lower_bound IS NOT NULL AND NOT is_default AND upper_bound <= now();
SELECT idem_sweep() AS deleted;
SELECT count(*) AS periods_over FROM partition_bounds('keys') WHERE lower_bound IS NOT NULL AND NOT is_default AND upper_bound <= now();
SELECT key, status FROM keys WHERE scope = 'parts' ORDER BY key;
SELECT count(*) AS message_ids FROM messages WHERE scope = 'parts';

-- With tombstones, a period is kept until its tombstones end: a completed record that
-- expired answers expired (410) from its period, and the sweep leaves the period (it
-- deletes only the claim of 'short', which expired in_progress).
SET idempotency.tombstone_ttl = '1 minute';
SELECT token AS tok FROM idem_claim('parts', 'kept', 'fp', ttl => '1 second') \gset
SELECT idem_complete('parts', 'kept', :'tok', 201, '{"id": "ch_k"}');
SELECT pg_sleep(2.5);
SELECT idem_sweep() AS deleted;
SELECT outcome, http_status, response_status, response_body FROM idem_claim('parts', 'kept', 'fp');
SELECT tableoid::regclass::text ~ '^keys_\d{8}t\d{6}$' AS still_in_its_period FROM keys WHERE key = 'kept';
RESET idempotency.tombstone_ttl;

-- Inside a transaction block the sweep leaves the partitions to the next sweep run alone
-- (ATTACH and DROP keep their locks until COMMIT), and says so when there is work for it.
SET idempotency.default_ttl = '20 seconds';
BEGIN;
SELECT idem_sweep() AS deleted;
COMMIT;
RESET idempotency.default_ttl;

-- partition_period 0: no new periods; every completed record past the periods goes to the
-- far partition, swept row by row (as before 0.6.0).
SET idempotency.partition_period = 0;
SELECT idem_sweep() AS deleted;
SELECT fixture.drop_periods() >= 0 AS periods_dropped;
SELECT token AS tok FROM idem_claim('parts', 'none', 'fp') \gset
SELECT idem_complete('parts', 'none', :'tok', 200);
SELECT tableoid::regclass AS partition FROM keys WHERE key = 'none';

-- Bad settings: 22023 naming the setting, nothing written. (A period has a fixed length:
-- no months.)
SELECT * FROM fixture.try($$ SET idempotency.partition_period = '1 month' $$);
SELECT * FROM fixture.try($$ SET idempotency.partition_period = '500 ms' $$);
RESET idempotency.partition_period;
TRUNCATE keys, messages;
