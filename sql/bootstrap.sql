-- The record, the message log and the claim result type.
-- Runs first in the install script, before the functions that use these.
-- Every name is schema-qualified: the install script must not depend on search_path.

CREATE TABLE idempotency.keys (
    scope            text        NOT NULL,
    key              text        NOT NULL,
    fingerprint      text,
    status           text        NOT NULL,
    token            uuid        NOT NULL,
    attempts         int         NOT NULL DEFAULT 1,
    locked_until     timestamptz,
    recovery_point   text,
    recovery_data    jsonb,
    response_status  int,
    response_headers jsonb,
    response_body    jsonb,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    completed_at     timestamptz,
    expires_at       timestamptz NOT NULL
) PARTITION BY RANGE ((CASE WHEN status = 'completed' THEN expires_at ELSE '-infinity'::timestamptz END));
-- Partitioned (0.6.0, docs/operations.md#partitions): claims in flight in keys_claims (every
-- status but completed is keyed -infinity), completed records by expires_at in one partition
-- per idempotency.partition_period, which idem_sweep creates ahead and drops once the period
-- and its tombstones are over, and keys_far for completed records past the partitions made
-- so far. Statements that mean one kind of record say so with the partition key expression
-- above, spelled the same, so that the planner reads only that partition. (scope, key) is
-- unique across partitions: each partition has its own primary key, and every write that
-- creates a record holds the key's lock (src/keylock.rs) and reads the key first.
-- No CHECK constraints: PostgreSQL 15 parses and plans every CHECK expression again for
-- each INSERT and UPDATE statement, which was 28 % of a claim + complete (BENCHMARKS.md).
-- The idem_* functions are the writers and keep the invariants themselves: status is
-- 'in_progress' or 'completed'; locked_until is set exactly while in_progress;
-- response_status is set exactly when completed.

COMMENT ON TABLE idempotency.keys IS
    'One idempotency record per (scope, key). Written through the idem_* functions; '
    'a record with expires_at <= now() is treated as absent until idem_sweep drops or deletes it.';

-- Claims in flight: small, changed in place (checkpoints, takeovers), emptied as claims
-- complete. Vacuumed after 1 % of it changed rather than PostgreSQL's default 20 %.
CREATE TABLE idempotency.keys_claims PARTITION OF idempotency.keys (
    CONSTRAINT keys_claims_pkey PRIMARY KEY (scope, key)
) FOR VALUES FROM (MINVALUE) TO ('1970-01-01 00:00:00+00');

ALTER TABLE idempotency.keys_claims SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01
);

-- idem_reclaim_stale and idempotency.stats: claims by end of lease. Partial: the predicate
-- names locked_until too, so that it is implied only by queries on the lease ("locked_until
-- <= now"), and the fenced UPDATEs of idem_checkpoint ("status = 'in_progress'" and a key)
-- use the primary key.
CREATE INDEX keys_in_progress_idx ON idempotency.keys_claims (locked_until)
    WHERE status = 'in_progress' AND locked_until IS NOT NULL;

-- idem_sweep: claims that expired without being completed, oldest first.
CREATE INDEX keys_claims_expires_at_idx ON idempotency.keys_claims (expires_at);

-- Completed records whose expiry lies past the partitions made so far (a ttl longer than
-- idempotency.default_ttl plus two periods, or no idem_sweep yet): swept by DELETE as every
-- record was before 0.6.0, and moved into each partition idem_sweep makes.
CREATE TABLE idempotency.keys_far PARTITION OF idempotency.keys (
    CONSTRAINT keys_far_pkey PRIMARY KEY (scope, key)
) DEFAULT;

ALTER TABLE idempotency.keys_far SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01
);

-- idem_sweep: expired records, oldest first; and the rows a new partition takes over.
CREATE INDEX keys_far_expires_at_idx ON idempotency.keys_far (expires_at);

-- The sweep with tombstones on (idempotency.tombstone_ttl): records that still hold a
-- response, by expiry, so that each batch finds the expired ones to turn into tombstones
-- without stepping over the tombstones it already made. (A partition of its own keeps the
-- responses until it is dropped; its claims answer expired without them.)
CREATE INDEX keys_responses_idx ON idempotency.keys_far (expires_at)
    WHERE response_body IS NOT NULL OR response_headers IS NOT NULL;

-- Message ids seen by idem_seen, one row per (scope, message_id), partitioned by expiry as
-- the completed records are.
CREATE TABLE idempotency.messages (
    scope      text        NOT NULL,
    message_id text        NOT NULL,
    seen_at    timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
) PARTITION BY RANGE (expires_at);

COMMENT ON TABLE idempotency.messages IS
    'Message ids recorded by idem_seen; expired rows are treated as absent until idem_sweep drops or deletes them.';

CREATE TABLE idempotency.messages_far PARTITION OF idempotency.messages (
    CONSTRAINT messages_far_pkey PRIMARY KEY (scope, message_id)
) DEFAULT;

ALTER TABLE idempotency.messages_far SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01
);

CREATE INDEX messages_far_expires_at_idx ON idempotency.messages_far (expires_at);

-- pg_dump keeps the rows of the extension's own partitions; the partitions idem_sweep makes
-- are not the extension's members, so pg_dump keeps them (and their rows) as it keeps tables
-- of yours.
SELECT pg_catalog.pg_extension_config_dump('idempotency.keys_claims', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.keys_far', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.messages_far', '');

CREATE TYPE idempotency.claim_result AS (
    outcome          text,
    token            uuid,
    http_status      int,
    response_status  int,
    response_headers jsonb,
    response_body    jsonb,
    recovery_point   text,
    recovery_data    jsonb,
    attempts         int,
    expires_at       timestamptz,
    locked_until     timestamptz
);

COMMENT ON TYPE idempotency.claim_result IS
    'What idem_claim answers: outcome is claimed, reclaimed, replay, in_progress, mismatch or expired (tombstones on). '
    'locked_until (added after the contract''s columns) is the end of the owner''s lease.';
