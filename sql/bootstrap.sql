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
    CONSTRAINT keys_pkey PRIMARY KEY (scope, key),
    CONSTRAINT keys_status_check CHECK (status IN ('in_progress', 'completed')),
    CONSTRAINT keys_lease_check CHECK ((status = 'in_progress') = (locked_until IS NOT NULL)),
    CONSTRAINT keys_response_check CHECK ((status = 'completed') = (response_status IS NOT NULL))
);

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

-- idem_reclaim_stale and idempotency.stats: in_progress records by end of lease.
-- Partial, so it stays as small as the number of claims in flight.
CREATE INDEX keys_in_progress_idx ON idempotency.keys (locked_until)
    WHERE status = 'in_progress';

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
    'What idem_claim answers: outcome is claimed, reclaimed, replay, in_progress or mismatch. '
    'locked_until (added after the contract''s columns) is the end of the owner''s lease.';
