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
                      AND (t.typcategory = 'A' OR c.relkind IN ('r', 'p', 'v')))
 ORDER BY 1;

-- The extension's own partitions are registered with pg_extension_config_dump, so pg_dump
-- keeps their rows (all of them: no filter condition); the periods idem_sweep makes are
-- tables of their own to pg_dump, which keeps them and their rows anyway.
SELECT extconfig::regclass[] AS config_tables, extcondition FROM pg_extension WHERE extname = 'idempotency';

-- The partitions (0.6.0): claims in flight, and completed records past the periods (the
-- default partition) of keys; message ids past the periods. (The periods themselves come
-- from idem_sweep: 22_partitions.)
SELECT c.oid::regclass AS partition, pg_get_expr(c.relpartbound, c.oid) AS bounds
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent IN ('idempotency.keys'::regclass, 'idempotency.messages'::regclass)
   AND c.relname IN ('keys_claims', 'keys_far', 'messages_far')
 ORDER BY 1::text;
SELECT pg_get_partkeydef('idempotency.keys'::regclass) AS keys_partitioned_by,
       pg_get_partkeydef('idempotency.messages'::regclass) AS messages_partitioned_by;

-- Indexes: each partition's primary key (the tables themselves have none: (scope, key) is
-- kept unique across partitions by the key lock, docs/reliability.md#the-key-lock), expiry
-- for idem_sweep where it deletes row by row, and a partial index of in_progress claims by
-- end of lease for idem_reclaim_stale and idempotency.stats.
SELECT indexrelid::regclass AS index, indisprimary AS primary_key, pg_get_indexdef(indexrelid) AS definition
  FROM pg_index WHERE indrelid IN ('idempotency.keys_claims'::regclass, 'idempotency.keys_far'::regclass,
                                   'idempotency.messages_far'::regclass)
 ORDER BY indexrelid::regclass::text;
-- The constraints besides NOT NULL (which PostgreSQL 18 lists here too): only the primary
-- keys. The idem_* functions keep the rest of a record consistent (status is in_progress or
-- completed; locked_until is set exactly while in_progress, response_status exactly when
-- completed) without CHECK constraints, which PostgreSQL 15 would parse and plan again
-- for every INSERT and UPDATE.
SELECT conrelid::regclass AS partition, conname, pg_get_constraintdef(oid) AS definition FROM pg_constraint
 WHERE conrelid IN ('idempotency.keys'::regclass, 'idempotency.keys_claims'::regclass,
                    'idempotency.keys_far'::regclass, 'idempotency.messages'::regclass,
                    'idempotency.messages_far'::regclass)
   AND contype <> 'n' ORDER BY 1::text, conname;

-- The plans. The functions prepare their statements once per session; below are the same
-- statements, prepared as generic plans ($1, $2 ... stay parameters). On tables this small
-- the planner would rather read the whole table, so sequential scans are switched off to
-- show which index each statement can use. Two periods of keys and one of messages, far in
-- the future so that no record of the other tests goes there, stand for the ones idem_sweep
-- makes; the statements that mean claims in flight, or records past the periods, name the
-- partition key (a CASE expression for keys), and the planner reads only those partitions.
SELECT fixture.drop_periods() >= 0 AS periods_dropped;
CREATE TABLE idempotency.keys_21000101t000000 PARTITION OF idempotency.keys (PRIMARY KEY (scope, key))
    FOR VALUES FROM ('2100-01-01 00:00:00+00') TO ('2100-01-02 00:00:00+00');
CREATE TABLE idempotency.keys_21000102t000000 PARTITION OF idempotency.keys (PRIMARY KEY (scope, key))
    FOR VALUES FROM ('2100-01-02 00:00:00+00') TO ('2100-01-03 00:00:00+00');
CREATE TABLE idempotency.messages_21000101t000000 PARTITION OF idempotency.messages (PRIMARY KEY (scope, message_id))
    FOR VALUES FROM ('2100-01-01 00:00:00+00') TO ('2100-01-02 00:00:00+00');
SET plan_cache_mode = force_generic_plan;
SET enable_seqscan = off;
SET enable_bitmapscan = off;

-- idem_claim's read (and idem_complete's diagnosis) finds (scope, key) through the primary
-- key of every partition (a partition about to be dropped may still hold an older, expired
-- record of the key: the latest expiry is the record).
PREPARE claim_read(text, text) AS
SELECT fingerprint, status, token, attempts, locked_until, expires_at, response_status,
       response_headers, response_body, recovery_point, recovery_data
  FROM idempotency.keys WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2
 ORDER BY expires_at DESC LIMIT 1;
