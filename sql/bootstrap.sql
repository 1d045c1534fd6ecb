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
    expires_at       timestamptz NOT NULL,
    CONSTRAINT keys_pkey PRIMARY KEY (scope, key)
);
-- No CHECK constraints: PostgreSQL 15 parses and plans every CHECK expression again for
-- each INSERT and UPDATE statement, which was 28 % of a claim + complete (BENCHMARKS.md).
-- The idem_* functions are the writers and keep the invariants themselves: status is
-- 'in_progress' or 'completed'; locked_until is set exactly while in_progress;
-- response_status is set exactly when completed.

COMMENT ON TABLE idempotency.keys IS
    'One idempotency record per (scope, key). Written through the idem_* functions; '
    'a record with expires_at <= now() is treated as absent until idem_sweep deletes it.';

-- Every request writes here and every record is deleted a day later: vacuum after 1 % of
-- the table changed rather than PostgreSQL's default 20 %, so that dead tuples from
-- completes and sweeps are reclaimed in small, frequent passes (with a 24 h ttl, about every
-- 7 minutes instead of every 2.4 hours with up to 20 % dead; BENCHMARKS.md, Storage
-- settings). The vacuum cost delay is left as it is, so vacuum does not compete with claims.
-- No fillfactor: completing a claim changes indexed columns, so its updates are never HOT
-- and free space in the pages would only make the table larger.
ALTER TABLE idempotency.keys SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01
);

-- idem_sweep: expired records, oldest first.
CREATE INDEX keys_expires_at_idx ON idempotency.keys (expires_at);

-- The sweep with tombstones on (idempotency.tombstone_ttl): records that still hold a
-- response, by expiry, so that each batch finds the expired ones to turn into tombstones
-- without stepping over the tombstones it already made. A claim (no response yet) is not
-- in it; a tombstone leaves it.
CREATE INDEX keys_responses_idx ON idempotency.keys (expires_at)
    WHERE response_body IS NOT NULL OR response_headers IS NOT NULL;

-- idem_reclaim_stale and idempotency.stats: in_progress records by end of lease.
-- Partial, so it stays as small as the number of claims in flight. The predicate names
-- locked_until too, so that it is implied only by queries on the lease ("locked_until <=
-- now"): the fenced UPDATEs of idem_complete and idem_checkpoint ("status = 'in_progress'"
-- and a key) must use the primary key, not scan every claim in flight.
CREATE INDEX keys_in_progress_idx ON idempotency.keys (locked_until)
    WHERE status = 'in_progress' AND locked_until IS NOT NULL;

-- Message ids seen by idem_seen, one row per (scope, message_id).
CREATE TABLE idempotency.messages (
    scope      text        NOT NULL,
    message_id text        NOT NULL,
    seen_at    timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    CONSTRAINT messages_pkey PRIMARY KEY (scope, message_id)
);

COMMENT ON TABLE idempotency.messages IS
    'Message ids recorded by idem_seen; expired rows are treated as absent until idem_sweep deletes them.';

CREATE INDEX messages_expires_at_idx ON idempotency.messages (expires_at);

ALTER TABLE idempotency.messages SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01
);

-- pg_dump keeps the rows of both tables (the extension's own objects are not dumped).
SELECT pg_catalog.pg_extension_config_dump('idempotency.keys', '');
SELECT pg_catalog.pg_extension_config_dump('idempotency.messages', '');

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
