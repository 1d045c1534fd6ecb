-- idempotency PORTABLE EDITION, 0.5.0 -> 0.6.0, as the native sql/idempotency--0.5.0--0.6.0.sql.
-- Frozen once released, as every upgrade file.
--
-- Run once, in one transaction, by the owner of the portable install:
--     psql -v ON_ERROR_STOP=1 -1 -d DB -f sql/portable/idempotency-portable--0.5.0--0.6.0.sql
-- It works unchanged as an extension update script (idempotency--0.5.0--0.6.0.sql next to
-- the control file, or pgtle.install_update_path), then ALTER EXTENSION idempotency UPDATE.
--
-- What changes: (written by scripts/release.sh; with no change to the portable SQL but the
-- version, it stays as it is). tests/upgrade/run.sh checks that 0.5.0 plus this file equals
-- a fresh install of 0.6.0.

-- Only over release 0.5.0: over another release it stops and changes nothing.
DO $$
DECLARE
    installed text;
BEGIN
    IF pg_catalog.to_regprocedure('idempotency.portable_version()') IS NOT NULL THEN
        EXECUTE 'SELECT idempotency.portable_version()' INTO installed;
    END IF;
    IF installed IS DISTINCT FROM '0.5.0' THEN
        RAISE EXCEPTION 'this file upgrades the portable edition 0.5.0, but the release installed here is %',
                        coalesce(installed, 'none (no idempotency.portable_version())')
            USING ERRCODE = '55000', HINT = 'docs/portable.md, "Upgrades": run the upgrade files in order, each once.';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION idempotency.portable_version() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT '0.6.0' $$;

-- Issue 32, a sending side you can leave running (docs/sending.md): idem_send_next never waits
-- for a lock (each backend counts in budget rows of its own, the lock of a target's retries is
-- only tried), and the retry budget gives retries back once the receiver answers again (final
-- answers earn them: send_retries_allowed, over the setting idempotency.send_retry_window).
-- outbound_budget: slot becomes backend_pid (its rows are kept: they count as before) and two
-- counts are added, without a rewrite (a constant default). The new partial index on the
-- gave_up rows reads idempotency.outbound once, blocking writes to it meanwhile.
DROP FUNCTION idempotency.send_count_attempts(text, bigint, bigint);

ALTER TABLE idempotency.outbound_budget RENAME COLUMN slot TO backend_pid;

-- PostgreSQL 18 keeps a NOT NULL as a constraint named after its column: it follows the rename.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_constraint
                WHERE conrelid = 'idempotency.outbound_budget'::pg_catalog.regclass
                  AND conname = 'outbound_budget_slot_not_null') THEN
        ALTER TABLE idempotency.outbound_budget
            RENAME CONSTRAINT outbound_budget_slot_not_null TO outbound_budget_backend_pid_not_null;
    END IF;
END
$$;

ALTER TABLE idempotency.outbound_budget
    ADD COLUMN final_answers bigint NOT NULL DEFAULT 0,
    ADD COLUMN retryable_answers bigint NOT NULL DEFAULT 0;

COMMENT ON TABLE idempotency.outbound_budget IS
    'Per target, the first attempts and retries handed out by idem_send_next and the final and '
    'retryable answers recorded by idem_send_result, in buckets of a sixtieth of '
    'idempotency.send_retry_window, one row per backend and bucket: the retry budget sums the '
    'window. Rows older than two windows (at least two minutes) are deleted as senders go and by '
    'idem_sweep.';

-- Sends that gave up, by when: idempotency.stats counts them and finds the latest (an alert
-- reads it) without reading the done rows.
CREATE INDEX outbound_gave_up_idx ON idempotency.outbound (finished_at)
    WHERE state = 'gave_up';

-- idempotency.send_retry_window: what the retry budget counts over, 1 second to 1 day, default
-- 1 minute (22023 otherwise, naming the setting).
CREATE FUNCTION idempotency.send_retry_window() RETURNS interval
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    val interval;
BEGIN
    -- The default, as SHOW prints it, without parsing (every count reads the setting).
    IF coalesce(current_setting('idempotency.send_retry_window', true), '') IN ('1min', '') THEN
        RETURN interval '1 minute';
    END IF;
    val := idempotency.send_interval_setting('idempotency.send_retry_window', interval '1 minute');
    IF val < interval '1 second' OR val > interval '1 day' THEN
        RAISE EXCEPTION 'invalid value for setting "idempotency.send_retry_window": "%" (it must be an interval of 1 second to 1 day)', val
            USING ERRCODE = '22023';
    END IF;
    RETURN val;
