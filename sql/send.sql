-- The sending side (docs/sending.md): the outbound record, the retry budget, idem_send and
-- the sweep's part. Shared by both editions: the native build reads this file
-- (extension_sql_file! in src/lib.rs) and the portable release names each statement
-- (sql/portable/release.sql.in). idem_send_next and idem_send_result are each edition's own
-- (0.6.0): the native library's (src/api/send_next.rs, send_result.rs) and the portable
-- edition's PL/pgSQL (sql/portable/functions/send.sql), held to the same answers by the
-- regress tests; both read the budget through send_retry_allowance below.
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

-- idem_send is SQL over this PL/pgSQL body: its arguments and result columns share names
-- (scope, key, ...), which PL/pgSQL refuses.
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
