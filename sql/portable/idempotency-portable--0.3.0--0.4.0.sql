-- idempotency PORTABLE EDITION, 0.3.0 -> 0.4.0 (issue 15: waiting duplicates, claims safe
-- to retry, tombstones, idem_seen_many), as the native sql/idempotency--0.3.0--0.4.0.sql.
-- Frozen once released, as every upgrade file.
--
-- Run once, in one transaction, by the owner of the portable install:
--     psql -v ON_ERROR_STOP=1 -1 -d DB -f sql/portable/idempotency-portable--0.3.0--0.4.0.sql
-- It works unchanged as an extension update script (idempotency--0.3.0--0.4.0.sql next to
-- the control file, or pgtle.install_update_path), then ALTER EXTENSION idempotency UPDATE.
--
-- idem_claim gets two arguments with defaults (wait, token): it is dropped and created
-- again, so grants on it (a revoked EXECUTE) must be made again, and this fails (rather
-- than drop them) if a view or function of yours depends on it. Builds one index
-- (keys_responses_idx): writes to idempotency.keys wait while it is built.

-- Only over release 0.3.0: run twice, or over another release, it changes nothing.
DO $$
DECLARE
    installed text;
BEGIN
    IF pg_catalog.to_regprocedure('idempotency.portable_version()') IS NOT NULL THEN
        EXECUTE 'SELECT idempotency.portable_version()' INTO installed;
    END IF;
    IF installed IS DISTINCT FROM '0.3.0' THEN
        RAISE EXCEPTION 'this file upgrades the portable edition 0.3.0, but the release installed here is %',
                        coalesce(installed, 'none (no idempotency.portable_version())')
            USING ERRCODE = '55000', HINT = 'docs/portable.md, "Upgrades": run the upgrade files in order, each once.';
    END IF;
END
$$;

-- The sweep with tombstones on (idempotency.tombstone_ttl): records that still hold a
-- response, by expiry, so that each batch finds the expired ones to turn into tombstones
-- without stepping over the tombstones it already made.
CREATE INDEX keys_responses_idx ON idempotency.keys (expires_at)
    WHERE response_body IS NOT NULL OR response_headers IS NOT NULL;

COMMENT ON TYPE idempotency.claim_result IS
    'What idem_claim answers: outcome is claimed, reclaimed, replay, in_progress, mismatch or expired (tombstones on). '
    'locked_until (added after the contract''s columns) is the end of the owner''s lease.';

-- idempotency.tombstone_ttl (0.4.0): value is NULL when tombstones are off (not set, or
-- zero), else the interval; problem ("SQLSTATE message") when it is set to something that
-- is not zero or a positive interval of at most 10000 years.
CREATE FUNCTION idempotency.portable_tombstone_ttl(OUT value interval, OUT problem text)
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    raw text := current_setting('idempotency.tombstone_ttl', true);
BEGIN
    IF raw IS NULL OR raw = '' THEN
        RETURN;
    END IF;
    BEGIN
        value := raw::interval;
    EXCEPTION WHEN data_exception OR syntax_error THEN
        value := interval '-1 second';
    END;
    IF value = interval '0' THEN
        value := NULL;
    ELSIF idempotency.portable_interval_problem(value) IS NOT NULL THEN
        value := NULL;
        problem := format('22023 invalid value for setting "idempotency.tombstone_ttl": "%s" (it must be zero or a positive interval of at most 10000 years)', raw);
    END IF;
END
$$;

-- idem_claim's wait in seconds, counted as PostgreSQL compares intervals (a month is 30
-- days, a day 24 hours; the native rule). Only called with 0 < wait <= 1 hour.
CREATE FUNCTION idempotency.portable_seconds(val interval) RETURNS float8
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT ((extract(year FROM val) * 12 + extract(month FROM val)) * 30 * 86400
            + extract(day FROM val) * 86400 + extract(hour FROM val) * 3600
            + extract(minute FROM val) * 60 + extract(second FROM val))::float8
$$;

DROP FUNCTION idempotency.idem_claim(text, text, text, interval, interval);