END
$$;

-- The retry budget's arithmetic, the one place it is written (docs/sending.md, "The retry
-- budget"): how many retries of a target may be handed out now, from its counts over the
-- window W (idempotency.send_retry_window):
--   bound   = floor(ratio * first_attempts + 10)     all that is allowed while the receiver fails
--   earned  = 2 * final_answers_since_failure        final answers recorded since the target's
--                                                    latest retryable answer, two retries each
--   retries        + now <= bound + earned            over W
--   recent_retries + now <= floor(bound / 6) + earned over the last sixth of W
-- While every answer is retryable nothing is earned and retries stay within the bound, spread
-- over the window (six sixths of floor(bound / 6) never add up to more than the bound), so that
-- one goes out in every sixth of it and sees the receiver back.
-- Once it answers, each final answer earns two retries: the retries double every round trip
-- (slow start) until the backlog is sent. ratio 0: no retries at all.
CREATE FUNCTION idempotency.send_retries_allowed(ratio float8, first_attempts bigint, retries bigint,
                                                 recent_retries bigint, final_answers_since_failure bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN ratio <= 0 THEN 0::bigint
                ELSE greatest(0, least(l.bound + l.earned - retries,
                                       floor(l.bound / 6) + l.earned - recent_retries))::bigint END
      FROM (SELECT least(floor(ratio * first_attempts + 10), 1e15::float8) AS bound,
                   least(2 * final_answers_since_failure::float8, 1e15::float8) AS earned) AS l
$$;

-- The retries `target` may still be handed out now (send_retries_allowed), from its counts
-- over the window: retries in every bucket that overlaps it, first attempts in the buckets
-- inside it, so that counting in buckets never loosens the bound.
CREATE OR REPLACE FUNCTION idempotency.send_retry_allowance(target text) RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ratio float8 := idempotency.send_retry_budget();
    w interval := idempotency.send_retry_window();
    width interval := w / 60;
    c record;
BEGIN
    IF ratio = 0 THEN
        RETURN 0;
    END IF;
    WITH counts AS (SELECT b.bucket, b.first_attempts, b.retries, b.final_answers, b.retryable_answers
                      FROM idempotency.outbound_budget AS b
                     WHERE b.target = send_retry_allowance.target AND b.bucket > now() - w - width),
         failed AS (SELECT max(n.bucket) AS at FROM counts AS n WHERE n.retryable_answers > 0)
    SELECT coalesce(sum(n.first_attempts) FILTER (WHERE n.bucket >= now() - w), 0)::bigint AS firsts,
           coalesce(sum(n.retries), 0)::bigint AS retries,
           coalesce(sum(n.retries) FILTER (WHERE n.bucket > now() - w / 6 - width), 0)::bigint AS recent,
           coalesce(sum(n.final_answers) FILTER (WHERE f.at IS NULL OR n.bucket > f.at), 0)::bigint AS earned
      INTO c
      FROM failed AS f LEFT JOIN counts AS n ON true;
    RETURN idempotency.send_retries_allowed(ratio, c.firsts, c.retries, c.recent, c.earned);
END
$$;

-- Counts, in this backend's own row of the current bucket, what idem_send_next handed out to
-- `target` and what idem_send_result recorded for it. No other session writes that row, so
-- this never waits for a lock. A backend's first count in a bucket also deletes the target's
-- rows older than two windows (at least two minutes), skipping any that a session holds.
CREATE FUNCTION idempotency.send_count(target text, first_attempts bigint, retries bigint,
                                       final_answers bigint, retryable_answers bigint) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    w interval := idempotency.send_retry_window();
    v_bucket timestamptz := date_bin(w / 60, now(), timestamptz '2000-01-01 00:00:00+00');
BEGIN
    UPDATE idempotency.outbound_budget AS b
       SET first_attempts = b.first_attempts + send_count.first_attempts,
           retries = b.retries + send_count.retries,
           final_answers = b.final_answers + send_count.final_answers,
           retryable_answers = b.retryable_answers + send_count.retryable_answers
     WHERE b.target = send_count.target AND b.bucket = v_bucket AND b.backend_pid = pg_backend_pid();
    IF FOUND THEN
        RETURN;
    END IF;
    INSERT INTO idempotency.outbound_budget
           (target, bucket, backend_pid, first_attempts, retries, final_answers, retryable_answers)
    VALUES (send_count.target, v_bucket, pg_backend_pid(), send_count.first_attempts, send_count.retries,
            send_count.final_answers, send_count.retryable_answers);
    DELETE FROM idempotency.outbound_budget AS b
     WHERE (b.target, b.bucket, b.backend_pid) IN (
           SELECT o.target, o.bucket, o.backend_pid FROM idempotency.outbound_budget AS o
            WHERE o.target = send_count.target AND o.bucket < now() - 2 * greatest(w, interval '1 minute')
              FOR UPDATE SKIP LOCKED);
END
$$;

CREATE OR REPLACE FUNCTION idempotency.send_take(p_target text, p_max_rows int, p_lease interval,
                                      p_scope text, p_operation text)
RETURNS TABLE (o_scope text, o_operation text, o_target text, o_key text, o_request jsonb,
               o_attempt int, o_token uuid, o_locked_until timestamptz, o_give_up_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_lease interval;
    v_target text;
    v_left int;
    v_allowance bigint;
    v_firsts bigint;
    v_retries bigint;
    v_row idempotency.outbound;
    v_token uuid;
BEGIN
    IF p_max_rows IS NULL THEN
        RAISE EXCEPTION 'argument "max_rows" must not be null' USING ERRCODE = '22004';
    END IF;
    IF p_max_rows < 1 OR p_max_rows > 10000 THEN
        RAISE EXCEPTION 'invalid argument "max_rows": must be between 1 and 10000 (got %)', p_max_rows
            USING ERRCODE = '22023';
    END IF;
    v_lease := coalesce(idempotency.send_check_interval('argument "lease"', p_lease),
                        idempotency.send_interval_setting('idempotency.default_lease', interval '5 minutes'));
    IF p_target IS NOT NULL THEN
        PERFORM idempotency.send_check_text('target', p_target);
    END IF;
    IF (p_scope IS NULL) <> (p_operation IS NULL) THEN
        RAISE EXCEPTION 'argument "%" must not be null when "%" is given',
              CASE WHEN p_scope IS NULL THEN 'scope' ELSE 'operation' END,
              CASE WHEN p_scope IS NULL THEN 'operation' ELSE 'scope' END
            USING ERRCODE = '22004';
    END IF;
    IF p_scope IS NOT NULL THEN
        PERFORM idempotency.send_check_text('scope', p_scope);
        PERFORM idempotency.send_check_text('operation', p_operation);
    END IF;

    v_left := p_max_rows;
    -- One target at a time (the budget is per target): the given one, the one of the given
    -- operation, or each target with sends not finished (read by skipping through the index).
    FOR v_target IN
        WITH RECURSIVE targets AS (
            (SELECT o.target FROM idempotency.outbound AS o
              WHERE p_target IS NULL AND p_scope IS NULL AND o.state IN ('pending', 'sending')
              ORDER BY o.target LIMIT 1)
            UNION ALL
            SELECT (SELECT o.target FROM idempotency.outbound AS o
                     WHERE o.state IN ('pending', 'sending') AND o.target > t.target
                     ORDER BY o.target LIMIT 1)
              FROM targets AS t WHERE t.target IS NOT NULL
        )
        SELECT p_target WHERE p_target IS NOT NULL
        UNION ALL
        SELECT o.target FROM idempotency.outbound AS o
         WHERE p_target IS NULL AND o.scope = p_scope AND o.operation = p_operation
        UNION ALL
        SELECT t.target FROM targets AS t WHERE t.target IS NOT NULL
    LOOP
        EXIT WHEN v_left = 0;
        v_allowance := NULL;
        v_firsts := 0;
        v_retries := 0;
        -- Due rows past give_up_at become gave_up now, whatever the budget holds back.
        FOR v_row IN
            SELECT o.* FROM idempotency.outbound AS o
             WHERE o.target = v_target AND o.state IN ('pending', 'sending') AND o.give_up_at <= now()
               AND o.next_attempt_at <= now()
               AND (p_scope IS NULL OR (o.scope = p_scope AND o.operation = p_operation))
             ORDER BY o.next_attempt_at LIMIT 1000
               FOR UPDATE SKIP LOCKED
        LOOP
            PERFORM idempotency.send_hand_out(v_row, v_lease);
        END LOOP;
        -- First attempts first (never held back by the budget), then retries; each due-first.
        -- Each query is LIMITed to what may be handed out: FOR UPDATE locks every row the
        -- loop fetches, and a row locked but not handed out would be kept from other senders.
        FOR v_row IN
            SELECT o.* FROM idempotency.outbound AS o
             WHERE o.target = v_target AND o.state = 'pending' AND o.attempts = 0
               AND o.next_attempt_at <= now()
               AND (p_scope IS NULL OR (o.scope = p_scope AND o.operation = p_operation))
             ORDER BY o.next_attempt_at LIMIT v_left
               FOR UPDATE SKIP LOCKED
        LOOP
            v_token := idempotency.send_hand_out(v_row, v_lease);
            IF v_token IS NOT NULL THEN
                v_firsts := v_firsts + 1;
                RETURN QUERY SELECT v_row.scope, v_row.operation, v_row.target, v_row.key, v_row.request,
                                    v_row.attempts + 1, v_token, now() + v_lease, v_row.give_up_at;
                v_left := v_left - 1;
            END IF;
        END LOOP;
        -- This call's first attempts count toward the budget the retries read.
        IF v_firsts > 0 THEN
            PERFORM idempotency.send_count(v_target, v_firsts, 0, 0, 0);
        END IF;
        -- Retries, only when one is due: one sender of a target at a time reads the budget and
        -- hands them out, holding a transaction-level advisory lock of the target, so that the
        -- next reads it with those retries counted (the packages' transactions end right after
        -- idem_send_next). The lock is only tried: a sender that finds it held hands out no
        -- retries this time (the holder does). Nothing in here ever waits for a lock, so no
        -- two senders can deadlock: rows are taken with SKIP LOCKED, counts go to rows of the
        -- backend's own.
        v_allowance := 0;
        IF v_left > 0 AND EXISTS (
            SELECT FROM idempotency.outbound AS o
             WHERE o.target = v_target AND o.state IN ('pending', 'sending')
               AND o.attempts > 0 AND o.next_attempt_at <= now()
               AND (p_scope IS NULL OR (o.scope = p_scope AND o.operation = p_operation)))
        THEN
            IF pg_try_advisory_xact_lock(hashtextextended('idempotency.outbound_budget ' || v_target, 0)) THEN
                v_allowance := idempotency.send_retry_allowance(v_target);
            END IF;
        END IF;
        IF v_allowance > 0 THEN
            FOR v_row IN
                SELECT o.* FROM idempotency.outbound AS o
                 WHERE o.target = v_target AND o.state IN ('pending', 'sending')
                   AND o.attempts > 0 AND o.next_attempt_at <= now()
                   AND (p_scope IS NULL OR (o.scope = p_scope AND o.operation = p_operation))
                 ORDER BY o.next_attempt_at LIMIT least(v_left, v_allowance)
                   FOR UPDATE SKIP LOCKED
            LOOP
                v_token := idempotency.send_hand_out(v_row, v_lease);
                IF v_token IS NOT NULL THEN
                    v_retries := v_retries + 1;
                    RETURN QUERY SELECT v_row.scope, v_row.operation, v_row.target, v_row.key, v_row.request,
                                        v_row.attempts + 1, v_token, now() + v_lease, v_row.give_up_at;
                    v_left := v_left - 1;
                END IF;
            END LOOP;
        END IF;
        IF v_retries > 0 THEN
            PERFORM idempotency.send_count(v_target, 0, v_retries, 0, 0);
        END IF;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION idempotency.send_finish(p_scope text, p_operation text, p_token uuid, p_http_status int,
                                        p_response_body text, p_response_headers jsonb,
                                        p_retry_after interval, p_error text)
RETURNS TABLE (o_state text, o_attempts int, o_next_attempt_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_row idempotency.outbound;
    v_base interval;
    v_cap interval;
    v_delay interval;
    v_retryable boolean;
BEGIN
    PERFORM idempotency.send_check_text('scope', p_scope);
    PERFORM idempotency.send_check_text('operation', p_operation);
    IF p_token IS NULL THEN
        RAISE EXCEPTION 'argument "token" must not be null' USING ERRCODE = '22004';
    END IF;
    IF p_http_status IS NOT NULL AND (p_http_status < 100 OR p_http_status > 599) THEN
        RAISE EXCEPTION 'invalid argument "http_status": must be between 100 and 599 (got %)', p_http_status
            USING ERRCODE = '22023';
    END IF;
    IF p_response_headers IS NOT NULL AND jsonb_typeof(p_response_headers) <> 'object' THEN
        RAISE EXCEPTION 'invalid argument "response_headers": must be a JSON object (got %)', jsonb_typeof(p_response_headers)
            USING ERRCODE = '22023';
    END IF;
    IF p_retry_after IS NOT NULL AND (p_retry_after < interval '0' OR p_retry_after > interval '10000 years') THEN
        RAISE EXCEPTION 'invalid argument "retry_after": % (it must be an interval of 0 to 10000 years)', p_retry_after
            USING ERRCODE = '22023';
    END IF;
    -- Read (and so checked) before the row: a bad setting is 22023 whatever the token holds.
    v_base := idempotency.send_interval_setting('idempotency.send_backoff_base', interval '1 second');
    v_cap := idempotency.send_interval_setting('idempotency.send_backoff_cap', interval '10 minutes');

    SELECT o.* INTO v_row FROM idempotency.outbound AS o
     WHERE o.scope = p_scope AND o.operation = p_operation
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no outbound record for operation "%" in scope "%"',
              p_operation, p_scope
            USING ERRCODE = 'IK001';
    END IF;
    IF v_row.state = 'done' AND v_row.token = p_token THEN
        RAISE EXCEPTION 'operation "%" in scope "%" is already done with this token',
              p_operation, p_scope
            USING ERRCODE = 'IK003';
    END IF;
    IF v_row.state <> 'sending' OR v_row.token IS DISTINCT FROM p_token THEN
        RAISE EXCEPTION 'the token no longer holds operation "%" in scope "%"',
              p_operation, p_scope
            USING ERRCODE = 'IK002',
                  HINT = 'Its lease ended and another sender took it, or its result was recorded.';
    END IF;

    v_retryable := p_http_status IS NULL OR p_http_status IN (408, 409, 425, 429, 500, 502, 503, 504);
    IF NOT v_retryable THEN
        UPDATE idempotency.outbound AS o
           SET state = 'done', locked_until = NULL, last_status = p_http_status, last_error = NULL,
               response_status = p_http_status, response_body = p_response_body,
               response_headers = p_response_headers, finished_at = now(),
               expires_at = now() + idempotency.send_interval_setting('idempotency.default_ttl', interval '24 hours')
         WHERE o.scope = v_row.scope AND o.operation = v_row.operation
        RETURNING o.state, o.attempts, o.next_attempt_at INTO o_state, o_attempts, o_next_attempt_at;
        -- A final answer earns retries (the retry budget).
        PERFORM idempotency.send_count(v_row.target, 0, 0, 1, 0);
        RETURN NEXT;
        RETURN;
    END IF;

    -- Exponential backoff with full jitter, never sooner than the receiver's Retry-After.
    v_delay := greatest(coalesce(p_retry_after, interval '0'),
                        random() * least(v_cap, v_base * power(2, least(v_row.attempts - 1, 60))));
    IF now() + v_delay >= v_row.give_up_at THEN
        UPDATE idempotency.outbound AS o
           SET state = 'gave_up', token = NULL, locked_until = NULL, last_status = p_http_status,
               last_error = p_error, finished_at = now(),
               expires_at = now() + idempotency.send_interval_setting('idempotency.default_ttl', interval '24 hours')
         WHERE o.scope = v_row.scope AND o.operation = v_row.operation
        RETURNING o.state, o.attempts, o.next_attempt_at INTO o_state, o_attempts, o_next_attempt_at;
    ELSE
        UPDATE idempotency.outbound AS o
           SET state = 'pending', token = NULL, locked_until = NULL, last_status = p_http_status,
               last_error = p_error, next_attempt_at = now() + v_delay
         WHERE o.scope = v_row.scope AND o.operation = v_row.operation
        RETURNING o.state, o.attempts, o.next_attempt_at INTO o_state, o_attempts, o_next_attempt_at;
    END IF;
    -- A retryable answer stops what final answers had earned (the retry budget).
    PERFORM idempotency.send_count(v_row.target, 0, 0, 0, 1);
    RETURN NEXT;
END
$$;

-- idem_sweep's part (both editions call it last, with what is left of max_rows): deletes
-- done and gave_up rows past expires_at, oldest first, skipping rows another session holds,
-- and the budget's rows older than two windows (at least two minutes), skipping rows a
-- session holds. Returns the outbound rows deleted.
CREATE OR REPLACE FUNCTION idempotency.send_sweep(max_rows bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    deleted bigint := 0;
BEGIN
    -- A role granted only the tables of 0.4 (keys, messages) keeps sweeping those: the
    -- outbound rows wait for a role that may delete them.
    IF NOT (has_table_privilege('idempotency.outbound', 'SELECT') AND has_table_privilege('idempotency.outbound', 'UPDATE')
            AND has_table_privilege('idempotency.outbound', 'DELETE')
            AND has_table_privilege('idempotency.outbound_budget', 'DELETE')) THEN
        RETURN 0;
    END IF;
    IF max_rows > 0 THEN
        DELETE FROM idempotency.outbound AS o
         USING (SELECT p.scope, p.operation FROM idempotency.outbound AS p
                 WHERE p.expires_at <= now() AND p.state IN ('done', 'gave_up')
                 ORDER BY p.expires_at LIMIT max_rows FOR UPDATE SKIP LOCKED) AS picked
         WHERE o.scope = picked.scope AND o.operation = picked.operation;
        GET DIAGNOSTICS deleted = ROW_COUNT;
    END IF;
    DELETE FROM idempotency.outbound_budget AS b
     WHERE (b.target, b.bucket, b.backend_pid) IN (
           SELECT o.target, o.bucket, o.backend_pid FROM idempotency.outbound_budget AS o
            WHERE o.bucket < now() - 2 * greatest(idempotency.send_retry_window(), interval '1 minute')
              FOR UPDATE SKIP LOCKED);
    RETURN deleted;
END
$$;

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
              pg_catalog.current_setting('idempotency.tombstone_ttl', true), ''), '0')::interval) AS tombstones,
    (SELECT count(*) FROM idempotency.outbound WHERE state = 'pending')         AS outbound_pending,
    (SELECT count(*) FROM idempotency.outbound WHERE state = 'sending')         AS outbound_sending,
    (SELECT count(*) FROM idempotency.outbound WHERE state = 'done')            AS outbound_done,
    (SELECT count(*) FROM idempotency.outbound WHERE state = 'gave_up')         AS outbound_gave_up,
    (SELECT count(*) FROM idempotency.outbound
      WHERE state IN ('pending', 'sending') AND next_attempt_at <= now())      AS outbound_due,
    (SELECT now() - min(next_attempt_at) FROM idempotency.outbound
      WHERE state IN ('pending', 'sending') AND next_attempt_at <= now())      AS outbound_oldest_due_age,
    (SELECT max(finished_at) FROM idempotency.outbound WHERE state = 'gave_up') AS outbound_last_gave_up_at;

COMMENT ON VIEW idempotency.stats IS
    'One row for monitoring: live records by status, stale claims (lease ended), expired rows '
    'awaiting idem_sweep, the age of the oldest in_progress claim, and tombstones (expired '
    'completed records inside idempotency.tombstone_ttl; counted in expired too), the '
    'sending side''s idempotency.outbound rows by state, the sends due now (not yet handed to a '
    'sender), how long the oldest of them has been due, and when a send last gave up.';
