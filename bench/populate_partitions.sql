-- bench/run.sh's scenario "partitions" (issue 35: a fresh claim + complete with 3 live
-- partitions against 1): in a fresh database whose idempotency.partition_period is 8 hours,
-- the periods made (idem_sweep), then :n completed records of the bench's scope, keys like
-- uuids, all expiring with the new records (in 24 hours: the period they go to) when :spread
-- is 1, or a third of them each in that period and the two before it (in 24, 16 and 8 hours)
-- when :spread is 3. psql -v spread=1|3 -v n=N
\set ON_ERROR_STOP 1
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
SELECT idempotency.idem_sweep();
INSERT INTO idempotency.keys
    (scope, key, fingerprint, status, token, attempts, response_status, response_headers,
     response_body, created_at, updated_at, completed_at, expires_at)
SELECT 'acct_42 POST /charges', md5(i::text)::uuid::text, 'sha256:4f2d', 'completed', gen_random_uuid(), 1, 201,
       '{"Location": "/charges/ch_1"}'::jsonb, '{"id": "ch_1", "amount": 500, "currency": "usd"}'::jsonb,
       now(), now(), now(), now() + interval '24 hours' - (i % :spread) * interval '8 hours'
  FROM generate_series(1, :n) AS i;
VACUUM ANALYZE;
-- The periods and how many records each holds.
SELECT partition_name, lower_bound, upper_bound, estimated_rows FROM idempotency.partitions
 WHERE partition_name LIKE 'idempotency.keys%' ORDER BY lower_bound NULLS FIRST;