-- ---------------------------------------------------------------------------------------
-- idem_claim. One read of (scope, key) answers replay, in_progress, mismatch and expired
-- with nothing written and no transaction id taken; only a claim that goes ahead writes (an
-- insert, the replacement of an expired record, or the takeover of a claim whose lease
-- ended). A write that finds the record changed under it reads again.
--
-- 0.4.0: a caller's token is stored by a new claim or a takeover, and a repeated call with
-- the token of the live in_progress record answers claimed again, writing nothing. With
-- idempotency.tombstone_ttl on, an expired completed record answers expired (410) until
-- expires_at + tombstone_ttl. A positive wait turns an in_progress answer into a wait: the
-- record is read again (a fresh snapshot per read under READ COMMITTED) after pg_sleep
-- pauses of 10 ms, growing to a tenth of the time waited so far, at most 100 ms, never past
-- the owner's lease end, the record's expiry or the wait's end; no row lock, no
-- transaction id; cancel and statement_timeout stop pg_sleep. Under REPEATABLE READ or
-- SERIALIZABLE the snapshot never shows a change: the answer is given at once.

CREATE FUNCTION idempotency.idem_claim(
    scope text,
    key text,
    fingerprint text DEFAULT NULL,
    ttl interval DEFAULT NULL,
    lease interval DEFAULT NULL,
    wait interval DEFAULT NULL,
    token uuid DEFAULT NULL
) RETURNS idempotency.claim_result
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text;
    now_ timestamptz := now();
    expires timestamptz;
    lease_end timestamptz;
    rec record;
    new_token uuid;
    new_expires timestamptz;
    taken record;
    n bigint;
    tombstone_ttl interval;
    wait_started timestamptz;
    wait_until timestamptz;
    pause float8;
    answer idempotency.claim_result;
