-- The portable edition's idem_send_next and idem_send_result (the native edition's are in the
-- library: src/api/send_next.rs, send_result.rs, send_budget.rs), with the retry budget's
-- counting. The same answers, errors and SQLSTATEs in both editions: the regress tests 17_send,
-- 18_lease_length, 19_send_backoff and 23_send_budget run against both. What is shared (the
-- outbound tables, idem_send, the budget's arithmetic, the sweep) is in sql/send.sql.
-- Until 0.6.0 both editions ran these; an upgraded native database drops them
-- (sql/idempotency--0.5.0--0.6.0.sql).

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
