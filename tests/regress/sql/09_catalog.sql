-- What CREATE EXTENSION installs: the schema, tables kept by pg_dump, indexes, and the
-- plans of the statements the functions run (they use those indexes).

-- Installed into schema idempotency, not relocatable.
SELECT extname, extnamespace::regnamespace AS schema, extrelocatable FROM pg_extension WHERE extname = 'idempotency';
-- Everything the extension owns. (Left out: array types, and the row types of its tables
-- and view, which come with them; PostgreSQL 18 lists those as members too, 15 does not.)
SELECT pg_describe_object(classid, objid, objsubid) AS object
  FROM pg_depend d
 WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempotency')
   AND NOT EXISTS (SELECT FROM pg_type t LEFT JOIN pg_class c ON c.oid = t.typrelid
                    WHERE d.classid = 'pg_type'::regclass AND t.oid = d.objid
                      AND (t.typcategory = 'A' OR c.relkind IN ('r', 'v')))
 ORDER BY 1;

-- Both tables are registered with pg_extension_config_dump, so pg_dump keeps their rows
-- (all of them: no filter condition).
SELECT extconfig::regclass[] AS config_tables, extcondition FROM pg_extension WHERE extname = 'idempotency';

-- Indexes: the primary keys, expiry for idem_sweep, and a partial index of in_progress
-- claims by end of lease for idem_reclaim_stale and idempotency.stats.
SELECT indexrelid::regclass AS index, indisprimary AS primary_key, pg_get_indexdef(indexrelid) AS definition
  FROM pg_index WHERE indrelid IN ('idempotency.keys'::regclass, 'idempotency.messages'::regclass)
 ORDER BY indexrelid::regclass::text;
-- The constraints besides NOT NULL (which PostgreSQL 18 lists here too): only the primary
-- key. The idem_* functions keep the rest of a record consistent (status is in_progress or
-- completed; locked_until is set exactly while in_progress, response_status exactly when
-- completed) without CHECK constraints, which PostgreSQL 15 would parse and plan again
-- for every INSERT and UPDATE.
SELECT conname, pg_get_constraintdef(oid) AS definition FROM pg_constraint
 WHERE conrelid = 'idempotency.keys'::regclass AND contype <> 'n' ORDER BY conname;

-- The plans. The functions prepare their statements once per session; below are the same
-- statements, prepared as generic plans ($1, $2 ... stay parameters). On tables this small
-- the planner would rather read the whole table, so sequential scans are switched off to
-- show which index each statement can use.
SET plan_cache_mode = force_generic_plan;
SET enable_seqscan = off;

-- idem_claim's read (and idem_complete's diagnosis) finds (scope, key) through the primary key.
PREPARE claim_read(text, text) AS
SELECT fingerprint, status, token, attempts, locked_until, expires_at, response_status, response_headers, response_body
  FROM idempotency.keys WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2;
EXPLAIN (COSTS OFF) EXECUTE claim_read('acct_42', 'order-1');

-- idem_lookup: the primary key, and the expiry test on the row found.
PREPARE lookup(text, text, timestamptz) AS
SELECT k FROM idempotency.keys AS k
 WHERE k.scope OPERATOR(pg_catalog.=) $1 AND k.key OPERATOR(pg_catalog.=) $2 AND k.expires_at OPERATOR(pg_catalog.>) $3;
EXPLAIN (COSTS OFF) EXECUTE lookup('acct_42', 'order-1', now());

-- idem_sweep picks expired keys, oldest first, through keys_expires_at_idx, skipping rows
-- that other transactions hold locked (it then deletes the rows it picked).
PREPARE sweep_keys(timestamptz, bigint) AS
SELECT scope, key FROM idempotency.keys WHERE expires_at OPERATOR(pg_catalog.<=) $1
 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED;
EXPLAIN (COSTS OFF) EXECUTE sweep_keys(now(), 10000);

