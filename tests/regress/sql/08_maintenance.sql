-- Housekeeping: idem_sweep deletes expired records, idem_reclaim_stale deals with claims
-- whose owner died, and the idempotency.stats view counts what there is.

-- Records kept row by row (no time partitions: idempotency.partition_period = 0), as
-- before 0.6.0, which is what this file shows; 22_partitions shows the periods.
SET idempotency.partition_period = 0;
SELECT fixture.drop_periods() >= 0 AS periods_dropped;

-- Start from empty tables, so that every count below is this file's own.
TRUNCATE idempotency.keys, idempotency.messages;
SELECT in_progress, completed, stale, expired, oldest_in_progress_age, messages, expired_messages
  FROM idempotency.stats;

-- Three records and two message ids that expire after 10 ms ...
BEGIN;
SELECT token AS tok FROM idempotency.idem_claim('maint', 'expired-done', ttl => '10 ms') \gset
SELECT idempotency.idem_complete('maint', 'expired-done', :'tok', 200);
SELECT outcome FROM idempotency.idem_claim('maint', 'expired-running', ttl => '10 ms');
SELECT outcome FROM idempotency.idem_claim('maint', 'expired-stale', ttl => '10 ms', lease => '10 ms');
SELECT idempotency.idem_seen('maint', 'm-old-1', ttl => '10 ms'), idempotency.idem_seen('maint', 'm-old-2', ttl => '10 ms');
COMMIT;
-- ... live records: one completed, one running under a 5 minute lease ...
SELECT token AS tok FROM idempotency.idem_claim('maint', 'live-done') \gset
SELECT idempotency.idem_complete('maint', 'live-done', :'tok', 201);
SELECT token AS running_tok FROM idempotency.idem_claim('maint', 'live-running') \gset
SELECT idempotency.idem_seen('maint', 'm-live');
-- ... and two live claims whose 10 ms leases will end (their owners "die"); the first
-- one recorded a checkpoint.
BEGIN;
SELECT token AS stale1_tok FROM idempotency.idem_claim('maint', 'stale-1', lease => '10 ms') \gset
SELECT idempotency.idem_checkpoint('maint', 'stale-1', :'stale1_tok', 'reserved', '{"items": 2}', lease => '10 ms') IS NOT NULL AS checkpointed;
COMMIT;
SELECT token AS stale2_tok FROM idempotency.idem_claim('maint', 'stale-2', lease => '10 ms') \gset
SELECT pg_sleep(0.1);

-- stats: live records by status (stale: in_progress whose lease ended), expired records
-- and message ids waiting for a sweep, and the age of the oldest in_progress claim.
SELECT in_progress, completed, stale, expired, oldest_in_progress_age > interval '0' AS has_oldest_age,
       messages, expired_messages
  FROM idempotency.stats;

-- idem_sweep deletes at most max_rows expired rows, keys first, and returns how many.
SELECT idempotency.idem_sweep(2) AS swept;
SELECT count(*) AS expired_keys_left FROM idempotency.keys WHERE expires_at <= now();
-- The budget is shared: the last expired key and one message id.
SELECT idempotency.idem_sweep(2) AS swept;
SELECT idempotency.idem_sweep() AS swept;
SELECT idempotency.idem_sweep() AS swept_when_nothing_expired;
-- Only expired rows went: every live record and message id is still there, the stale
-- claims included (their lease ended, but they have not expired).
SELECT key, status FROM idempotency.keys ORDER BY key;
SELECT message_id FROM idempotency.messages ORDER BY message_id;

-- idem_reclaim_stale(max_rows, release => true) deletes stale claims, oldest lease first,
-- and returns what they were: here stale-1, with its token, attempts and checkpoint.
SELECT scope, key, token = :'stale1_tok' AS its_token, attempts, recovery_point, recovery_data
  FROM idempotency.idem_reclaim_stale(1, release => true);
SELECT count(*) AS records FROM idempotency.idem_lookup('maint', 'stale-1');
-- The next retry of stale-1 starts fresh.
SELECT outcome, attempts, recovery_point FROM idempotency.idem_claim('maint', 'stale-1');

-- With release => false it takes each stale claim over instead: a new token, attempts + 1,
-- and a new lease (the lease argument, or default_lease), for a background completer.
SELECT scope, key, token <> :'stale2_tok' AS new_token, attempts, recovery_point
  FROM idempotency.idem_reclaim_stale(release => false, lease => '1 hour');
SELECT token AS new_tok FROM idempotency.keys WHERE scope = 'maint' AND key = 'stale-2' \gset
SELECT status, attempts, locked_until = updated_at + interval '1 hour' AS lease_1h
  FROM idempotency.idem_lookup('maint', 'stale-2');
-- A client retry now sees the completer's running lease: in_progress.
SELECT outcome, attempts FROM idempotency.idem_claim('maint', 'stale-2');
-- The old owner's token is fenced off (IK002); the new token completes.
SELECT * FROM fixture.try(format($$ SELECT idempotency.idem_complete('maint', 'stale-2', %L, 201) $$, :'stale2_tok'));
SELECT idempotency.idem_complete('maint', 'stale-2', :'new_tok', 201, '{"completed_by": "reclaimer"}');
SELECT outcome, http_status, response_body, attempts FROM idempotency.idem_claim('maint', 'stale-2');

-- A claim whose lease is still running is never touched: nothing is stale now.
SELECT count(*) AS reclaimed FROM idempotency.idem_reclaim_stale(release => true);
SELECT count(*) AS reclaimed FROM idempotency.idem_reclaim_stale(release => false);
SELECT status, attempts, token = :'running_tok' AS same_owner FROM idempotency.idem_lookup('maint', 'live-running');

-- Neither does it touch an expired claim (that is idem_sweep's): an expired claim whose
-- lease ended is not stale, and is not reclaimed.
BEGIN;
SELECT outcome FROM idempotency.idem_claim('maint', 'expired-again', ttl => '10 ms', lease => '10 ms');
COMMIT;
SELECT pg_sleep(0.1);
SELECT count(*) AS reclaimed FROM idempotency.idem_reclaim_stale();
SELECT stale, expired FROM idempotency.stats;

-- The final counts: live-done, stale-2 completed; live-running, stale-1 in progress.
SELECT in_progress, completed, stale, expired, messages, expired_messages FROM idempotency.stats;
SELECT idempotency.idem_sweep() AS swept;
SELECT count(*) AS keys, (SELECT count(*) FROM idempotency.messages) AS messages FROM idempotency.keys;