BEGIN
    problem := coalesce(idempotency.portable_key_error('scope', scope), idempotency.portable_key_error('key', key));
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    SELECT a.value, a.problem INTO ttl, problem
      FROM idempotency.portable_interval_arg('ttl', ttl, 'idempotency.default_ttl', interval '24 hours') AS a;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    SELECT a.value, a.problem INTO lease, problem
      FROM idempotency.portable_interval_arg('lease', lease, 'idempotency.default_lease', interval '5 minutes') AS a;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    IF wait < interval '0' THEN
        RAISE EXCEPTION 'invalid argument "wait": must not be negative' USING ERRCODE = '22023';
    END IF;
    IF wait > interval '1 hour' THEN
        RAISE EXCEPTION 'invalid argument "wait": must be at most 1 hour' USING ERRCODE = '22023';
    END IF;
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'idem_claim cannot run on a read-only server'
            USING ERRCODE = '25006', HINT = 'Claims must run on the primary; idem_lookup works on a standby.';
    END IF;

    <<waiting>>
    LOOP
        expires := now_ + ttl;
        lease_end := now_ + lease;
        answer := NULL;
        <<rounds>>
        FOR round IN 1..10 LOOP
            SELECT k.fingerprint, k.status, k.token, k.attempts, k.locked_until, k.expires_at,
                   k.response_status, k.response_headers, k.response_body, k.recovery_point, k.recovery_data
              INTO rec
              FROM idempotency.keys AS k
             WHERE k.scope = idem_claim.scope AND k.key = idem_claim.key;
            IF NOT FOUND THEN
                new_token := coalesce(idem_claim.token, gen_random_uuid());
                INSERT INTO idempotency.keys AS k
                       (scope, key, fingerprint, status, token, attempts, locked_until,
                        created_at, updated_at, expires_at)
                VALUES (idem_claim.scope, idem_claim.key, idem_claim.fingerprint, 'in_progress',
                        new_token, 1, lease_end, now_, now_, expires)
                ON CONFLICT (scope, key) DO NOTHING;
                GET DIAGNOSTICS n = ROW_COUNT;
                IF n = 1 THEN
                    answer := ROW('claimed', new_token, NULL, NULL, NULL, NULL, NULL, NULL, 1, expires, lease_end);
                    EXIT rounds;
                END IF;
                CONTINUE; -- another transaction inserted it first: read what it left
            END IF;

            IF rec.expires_at <= now_ THEN
                -- A completed record inside its tombstone answers expired (or mismatch).
                IF rec.status = 'completed' THEN
                    SELECT t.value, t.problem INTO tombstone_ttl, problem FROM idempotency.portable_tombstone_ttl() AS t;
                    IF problem IS NOT NULL THEN
                        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
                    END IF;
                    IF rec.expires_at + tombstone_ttl > now_ THEN
                        IF rec.fingerprint IS DISTINCT FROM idem_claim.fingerprint THEN
                            answer := ROW('mismatch', NULL, 422, NULL, NULL, NULL, NULL, NULL, NULL, rec.expires_at, NULL);
                        ELSE
                            answer := ROW('expired', NULL, 410, rec.response_status, NULL, NULL, NULL, NULL,
                                          rec.attempts, rec.expires_at, NULL);
                        END IF;
                        EXIT rounds;
                    END IF;
                END IF;
                new_token := coalesce(idem_claim.token, gen_random_uuid());
                UPDATE idempotency.keys AS k
                   SET fingerprint = idem_claim.fingerprint, status = 'in_progress', token = new_token,
                       attempts = 1, locked_until = lease_end, recovery_point = NULL, recovery_data = NULL,
                       response_status = NULL, response_headers = NULL, response_body = NULL,
                       created_at = now_, updated_at = now_, completed_at = NULL, expires_at = expires
                 WHERE k.scope = idem_claim.scope AND k.key = idem_claim.key
                   AND k.token = rec.token AND k.expires_at <= now_;
                GET DIAGNOSTICS n = ROW_COUNT;
                IF n = 1 THEN
                    answer := ROW('claimed', new_token, NULL, NULL, NULL, NULL, NULL, NULL, 1, expires, lease_end);
                    EXIT rounds;
                END IF;
                CONTINUE;
            END IF;

            IF rec.fingerprint IS DISTINCT FROM idem_claim.fingerprint THEN
                answer := ROW('mismatch', NULL, 422, NULL, NULL, NULL, NULL, NULL, NULL, rec.expires_at, NULL);
                EXIT rounds;
            END IF;
            IF rec.status = 'completed' THEN
                answer := ROW('replay', NULL, rec.response_status, rec.response_status, rec.response_headers,
                              rec.response_body, NULL, NULL, rec.attempts, rec.expires_at, NULL);
                EXIT rounds;
            END IF;
            -- The caller's own claim, repeated (its first answer was lost): nothing to write.
            IF rec.token = idem_claim.token THEN
                answer := ROW('claimed', rec.token, NULL, NULL, NULL, NULL, rec.recovery_point, rec.recovery_data,
                              rec.attempts, rec.expires_at, rec.locked_until);
                EXIT rounds;
            END IF;
            IF rec.locked_until > now_ THEN
                answer := ROW('in_progress', NULL, 409, NULL, NULL, NULL, NULL, NULL, rec.attempts,
                              rec.expires_at, rec.locked_until);
                EXIT rounds;
            END IF;

            -- The owner's lease ended: take the claim over, fenced on the token read.
            new_token := coalesce(idem_claim.token, gen_random_uuid());
            new_expires := greatest(rec.expires_at, expires);
            UPDATE idempotency.keys AS k
               SET token = new_token, attempts = rec.attempts + 1, locked_until = lease_end,
                   updated_at = now_, expires_at = new_expires
             WHERE k.scope = idem_claim.scope AND k.key = idem_claim.key
               AND k.token = rec.token AND k.status = 'in_progress'
               AND k.locked_until <= now_ AND k.expires_at > now_
            RETURNING k.recovery_point, k.recovery_data INTO taken;
            IF FOUND THEN
                answer := ROW('reclaimed', new_token, NULL, NULL, NULL, NULL, taken.recovery_point,
                              taken.recovery_data, rec.attempts + 1, new_expires, lease_end);
                EXIT rounds;
            END IF;
        END LOOP;
        IF answer.outcome IS NULL THEN
            RAISE EXCEPTION 'could not claim scope %, key %: it kept changing concurrently',
                idempotency.portable_quote(scope), idempotency.portable_quote(key)
                USING ERRCODE = '40001', HINT = 'Retry the transaction.';
        END IF;

        EXIT waiting WHEN answer.outcome <> 'in_progress' OR wait IS NULL OR wait = interval '0'
                       OR current_setting('transaction_isolation') IN ('repeatable read', 'serializable');
        IF wait_until IS NULL THEN
            wait_started := clock_timestamp();
            wait_until := wait_started + idempotency.portable_seconds(wait) * interval '1 second';
        END IF;
        EXIT waiting WHEN now_ >= wait_until;
        now_ := clock_timestamp();
        pause := greatest(0.001, least(
            extract(epoch FROM wait_until - now_),
            greatest(0.01, least(0.1, extract(epoch FROM now_ - wait_started) / 10)),
            extract(epoch FROM answer.locked_until - now_),
            extract(epoch FROM answer.expires_at - now_)));
        PERFORM pg_sleep(pause);
        now_ := clock_timestamp();
    END LOOP;
    RETURN answer;
