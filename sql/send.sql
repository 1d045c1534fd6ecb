-- The sending side (docs/sending.md): the outbound record, the retry budget and the three
-- idem_send* functions. Shared by both editions: the native build reads this file
-- (extension_sql_file! in src/lib.rs) and the portable release names each statement
-- (sql/portable/release.sql.in). Plain SQL and PL/pgSQL only, so the two cannot drift.
--
-- A row's due time is next_attempt_at in both live states: `pending` (when its next attempt
-- may start) and `sending` (when its lease ends and another sender may take it). One partial
-- index on (target, next_attempt_at) then finds every due row.

CREATE TABLE idempotency.outbound (
    scope              text        NOT NULL,
    operation          text        NOT NULL,
    key                text        NOT NULL,
    target             text        NOT NULL,
    request            jsonb,
    request_fingerprint text,
    state              text        NOT NULL DEFAULT 'pending',
    attempts           int         NOT NULL DEFAULT 0,
    next_attempt_at    timestamptz NOT NULL,
    give_up_at         timestamptz NOT NULL,
    token              uuid,
    locked_until       timestamptz,
    last_status        int,
    last_error         text,
    response_status    int,
    response_body      text,
    response_headers   jsonb,
    created_at         timestamptz NOT NULL,
    finished_at        timestamptz,
    expires_at         timestamptz,
    CONSTRAINT outbound_pkey PRIMARY KEY (scope, operation),
    CONSTRAINT outbound_state_check CHECK (state IN ('pending', 'sending', 'done', 'gave_up'))
);

COMMENT ON TABLE idempotency.outbound IS
    'One row per (scope, operation) the application sends to another service with an '
    'Idempotency-Key: written by idem_send in the business transaction, handed to senders by '
    'idem_send_next, finished by idem_send_result. done: the receiver''s final answer is in '
    'response_*; gave_up: no final answer before give_up_at, the outcome at the receiver is unknown.';

-- What idem_send_next reads, each in its order: first attempts, retries (a row being sent has
-- attempts > 0: its lease may end), and rows past give_up_at. Apart, so that a backlog of one
-- kind is never scanned to find the other.
CREATE INDEX outbound_first_due_idx ON idempotency.outbound (target, next_attempt_at)
    WHERE state = 'pending' AND attempts = 0;

CREATE INDEX outbound_retry_due_idx ON idempotency.outbound (target, next_attempt_at)
    WHERE state IN ('pending', 'sending') AND attempts > 0;

CREATE INDEX outbound_give_up_idx ON idempotency.outbound (target, give_up_at)
    WHERE state IN ('pending', 'sending');

CREATE INDEX outbound_expires_at_idx ON idempotency.outbound (expires_at)
    WHERE expires_at IS NOT NULL;

-- Sends that gave up, by when: idempotency.stats counts them and finds the latest (an alert
-- reads it) without reading the done rows.
CREATE INDEX outbound_gave_up_idx ON idempotency.outbound (finished_at)
    WHERE state = 'gave_up';

ALTER TABLE idempotency.outbound SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01
);

SELECT pg_catalog.pg_extension_config_dump('idempotency.outbound', '');

-- The retry budget, per target: the attempts idem_send_next handed out and the answers
-- idem_send_result recorded, counted in buckets of a sixtieth of idempotency.send_retry_window
-- (1 second by default). A backend counts in rows of its own (backend_pid): no two sessions
-- ever write the same row, so counting never waits for a lock. The budget sums the window.
CREATE TABLE idempotency.outbound_budget (
    target            text        NOT NULL,
    bucket            timestamptz NOT NULL,
    backend_pid       int         NOT NULL,
    first_attempts    bigint      NOT NULL DEFAULT 0,
    retries           bigint      NOT NULL DEFAULT 0,
    final_answers     bigint      NOT NULL DEFAULT 0,
    retryable_answers bigint      NOT NULL DEFAULT 0,
    CONSTRAINT outbound_budget_pkey PRIMARY KEY (target, bucket, backend_pid)
);

COMMENT ON TABLE idempotency.outbound_budget IS
    'Per target, the first attempts and retries handed out by idem_send_next and the final and '
    'retryable answers recorded by idem_send_result, in buckets of a sixtieth of '
    'idempotency.send_retry_window, one row per backend and bucket: the retry budget sums the '
    'window. Rows older than two windows (at least two minutes) are deleted as senders go and by '
    'idem_sweep.';