-- ... and expired message ids through messages_expires_at_idx.
PREPARE sweep_messages(timestamptz, bigint) AS
SELECT scope, message_id FROM idempotency.messages WHERE expires_at OPERATOR(pg_catalog.<=) $1
 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED;
EXPLAIN (COSTS OFF) EXECUTE sweep_messages(now(), 10000);

-- idem_reclaim_stale: in_progress claims whose lease ended, oldest lease first, through
-- the partial index keys_in_progress_idx.
PREPARE stale(timestamptz, bigint) AS
SELECT scope, key, token, attempts FROM idempotency.keys
 WHERE status OPERATOR(pg_catalog.=) 'in_progress' AND locked_until OPERATOR(pg_catalog.<=) $1
   AND expires_at OPERATOR(pg_catalog.>) $1
 ORDER BY locked_until LIMIT $2 FOR UPDATE SKIP LOCKED;
EXPLAIN (COSTS OFF) EXECUTE stale(now(), 1000);

-- idem_complete's fenced UPDATE finds the row through the primary key. (Its WHERE names
-- status = 'in_progress' but not the lease, so the partial index keys_in_progress_idx,
-- whose predicate also says locked_until IS NOT NULL, cannot be chosen for it: on a big
-- table that index holds every claim in flight.)
PREPARE complete(text, text, uuid, int, jsonb, jsonb, timestamptz) AS
UPDATE idempotency.keys
   SET status = 'completed', locked_until = NULL, response_status = $4,
       response_headers = $5, response_body = $6, completed_at = $7, updated_at = $7
 WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2
   AND token OPERATOR(pg_catalog.=) $3 AND status OPERATOR(pg_catalog.=) 'in_progress'
   AND expires_at OPERATOR(pg_catalog.>) $7;
EXPLAIN (COSTS OFF) EXECUTE complete('acct_42', 'order-1', gen_random_uuid(), 201, NULL, NULL, now());

-- idem_seen's read: the messages primary key.
PREPARE seen_read(text, text) AS
SELECT expires_at FROM idempotency.messages
 WHERE scope OPERATOR(pg_catalog.=) $1 AND message_id OPERATOR(pg_catalog.=) $2;
EXPLAIN (COSTS OFF) EXECUTE seen_read('consumer', 'msg-1');

-- idem_seen_many's read: one lookup through the messages primary key per id of the batch.
PREPARE seen_many_read(text, text[], timestamptz) AS
SELECT id AS message_id FROM pg_catalog.unnest($2) AS id
 WHERE (SELECT m.expires_at FROM idempotency.messages AS m
         WHERE m.scope OPERATOR(pg_catalog.=) $1 AND m.message_id OPERATOR(pg_catalog.=) id)
       OPERATOR(pg_catalog.>) $3;
EXPLAIN (COSTS OFF) EXECUTE seen_many_read('consumer', ARRAY['msg-1', 'msg-2'], now());

-- The sweep with tombstones on picks the expired records that still hold a response
-- through keys_responses_idx, so it never steps over the tombstones it already made ...
PREPARE make_tombstones(timestamptz, bigint) AS
SELECT scope, key FROM idempotency.keys
 WHERE (response_body IS NOT NULL OR response_headers IS NOT NULL)
   AND expires_at OPERATOR(pg_catalog.<=) $1
 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED;
EXPLAIN (COSTS OFF) EXECUTE make_tombstones(now(), 10000);
-- ... and the claims that expired in_progress through keys_in_progress_idx.
PREPARE expired_claims(timestamptz, bigint) AS
SELECT scope, key FROM idempotency.keys
 WHERE status OPERATOR(pg_catalog.=) 'in_progress' AND locked_until IS NOT NULL
   AND expires_at OPERATOR(pg_catalog.<=) $1
 ORDER BY locked_until LIMIT $2 FOR UPDATE SKIP LOCKED;
EXPLAIN (COSTS OFF) EXECUTE expired_claims(now(), 10000);
-- (idempotency.stats' plan: 12_stats_plan.)

RESET enable_seqscan;
RESET plan_cache_mode;
