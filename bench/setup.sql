-- Everything bench/run.sh needs in its database, besides bench/plpgsql_peer.sql:
-- the extension, the raw SQL floor, and the documents for the fingerprint scenarios.
-- psql -v nkeys=N: how many pre-populated records / message ids each implementation gets
-- for the replay, in_progress and duplicate-message scenarios.
\set ON_ERROR_STOP 1
SET client_min_messages = warning;

CREATE EXTENSION IF NOT EXISTS idempotency;
-- Since 0.6.0 the completed records go to time partitions, which idem_sweep makes (as the
-- scheduled sweep does); before the first sweep they all go to the far partition.
SELECT idempotency.idem_sweep();

-- The raw SQL floor of the usual article: claimed with INSERT ... ON CONFLICT (key) DO NOTHING
-- RETURNING id, completed with an UPDATE. No scope, no token, no lease, no fencing.
DROP TABLE IF EXISTS idempotency_keys, processed_messages;
CREATE TABLE idempotency_keys (
    id          bigserial PRIMARY KEY,
    key         text UNIQUE,
    fingerprint text,
    status      text,
    response    jsonb,
    expires_at  timestamptz
);
-- The floor of message de-duplication: INSERT ... ON CONFLICT DO NOTHING.
CREATE TABLE processed_messages (
    scope      text,
    message_id text,
    expires_at timestamptz,
    PRIMARY KEY (scope, message_id)
);

-- Eight documents of about 1 KB (ids 1-8) and eight of about 64 KB (ids 101-108): objects of
-- strings, numbers, booleans, nested objects and arrays, keys not in sorted order. Stored
-- uncompressed out of line (STORAGE EXTERNAL) so that reading them costs little and the
-- same for every implementation.
DROP TABLE IF EXISTS bench_docs;
CREATE TABLE bench_docs (id int PRIMARY KEY, doc jsonb NOT NULL);
ALTER TABLE bench_docs ALTER COLUMN doc SET STORAGE EXTERNAL;
INSERT INTO bench_docs
SELECT d.id,
       (SELECT jsonb_object_agg(
                   'field_' || md5(d.id::text || ':' || i::text),
                   CASE i % 5
                       WHEN 0 THEN to_jsonb(md5(i::text) || ' ünïcode ' || i)
                       WHEN 1 THEN to_jsonb(i * 1234.5678)
                       WHEN 2 THEN to_jsonb(i % 2 = 0)
                       WHEN 3 THEN jsonb_build_object('id', i, 'name', 'item ' || i, 'tags', jsonb_build_array('a', 'b', i))
                       ELSE jsonb_build_array(i, i + 0.5, 'x' || i, NULL)
                   END)
          FROM generate_series(1, d.n) AS i)
  FROM (VALUES (1, 15), (2, 15), (3, 15), (4, 15), (5, 15), (6, 15), (7, 15), (8, 15),
               (101, 904), (102, 904), (103, 904), (104, 904),
               (105, 904), (106, 904), (107, 904), (108, 904)) AS d(id, n);

-- Pre-populated records. Keys 'r-<i>': completed (replay); 'p-<i>': in_progress with a
-- one-year lease (in_progress). Message ids 's-<i>': already seen. Through each
-- implementation's own functions, so the rows are what they would write: first the claims,
-- then ANALYZE, then the completes. (Completing in the same statement as the claims is
-- quadratic: on a table without statistics the planner runs the complete's UPDATE through
-- keys_in_progress_idx, and inside one transaction that index keeps every claimed row.)
-- The extension's claims, completes and message ids in transactions of 2,000: since 0.6.0 each
-- new one holds its key's lock until its transaction ends, and the lock table holds some
-- thousands (max_locks_per_transaction).
\set batch 2000
SELECT format('SELECT count(*) FROM (SELECT idempotency.idem_claim(''acct_42 POST /charges'', p || i, ''sha256:4f2d'', ''10 years'', ''1 year'') FROM generate_series(%s, %s) AS i, (VALUES (''r-''), (''p-'')) AS v(p)) AS x',
              b, least(b + :batch / 2 - 1, :nkeys))
  FROM generate_series(1, :nkeys, :batch / 2) AS b \gexec
SELECT count(*) FROM (
    SELECT peer.claim('acct_42 POST /charges', p || i, 'sha256:4f2d', '10 years', '1 year')
      FROM generate_series(1, :nkeys) AS i, (VALUES ('r-'), ('p-')) AS v(p)) AS x;
ANALYZE idempotency.keys;
ANALYZE peer.keys;
SELECT format('SELECT count(*) FROM (SELECT idempotency.idem_complete(scope, key, token, 201, ''{"id": "ch_1", "amount": 500, "currency": "usd"}'', ''{"Location": "/charges/ch_1"}'') FROM idempotency.keys WHERE scope = ''acct_42 POST /charges'' AND key IN (SELECT ''r-'' || i FROM generate_series(%s, %s) AS i)) AS x',
              b, least(b + :batch - 1, :nkeys))
  FROM generate_series(1, :nkeys, :batch) AS b \gexec
SELECT count(*) FROM (
    SELECT peer.complete(scope, key, token, 201,
               '{"id": "ch_1", "amount": 500, "currency": "usd"}', '{"Location": "/charges/ch_1"}')
      FROM peer.keys WHERE key LIKE 'r-%') AS x;
SELECT format('SELECT count(*) FROM (SELECT idempotency.idem_seen(''orders-consumer'', ''s-'' || i, ''10 years'') FROM generate_series(%s, %s) AS i) AS x',
              b, least(b + :batch - 1, :nkeys))
  FROM generate_series(1, :nkeys, :batch) AS b \gexec
SELECT count(*) FROM (
    SELECT peer.seen('orders-consumer', 's-' || i, '10 years')
      FROM generate_series(1, :nkeys) AS i) AS x;

INSERT INTO idempotency_keys (key, fingerprint, status, response, expires_at)
SELECT 'r-' || i, 'sha256:4f2d', 'completed',
       '{"status": 201, "headers": {"Location": "/charges/ch_1"}, "body": {"id": "ch_1", "amount": 500, "currency": "usd"}}',
       now() + interval '10 years'
  FROM generate_series(1, :nkeys) AS i;
INSERT INTO idempotency_keys (key, fingerprint, status, expires_at)
SELECT 'p-' || i, 'sha256:4f2d', 'in_progress', now() + interval '10 years'
  FROM generate_series(1, :nkeys) AS i;
INSERT INTO processed_messages (scope, message_id, expires_at)
SELECT 'orders-consumer', 's-' || i, now() + interval '10 years'
  FROM generate_series(1, :nkeys) AS i;

VACUUM ANALYZE;
SELECT id, length(doc::text) AS text_bytes, pg_column_size(doc) AS stored_bytes FROM bench_docs ORDER BY id;