-- What is wrong with a scope, operation, target or key (NULL: nothing), as the idempotency
-- key rule: 1 to 255 characters, no control characters (U+0000-U+001F, U+007F-U+009F).
CREATE FUNCTION idempotency.send_text_problem(val text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bad text;
BEGIN
    IF val = '' THEN
        RETURN 'must not be empty';
    END IF;
    bad := substring(val FROM '[\x01-\x1f\x7f-\x9f]');
    IF bad IS NOT NULL THEN
        RETURN format('must not contain control characters (found U+%s)', upper(lpad(to_hex(ascii(bad)), 4, '0')));
    END IF;
    IF length(val) > 255 THEN
        RETURN format('must be at most 255 characters (got %s)', length(val));
    END IF;
    RETURN NULL;
END
$$;

-- Raises 22004 for a NULL, 22023 for a bad value, naming the argument.
CREATE FUNCTION idempotency.send_check_text(arg text, val text) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF val IS NULL THEN
        RAISE EXCEPTION 'argument "%" must not be null', arg USING ERRCODE = '22004';
    END IF;
    IF idempotency.send_text_problem(val) IS NOT NULL THEN
        RAISE EXCEPTION 'invalid argument "%": %', arg, idempotency.send_text_problem(val)
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- An interval argument or setting: positive, at most 10000 years (22023 naming it).
CREATE FUNCTION idempotency.send_check_interval(what text, val interval) RETURNS interval
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF val IS NOT NULL AND (val <= interval '0' OR val > interval '10000 years') THEN
        RAISE EXCEPTION 'invalid %: % (it must be a positive interval of at most 10000 years)', what, val
            USING ERRCODE = '22023';
    END IF;
    RETURN val;
END
$$;

-- The interval setting `name`, or `fallback` when it is not set. The native edition checks
-- the value when it is SET; the portable edition reads a placeholder, checked here.
CREATE FUNCTION idempotency.send_interval_setting(name text, fallback interval) RETURNS interval
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    raw text := current_setting(name, true);
    val interval;
BEGIN
    IF raw IS NULL OR raw = '' THEN
        RETURN fallback;
    END IF;
    BEGIN
        val := raw::interval;
    EXCEPTION WHEN data_exception OR syntax_error THEN
        RAISE EXCEPTION 'invalid value for setting "%": "%" (it must be a positive interval of at most 10000 years)', name, raw
            USING ERRCODE = '22023';
    END;
    RETURN idempotency.send_check_interval('value for setting "' || name || '"', val);
END
$$;

-- idempotency.send_retry_budget: a ratio, 0 or more (0: no retries), default 0.1.
CREATE FUNCTION idempotency.send_retry_budget() RETURNS float8
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    raw text := current_setting('idempotency.send_retry_budget', true);
    val float8;
BEGIN
    IF raw IS NULL OR raw = '' THEN
        RETURN 0.1;
    END IF;
    BEGIN
        val := raw::float8;
    EXCEPTION WHEN data_exception OR syntax_error THEN
        val := NULL;
    END;
    IF val IS NULL OR val < 0 OR val = 'NaN'::float8 OR val = 'Infinity'::float8 THEN
        RAISE EXCEPTION 'invalid value for setting "idempotency.send_retry_budget": "%" (it must be a number of 0 or more)', raw
            USING ERRCODE = '22023';
    END IF;
    RETURN val;
END
$$;

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

-- The three idem_send* functions are SQL over these PL/pgSQL bodies: their arguments and
-- result columns share names (scope, key, ...), which PL/pgSQL refuses.
CREATE FUNCTION idempotency.send_prepare(p_scope text, p_operation text, p_target text, p_request jsonb,
                                         p_key text, p_give_up_after interval)
RETURNS SETOF idempotency.outbound
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key text := p_key;
    v_after interval;
    v_fingerprint text;
    v_row idempotency.outbound;
BEGIN
    PERFORM idempotency.send_check_text('scope', p_scope);
    PERFORM idempotency.send_check_text('operation', p_operation);
    PERFORM idempotency.send_check_text('target', p_target);
    IF v_key IS NOT NULL THEN
        PERFORM idempotency.send_check_text('key', v_key);
    END IF;
    v_after := coalesce(idempotency.send_check_interval('argument "give_up_after"', p_give_up_after),
                        idempotency.send_interval_setting('idempotency.send_give_up_after', interval '23 hours'));
    IF p_request IS NOT NULL THEN
        v_fingerprint := idempotency.idem_fingerprint(p_request);
    END IF;

    INSERT INTO idempotency.outbound AS o
           (scope, operation, key, target, request, request_fingerprint, state, attempts,
            next_attempt_at, give_up_at, created_at)
    VALUES (p_scope, p_operation, coalesce(v_key, gen_random_uuid()::text),
            p_target, p_request, v_fingerprint, 'pending', 0,
            now(), now() + v_after, now())
    ON CONFLICT ON CONSTRAINT outbound_pkey DO NOTHING
    RETURNING o.* INTO v_row;

    IF FOUND THEN
        -- Wakes the senders that LISTEN, at COMMIT (a rollback sends nothing).
        PERFORM pg_notify('idempotency_send', p_target);
    ELSE
        SELECT o.* INTO v_row FROM idempotency.outbound AS o
         WHERE o.scope = p_scope AND o.operation = p_operation;
        IF NOT FOUND THEN
            -- Another transaction's row, committed after this snapshot (REPEATABLE READ).
            RAISE EXCEPTION 'operation "%" in scope "%" was recorded by a concurrent transaction',
                  p_operation, p_scope
                USING ERRCODE = '40001';
        END IF;
        IF v_row.target IS DISTINCT FROM p_target
           OR v_row.request_fingerprint IS DISTINCT FROM v_fingerprint
           OR (v_key IS NOT NULL AND v_row.key IS DISTINCT FROM v_key) THEN
            RAISE EXCEPTION 'operation "%" in scope "%" is already recorded with another %',
                  p_operation, p_scope,
                  CASE WHEN v_row.target IS DISTINCT FROM p_target THEN 'target'
                       WHEN v_row.request_fingerprint IS DISTINCT FROM v_fingerprint THEN 'request'
                       ELSE 'key' END
                USING ERRCODE = 'IK004',
                      HINT = 'An operation is sent once; give a new operation id for a new request.';
        END IF;
    END IF;
    RETURN NEXT v_row;
END
$$;

CREATE FUNCTION idempotency.idem_send(
    scope text,
    operation text,
    target text,
    request jsonb DEFAULT NULL,
    key text DEFAULT NULL,
    give_up_after interval DEFAULT NULL
) RETURNS TABLE (key text, state text, attempts int, next_attempt_at timestamptz,
                 response_status int, response_body text, response_headers jsonb)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT o.key, o.state, o.attempts, o.next_attempt_at, o.response_status, o.response_body, o.response_headers
      FROM idempotency.send_prepare($1, $2, $3, $4, $5, $6) AS o
$$;

-- The retries `target` may still be handed out now (send_retries_allowed), from its counts
-- over the window: retries in every bucket that overlaps it, first attempts in the buckets
-- inside it, so that counting in buckets never loosens the bound.
CREATE FUNCTION idempotency.send_retry_allowance(target text) RETURNS bigint
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

-- One due row (locked by the caller): handed out (its new token: sending under a new lease,
-- attempts + 1), or, past give_up_at, gave_up (NULL).
CREATE FUNCTION idempotency.send_hand_out(r idempotency.outbound, lease interval) RETURNS uuid
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_token uuid;
BEGIN
    IF r.give_up_at <= now() THEN
        UPDATE idempotency.outbound AS o
           SET state = 'gave_up', token = NULL, locked_until = NULL, finished_at = now(),
               expires_at = now() + idempotency.send_interval_setting('idempotency.default_ttl', interval '24 hours'),
               last_error = coalesce(CASE WHEN r.state = 'sending' THEN 'lease ended without a result' END, o.last_error)
         WHERE o.scope = r.scope AND o.operation = r.operation;
        RETURN NULL;
    END IF;
    UPDATE idempotency.outbound AS o
       SET state = 'sending', attempts = o.attempts + 1, token = gen_random_uuid(),
           locked_until = now() + lease, next_attempt_at = now() + lease,
           last_error = CASE WHEN r.state = 'sending' THEN 'lease ended without a result' ELSE o.last_error END
     WHERE o.scope = r.scope AND o.operation = r.operation
    RETURNING o.token INTO v_token;
    RETURN v_token;
END
$$;

CREATE FUNCTION idempotency.send_take(p_target text, p_max_rows int, p_lease interval,
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

CREATE FUNCTION idempotency.idem_send_next(
    target text DEFAULT NULL,
    max_rows int DEFAULT 1,
    lease interval DEFAULT NULL,
    scope text DEFAULT NULL,
    operation text DEFAULT NULL
) RETURNS TABLE (scope text, operation text, target text, key text, request jsonb,
                 attempt int, token uuid, locked_until timestamptz, give_up_at timestamptz)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM idempotency.send_take($1, $2, $3, $4, $5)
$$;

CREATE FUNCTION idempotency.send_finish(p_scope text, p_operation text, p_token uuid, p_http_status int,
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

CREATE FUNCTION idempotency.idem_send_result(
    scope text,
    operation text,
    token uuid,
    http_status int DEFAULT NULL,
    response_body text DEFAULT NULL,
    response_headers jsonb DEFAULT NULL,
    retry_after interval DEFAULT NULL,
    error text DEFAULT NULL
) RETURNS TABLE (state text, attempts int, next_attempt_at timestamptz)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM idempotency.send_finish($1, $2, $3, $4, $5, $6, $7, $8)
$$;

-- idem_sweep's part (both editions call it last, with what is left of max_rows): deletes
-- done and gave_up rows past expires_at, oldest first, skipping rows another session holds,
-- and the budget's rows older than two windows (at least two minutes), skipping rows a
-- session holds. Returns the outbound rows deleted.
CREATE FUNCTION idempotency.send_sweep(max_rows bigint) RETURNS bigint
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