EXPLAIN (COSTS OFF) EXECUTE claim_read('acct_42', 'order-1');

-- idem_lookup: the primary keys, and the expiry test on the row found.
PREPARE lookup(text, text, timestamptz) AS
SELECT k FROM idempotency.keys AS k
 WHERE k.scope OPERATOR(pg_catalog.=) $1 AND k.key OPERATOR(pg_catalog.=) $2 AND k.expires_at OPERATOR(pg_catalog.>) $3;
EXPLAIN (COSTS OFF) EXECUTE lookup('acct_42', 'order-1', now());

-- idem_sweep deletes row by row only claims that expired and records past the periods,
-- picking them oldest first through keys_claims_expires_at_idx and keys_far_expires_at_idx,
-- skipping rows that other transactions hold locked (it then deletes the rows it picked);
-- $3 and $4, the earliest and the latest bound of the periods, keep it out of them (and
-- 1970, the upper bound of the claims' partition, out of that one).
PREPARE sweep_claims(timestamptz, bigint) AS
SELECT scope, key FROM idempotency.keys
 WHERE (CASE WHEN status OPERATOR(pg_catalog.=) 'completed' THEN expires_at ELSE '-infinity'::pg_catalog.timestamptz END)
       OPERATOR(pg_catalog.=) '-infinity'::pg_catalog.timestamptz
   AND expires_at OPERATOR(pg_catalog.<=) $1
 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED;
EXPLAIN (COSTS OFF) EXECUTE sweep_claims(now(), 10000);
PREPARE sweep_keys_far(timestamptz, bigint, timestamptz, timestamptz) AS
SELECT scope, key FROM idempotency.keys
 WHERE (CASE WHEN status OPERATOR(pg_catalog.=) 'completed' THEN expires_at ELSE '-infinity'::pg_catalog.timestamptz END)
       OPERATOR(pg_catalog.>=) '1970-01-01 00:00:00+00'::pg_catalog.timestamptz
   AND ((CASE WHEN status OPERATOR(pg_catalog.=) 'completed' THEN expires_at ELSE '-infinity'::pg_catalog.timestamptz END)
        OPERATOR(pg_catalog.<) $3
        OR (CASE WHEN status OPERATOR(pg_catalog.=) 'completed' THEN expires_at ELSE '-infinity'::pg_catalog.timestamptz END)
        OPERATOR(pg_catalog.>=) $4)
   AND expires_at OPERATOR(pg_catalog.<=) $1
 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED;
EXPLAIN (COSTS OFF) EXECUTE sweep_keys_far(now(), 10000, '2100-01-01 00:00:00+00', '2100-01-03 00:00:00+00');

-- ... and expired message ids past the periods through messages_far_expires_at_idx.
PREPARE sweep_messages(timestamptz, bigint, timestamptz, timestamptz) AS
SELECT scope, message_id FROM idempotency.messages
 WHERE (expires_at OPERATOR(pg_catalog.<) $3 OR expires_at OPERATOR(pg_catalog.>=) $4)
   AND expires_at OPERATOR(pg_catalog.<=) $1
 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED;
EXPLAIN (COSTS OFF) EXECUTE sweep_messages(now(), 10000, '2100-01-01 00:00:00+00', '2100-01-02 00:00:00+00');

-- idem_reclaim_stale: in_progress claims whose lease ended, oldest lease first, through
-- the partial index keys_in_progress_idx.
PREPARE stale(timestamptz, bigint) AS
SELECT scope, key, token, attempts FROM idempotency.keys
 WHERE (CASE WHEN status OPERATOR(pg_catalog.=) 'completed' THEN expires_at ELSE '-infinity'::pg_catalog.timestamptz END)
       OPERATOR(pg_catalog.=) '-infinity'::pg_catalog.timestamptz
   AND status OPERATOR(pg_catalog.=) 'in_progress' AND locked_until OPERATOR(pg_catalog.<=) $1
   AND expires_at OPERATOR(pg_catalog.>) $1
 ORDER BY locked_until LIMIT $2 FOR UPDATE SKIP LOCKED;
EXPLAIN (COSTS OFF) EXECUTE stale(now(), 1000);

-- idem_complete of a committed claim moves it: the claim leaves keys_claims (through its
-- primary key; the WHERE names status = 'in_progress' but not the lease, so the partial index
-- keys_in_progress_idx, which holds every claim in flight, cannot be chosen), and the
-- completed record goes to the partition of its expiry.
PREPARE complete(text, text, uuid, int, jsonb, jsonb, timestamptz) AS
WITH claim AS (
    DELETE FROM idempotency.keys
     WHERE (CASE WHEN status OPERATOR(pg_catalog.=) 'completed' THEN expires_at ELSE '-infinity'::pg_catalog.timestamptz END)
           OPERATOR(pg_catalog.=) '-infinity'::pg_catalog.timestamptz
       AND scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2
       AND token OPERATOR(pg_catalog.=) $3 AND status OPERATOR(pg_catalog.=) 'in_progress'
       AND expires_at OPERATOR(pg_catalog.>) $7
    RETURNING scope, key, fingerprint, token, attempts, recovery_point, recovery_data, created_at, expires_at)
INSERT INTO idempotency.keys
    (scope, key, fingerprint, status, token, attempts, locked_until, recovery_point, recovery_data,
     response_status, response_headers, response_body, created_at, updated_at, completed_at, expires_at)
SELECT scope, key, fingerprint, 'completed', token, attempts, NULL, recovery_point, recovery_data,
       $4, $5, $6, created_at, $7, $7, expires_at FROM claim;
EXPLAIN (COSTS OFF) EXECUTE complete('acct_42', 'order-1', gen_random_uuid(), 201, NULL, NULL, now());

-- idem_seen's read: the messages primary keys.
PREPARE seen_read(text, text) AS
SELECT expires_at FROM idempotency.messages
 WHERE scope OPERATOR(pg_catalog.=) $1 AND message_id OPERATOR(pg_catalog.=) $2
 ORDER BY expires_at DESC LIMIT 1;
EXPLAIN (COSTS OFF) EXECUTE seen_read('consumer', 'msg-1');

-- idem_seen_many's read: each id's latest expiry, one look-up through the messages primary
-- keys per id of the batch (a join with the array could be planned as a scan of the scope).
PREPARE seen_many_read(text, text[]) AS
SELECT id AS message_id,
       (SELECT pg_catalog.max(m.expires_at) FROM idempotency.messages AS m
         WHERE m.scope OPERATOR(pg_catalog.=) $1 AND m.message_id OPERATOR(pg_catalog.=) id) AS latest
  FROM pg_catalog.unnest($2) AS id;
EXPLAIN (COSTS OFF) EXECUTE seen_many_read('consumer', ARRAY['msg-1', 'msg-2']);

-- The sweep with tombstones on picks the records past the periods that expired and still
-- hold a response through keys_responses_idx, so it never steps over the tombstones it
-- already made. (A period keeps its responses until it is dropped.)
PREPARE make_tombstones(timestamptz, bigint, timestamptz, timestamptz) AS
SELECT scope, key FROM idempotency.keys
 WHERE (CASE WHEN status OPERATOR(pg_catalog.=) 'completed' THEN expires_at ELSE '-infinity'::pg_catalog.timestamptz END)
       OPERATOR(pg_catalog.>=) '1970-01-01 00:00:00+00'::pg_catalog.timestamptz
   AND ((CASE WHEN status OPERATOR(pg_catalog.=) 'completed' THEN expires_at ELSE '-infinity'::pg_catalog.timestamptz END)
        OPERATOR(pg_catalog.<) $3
        OR (CASE WHEN status OPERATOR(pg_catalog.=) 'completed' THEN expires_at ELSE '-infinity'::pg_catalog.timestamptz END)
        OPERATOR(pg_catalog.>=) $4)
   AND (response_body IS NOT NULL OR response_headers IS NOT NULL)
   AND expires_at OPERATOR(pg_catalog.<=) $1
 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED;
EXPLAIN (COSTS OFF) EXECUTE make_tombstones(now(), 10000, '2100-01-01 00:00:00+00', '2100-01-03 00:00:00+00');
-- (idempotency.stats' plan: 12_stats_plan.)

RESET enable_seqscan;
RESET enable_bitmapscan;
RESET plan_cache_mode;
DROP TABLE idempotency.keys_21000101t000000, idempotency.keys_21000102t000000, idempotency.messages_21000101t000000;