END
$$;

-- idem_seen_many (0.4.0): idem_seen for a batch, in one call. A batch of duplicates is
-- answered from one read (nothing written, no transaction id). The new ids are recorded by
-- one INSERT in byte order: two batches that share ids lock them in the same order, so one
-- waits for the other instead of deadlocking. Element i is true when message_ids[i] was
-- recorded now and is its first occurrence in the batch.
CREATE FUNCTION idempotency.idem_seen_many(scope text, message_ids text[], ttl interval DEFAULT NULL)
RETURNS boolean[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text;
    now_ timestamptz := now();
    bad record;
    unseen text[];
    recorded text[];
    answer boolean[];
BEGIN
    problem := idempotency.portable_key_error('scope', scope);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    IF message_ids IS NULL THEN
        RAISE EXCEPTION 'argument "message_ids" must not be null' USING ERRCODE = '22004';
    END IF;
    IF cardinality(message_ids) > 10000 THEN
        RAISE EXCEPTION 'invalid argument "message_ids": must hold at most 10000 ids (got %)', cardinality(message_ids)
            USING ERRCODE = '22023';
    END IF;
    -- The first bad element (portable_key_problem's rules, spelled out so that a good batch
    -- costs no function call per id).
    SELECT u.id, u.i INTO bad
      FROM unnest(message_ids) WITH ORDINALITY AS u(id, i)
     WHERE u.id IS NULL OR u.id = '' OR u.id ~ '[\x01-\x1f\x7f-\x9f]' OR length(u.id) > 255
     ORDER BY u.i LIMIT 1;
    IF FOUND THEN
        IF bad.id IS NULL THEN
            RAISE EXCEPTION 'argument "message_ids" must not contain nulls (element % is null)', bad.i
                USING ERRCODE = '22004';
        END IF;
        problem := idempotency.portable_key_error('message_ids', bad.id);
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    SELECT a.value, a.problem INTO ttl, problem
      FROM idempotency.portable_interval_arg('ttl', ttl, 'idempotency.default_ttl', interval '24 hours') AS a;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'idem_seen_many cannot run on a read-only server'
            USING ERRCODE = '25006', HINT = 'Claims must run on the primary; idem_lookup works on a standby.';
    END IF;
    IF cardinality(message_ids) = 0 THEN
        RETURN '{}'::boolean[];
    END IF;

    -- The distinct ids not live in the log, in byte order.
    SELECT array_agg(d.id ORDER BY d.id COLLATE "C") INTO unseen
      FROM (SELECT DISTINCT u.id FROM unnest(message_ids) AS u(id)) AS d
     WHERE NOT EXISTS (SELECT FROM idempotency.messages AS m
                        WHERE m.scope = idem_seen_many.scope AND m.message_id = d.id AND m.expires_at > now_);
    IF unseen IS NOT NULL THEN
        -- Behind another open transaction's insert of the same id this waits on the unique
        -- index; an id that transaction recorded is not returned.
        WITH ins AS (
            INSERT INTO idempotency.messages AS m (scope, message_id, seen_at, expires_at)
            SELECT idem_seen_many.scope, u.id, now_, now_ + ttl FROM unnest(unseen) AS u(id)
            ON CONFLICT (scope, message_id) DO UPDATE SET seen_at = now_, expires_at = now_ + ttl
             WHERE m.expires_at <= now_
            RETURNING m.message_id)
        SELECT array_agg(ins.message_id) INTO recorded FROM ins;
    END IF;
    SELECT array_agg(r.id IS NOT NULL AND u.first ORDER BY u.i) INTO answer
      FROM (SELECT x.id, x.i, row_number() OVER (PARTITION BY x.id ORDER BY x.i) = 1 AS first
              FROM unnest(message_ids) WITH ORDINALITY AS x(id, i)) AS u
      LEFT JOIN unnest(recorded) AS r(id) ON r.id = u.id;
    RETURN answer;
END
$$;

-- Deletes expired records. With idempotency.tombstone_ttl on (0.4.0), within the same
-- budget: records expired longer ago than tombstone_ttl (tombstones past their end) are
-- deleted, claims that expired in_progress are deleted (they leave no tombstone), and
-- completed records that expired become tombstones (response and checkpoint dropped).
CREATE OR REPLACE FUNCTION idempotency.idem_sweep(max_rows int DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    problem text;
    now_ timestamptz := now();
    dist record;
    tombstone_ttl interval;
    step text;
    scopes text[];
    ids text[];
    swept bigint := 0;
    n bigint;
BEGIN
    IF max_rows IS NULL THEN
        RAISE EXCEPTION 'argument "max_rows" must not be null' USING ERRCODE = '22004';
    END IF;
    IF max_rows <= 0 THEN
        RAISE EXCEPTION 'invalid argument "max_rows": must be positive (got %)', max_rows USING ERRCODE = '22023';
    END IF;
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'idem_sweep cannot run on a read-only server'
            USING ERRCODE = '25006', HINT = 'Claims must run on the primary; idem_lookup works on a standby.';
    END IF;
    SELECT t.value, t.problem INTO tombstone_ttl, problem FROM idempotency.portable_tombstone_ttl() AS t;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    dist := idempotency.portable_distributed();

    -- Each step picks at most what is left of the budget, then changes exactly those rows
    -- if they are still past the cut-off.
    FOREACH step IN ARRAY CASE WHEN tombstone_ttl IS NULL THEN ARRAY['delete']
                               ELSE ARRAY['delete', 'expired claims', 'tombstones'] END LOOP
        EXIT WHEN swept >= max_rows;
        scopes := NULL;
        IF step = 'delete' THEN
            IF dist.keys THEN
                SELECT array_agg(p.scope), array_agg(p.key) INTO scopes, ids
                  FROM (SELECT k.scope, k.key FROM idempotency.keys AS k
                         WHERE k.expires_at <= now_ - coalesce(tombstone_ttl, interval '0')
                         ORDER BY k.expires_at LIMIT max_rows - swept) AS p;
            ELSE
                SELECT array_agg(p.scope), array_agg(p.key) INTO scopes, ids
                  FROM (SELECT k.scope, k.key FROM idempotency.keys AS k
                         WHERE k.expires_at <= now_ - coalesce(tombstone_ttl, interval '0')
                         ORDER BY k.expires_at LIMIT max_rows - swept FOR UPDATE SKIP LOCKED) AS p;
            END IF;
            IF scopes IS NOT NULL THEN
                DELETE FROM idempotency.keys AS t
                 USING ROWS FROM (unnest(scopes), unnest(ids)) AS picked(scope, id)
                 WHERE (NOT dist.keys OR t.scope = ANY (scopes))
                   AND t.scope = picked.scope AND t.key = picked.id
                   AND t.expires_at <= now_ - coalesce(tombstone_ttl, interval '0');
                GET DIAGNOSTICS n = ROW_COUNT;
                swept := swept + n;
            END IF;
        ELSIF step = 'expired claims' THEN
            IF dist.keys THEN
                SELECT array_agg(p.scope), array_agg(p.key) INTO scopes, ids
                  FROM (SELECT k.scope, k.key FROM idempotency.keys AS k
                         WHERE k.status = 'in_progress' AND k.locked_until IS NOT NULL AND k.expires_at <= now_
                         ORDER BY k.locked_until LIMIT max_rows - swept) AS p;
            ELSE
                SELECT array_agg(p.scope), array_agg(p.key) INTO scopes, ids
                  FROM (SELECT k.scope, k.key FROM idempotency.keys AS k
                         WHERE k.status = 'in_progress' AND k.locked_until IS NOT NULL AND k.expires_at <= now_
                         ORDER BY k.locked_until LIMIT max_rows - swept FOR UPDATE SKIP LOCKED) AS p;
            END IF;
            IF scopes IS NOT NULL THEN
                DELETE FROM idempotency.keys AS t
                 USING ROWS FROM (unnest(scopes), unnest(ids)) AS picked(scope, id)
                 WHERE (NOT dist.keys OR t.scope = ANY (scopes))
                   AND t.scope = picked.scope AND t.key = picked.id
                   AND t.status = 'in_progress' AND t.expires_at <= now_;
                GET DIAGNOSTICS n = ROW_COUNT;
                swept := swept + n;
            END IF;
        ELSE
            -- Through keys_responses_idx (its predicate spelled the same): the tombstones
            -- already made are not stepped over.
            IF dist.keys THEN
                SELECT array_agg(p.scope), array_agg(p.key) INTO scopes, ids
                  FROM (SELECT k.scope, k.key FROM idempotency.keys AS k
                         WHERE (k.response_body IS NOT NULL OR k.response_headers IS NOT NULL) AND k.expires_at <= now_
                         ORDER BY k.expires_at LIMIT max_rows - swept) AS p;
            ELSE
                SELECT array_agg(p.scope), array_agg(p.key) INTO scopes, ids
                  FROM (SELECT k.scope, k.key FROM idempotency.keys AS k
                         WHERE (k.response_body IS NOT NULL OR k.response_headers IS NOT NULL) AND k.expires_at <= now_
                         ORDER BY k.expires_at LIMIT max_rows - swept FOR UPDATE SKIP LOCKED) AS p;
            END IF;
            IF scopes IS NOT NULL THEN
                UPDATE idempotency.keys AS t
                   SET response_body = NULL, response_headers = NULL, recovery_point = NULL, recovery_data = NULL
                  FROM ROWS FROM (unnest(scopes), unnest(ids)) AS picked(scope, id)
                 WHERE (NOT dist.keys OR t.scope = ANY (scopes))
                   AND t.scope = picked.scope AND t.key = picked.id
                   AND t.status = 'completed' AND t.expires_at <= now_;
                GET DIAGNOSTICS n = ROW_COUNT;
                swept := swept + n;
            END IF;
        END IF;
    END LOOP;
    IF swept >= max_rows THEN
        RETURN swept;
    END IF;

    scopes := NULL;
    IF dist.messages THEN
        SELECT array_agg(p.scope), array_agg(p.message_id) INTO scopes, ids
          FROM (SELECT m.scope, m.message_id FROM idempotency.messages AS m WHERE m.expires_at <= now_
                 ORDER BY m.expires_at LIMIT max_rows - swept) AS p;
    ELSE
        SELECT array_agg(p.scope), array_agg(p.message_id) INTO scopes, ids
          FROM (SELECT m.scope, m.message_id FROM idempotency.messages AS m WHERE m.expires_at <= now_
                 ORDER BY m.expires_at LIMIT max_rows - swept FOR UPDATE SKIP LOCKED) AS p;
    END IF;
    IF scopes IS NOT NULL THEN
        DELETE FROM idempotency.messages AS t
         USING ROWS FROM (unnest(scopes), unnest(ids)) AS picked(scope, id)
         WHERE (NOT dist.messages OR t.scope = ANY (scopes))
           AND t.scope = picked.scope AND t.message_id = picked.id AND t.expires_at <= now_;
        GET DIAGNOSTICS n = ROW_COUNT;
        swept := swept + n;
    END IF;
    RETURN swept;
END
$$;

-- stats: a last column, tombstones.
CREATE OR REPLACE VIEW idempotency.stats AS
SELECT
    (SELECT count(*) FROM idempotency.keys
      WHERE status = 'in_progress' AND locked_until IS NOT NULL
        AND expires_at > now())                                                AS in_progress,
    (SELECT count(*) FROM idempotency.keys
      WHERE status = 'completed' AND expires_at > now())                      AS completed,
    (SELECT count(*) FROM idempotency.keys
      WHERE status = 'in_progress' AND locked_until <= now()
        AND expires_at > now())                                                AS stale,
    (SELECT count(*) FROM idempotency.keys WHERE expires_at <= now())          AS expired,
    (SELECT now() - min(created_at) FROM idempotency.keys
      WHERE status = 'in_progress' AND locked_until IS NOT NULL
        AND expires_at > now())                                                AS oldest_in_progress_age,
    (SELECT count(*) FROM idempotency.messages WHERE expires_at > now())       AS messages,
    (SELECT count(*) FROM idempotency.messages WHERE expires_at <= now())      AS expired_messages,
    (SELECT count(*) FROM idempotency.keys
      WHERE status = 'completed' AND expires_at <= now()
        AND expires_at > now() - COALESCE(NULLIF(
              pg_catalog.current_setting('idempotency.tombstone_ttl', true), ''), '0')::interval) AS tombstones;

COMMENT ON VIEW idempotency.stats IS
    'One row for monitoring: live records by status, stale claims (lease ended), expired rows '
    'awaiting idem_sweep, the age of the oldest in_progress claim, and tombstones (expired '
    'completed records inside idempotency.tombstone_ttl; counted in expired too).';

-- distribute(): idem_seen_many is colocated with idempotency.messages, like idem_seen.
CREATE OR REPLACE FUNCTION idempotency.distribute(delegate boolean DEFAULT true)
RETURNS TABLE (object text, action text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tbl regclass;
    colocate text;
    method "char";
    dist_column text;
    fn regprocedure;
    fn_name text;
    delegated boolean;
    guarded boolean;
    on_coordinator boolean;
BEGIN
    IF delegate IS NULL THEN
        RAISE EXCEPTION 'argument "delegate" must not be null' USING ERRCODE = '22004';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
        RAISE EXCEPTION 'Citus is not installed in database %', pg_catalog.current_database()
            USING ERRCODE = '55000',
                  HINT = 'On every node: shared_preload_libraries = ''citus'' (restart) and CREATE EXTENSION citus; '
                         'in this database. On the coordinator: citus_set_coordinator_host, citus_add_node for each '
                         'worker (Citus creates this extension on them), then call idempotency.distribute() there.';
    END IF;
    EXECUTE 'SELECT pg_catalog.citus_is_coordinator()' INTO on_coordinator;
    IF NOT on_coordinator THEN
        RAISE EXCEPTION 'idempotency.distribute() must be called on the Citus coordinator'
            USING ERRCODE = '55000',
                  HINT = 'Connect to the coordinator (or set it with citus_set_coordinator_host) and call it there.';
    END IF;

    -- The tables: keys first, then messages colocated with it.
    FOREACH tbl IN ARRAY ARRAY['idempotency.keys'::regclass, 'idempotency.messages'::regclass] LOOP
        object := tbl::text;
        method := NULL;
        dist_column := NULL;
        EXECUTE 'SELECT p.partmethod, pg_catalog.column_to_column_name(p.logicalrelid, p.partkey) '
                'FROM pg_catalog.pg_dist_partition AS p WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1'
            INTO method, dist_column USING tbl;
        IF method IS NULL THEN
            colocate := CASE WHEN tbl OPERATOR(pg_catalog.=) 'idempotency.keys'::regclass
                             THEN 'default' ELSE 'idempotency.keys' END;
            EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''scope'', colocate_with => $2)'
                USING tbl, colocate;
            -- Rows that were there before are now in the shards; drop the hidden local copy.
            EXECUTE 'SELECT pg_catalog.truncate_local_data_after_distributing_table($1)' USING tbl;
            action := 'distributed by scope';
        ELSIF method OPERATOR(pg_catalog.=) 'h' AND dist_column OPERATOR(pg_catalog.=) 'scope' THEN
            action := 'already distributed by scope';
        ELSE
            RAISE EXCEPTION '% is already a Citus table, but not hash-distributed by scope', tbl
                USING ERRCODE = '55000',
                      HINT = 'Every call reaches one shard only when the table is distributed by scope. '
                             'Undo it with undistribute_table(''' || tbl::text || '''), then call idempotency.distribute() again.';
        END IF;
        RETURN NEXT;
    END LOOP;

    -- The scope-first functions (first argument named scope): idem_claim, idem_complete,
    -- idem_checkpoint, idem_release, idem_lookup, idem_seen and idem_seen_many.
    FOR fn, fn_name, guarded IN
        SELECT p.oid::regprocedure, p.proname::text,
               COALESCE(s.pronamespace OPERATOR(pg_catalog.=) p.pronamespace, false)
        FROM pg_catalog.pg_proc AS p
        LEFT JOIN pg_catalog.pg_proc AS s ON s.oid OPERATOR(pg_catalog.=) p.prosupport
        WHERE p.pronamespace OPERATOR(pg_catalog.=) 'idempotency'::regnamespace
          AND p.prokind OPERATOR(pg_catalog.=) 'f'
          AND p.proargnames[1] OPERATOR(pg_catalog.=) 'scope'
          AND p.proargtypes[0] OPERATOR(pg_catalog.=) 'pg_catalog.text'::regtype
        ORDER BY p.proname
    LOOP
        object := fn::text;
        EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_object AS d '
                'WHERE d.classid OPERATOR(pg_catalog.=) ''pg_catalog.pg_proc''::pg_catalog.regclass '
                'AND d.objid OPERATOR(pg_catalog.=) $1 AND d.distribution_argument_index IS NOT NULL)'
            INTO delegated USING fn::oid;
        IF delegated THEN
            action := CASE WHEN guarded THEN 'already delegated'
                           ELSE 'already delegated, WITHOUT the NULL-scope guard: a NULL scope crashes the coordinator' END;
            IF NOT guarded THEN
                RAISE WARNING '% is delegated but has no NULL-scope guard', fn
                    USING DETAIL = 'Citus 13.0 crashes the coordinator when a delegated call gets a NULL distribution argument.',
                          HINT = 'Upgrade the idempotency extension to a version with the guard.';
            END IF;
        ELSIF NOT delegate THEN
            action := 'not delegated (delegate => false): runs on the coordinator';
        ELSIF NOT guarded THEN
            action := 'not delegated: this build has no NULL-scope guard; runs on the coordinator';
        ELSE
            colocate := CASE WHEN fn_name OPERATOR(pg_catalog.=) ANY (ARRAY['idem_seen', 'idem_seen_many'])
                             THEN 'idempotency.messages' ELSE 'idempotency.keys' END;
            EXECUTE 'SELECT pg_catalog.create_distributed_function($1, ''scope'', colocate_with => $2)'
                USING fn, colocate;
            action := 'delegated by scope, colocated with ' || colocate;
        END IF;
        RETURN NEXT;
    END LOOP;

    -- Delegated calls run on the workers with the workers' settings. ALTER ROLE ... SET is
    -- copied to them by Citus; ALTER DATABASE ... SET is not.
    IF EXISTS (SELECT FROM pg_catalog.pg_db_role_setting AS s
               JOIN pg_catalog.pg_database AS d ON d.oid OPERATOR(pg_catalog.=) s.setdatabase
               WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
                 AND s.setrole OPERATOR(pg_catalog.=) 0
                 AND pg_catalog.array_to_string(s.setconfig, ',') OPERATOR(pg_catalog.~) '(^|,)idempotency\.') THEN
        RAISE NOTICE 'idempotency.* is set with ALTER DATABASE here: Citus does not copy that to the workers'
            USING HINT = 'Run the same ALTER DATABASE ... SET on every worker, or use ALTER ROLE ... SET '
                         '(which Citus copies), or set it in every node''s postgresql.conf.';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION idempotency.portable_version() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT '0.4.0' $$;
