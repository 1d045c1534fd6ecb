-- For big backlogs and for scheduling: idem_sweep_all sweeps in batches with a COMMIT
-- after each, and schedule_maintenance puts the sweep and the stale-claim release on
-- pg_cron (tested for real, with pg_cron running, by tests/pg_cron/run.sh).

TRUNCATE idempotency.keys, idempotency.messages;

-- A backlog of 25 expired records and 5 expired message ids, and 3 live records.
INSERT INTO idempotency.keys (scope, key, status, token, response_status, created_at, updated_at, expires_at)
SELECT 'jobs', 'old-' || i, 'completed', gen_random_uuid(), 200,
       now() - interval '2 days', now() - interval '2 days', now() - interval '1 day'
  FROM generate_series(1, 25) AS i;
INSERT INTO idempotency.messages (scope, message_id, seen_at, expires_at)
SELECT 'jobs', 'msg-' || i, now() - interval '2 days', now() - interval '1 day'
  FROM generate_series(1, 5) AS i;
SELECT (idempotency.idem_claim('jobs', 'live-' || i)).outcome FROM generate_series(1, 3) AS i;
SELECT expired, expired_messages, in_progress FROM idempotency.stats;

-- Batches of 7: 7 + 7 + 7 + 7 (4 records and 3 message ids) + 2, committing after each
-- batch; it stops at the first batch that finds fewer than 7.
CALL idempotency.idem_sweep_all(7);
SELECT expired, expired_messages, in_progress FROM idempotency.stats;

-- `pause` is how long it sleeps after each full batch. By default it sweeps in short
-- bursts, 200 rows and a 4 ms pause, so that it slows the claims running beside it less;
-- idem_sweep_all(10000, '0') is as fast as it goes. A negative pause, one over an hour, or
-- NULL is refused (22023) before anything is deleted.
SELECT pg_get_function_arguments('idempotency.idem_sweep_all'::regproc) AS arguments;
INSERT INTO idempotency.keys (scope, key, status, token, response_status, created_at, updated_at, expires_at)
SELECT 'jobs', 'old-' || i, 'completed', gen_random_uuid(), 200,
       now() - interval '2 days', now() - interval '2 days', now() - interval '1 day'
  FROM generate_series(1, 4) AS i;
\set SHOW_CONTEXT never
CALL idempotency.idem_sweep_all(2, interval '-1 second');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
CALL idempotency.idem_sweep_all(2, interval '2 hours');
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
CALL idempotency.idem_sweep_all(2, NULL);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
\set SHOW_CONTEXT errors
SELECT expired FROM idempotency.stats;
CALL idempotency.idem_sweep_all(2, interval '1 millisecond');
SELECT expired, in_progress FROM idempotency.stats;

-- It commits, so it cannot run inside a transaction block.
BEGIN;
CALL idempotency.idem_sweep_all();
ROLLBACK;
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;

-- Without pg_cron in this database, scheduling fails with a clear error (55000) and a hint.
\set SHOW_CONTEXT never
SELECT * FROM idempotency.schedule_maintenance();
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
