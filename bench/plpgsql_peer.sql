-- The PL/pgSQL peer: the same SQL contract as the extension, written by hand the way a
-- competent user would, in schema `peer`. It is what a user would otherwise write, so it is
-- the implementation the extension has to beat. It keeps the contract's outcomes, errors,
-- settings and "retries cost a read" property:
--
--   claim     read first; no record: INSERT ... ON CONFLICT DO NOTHING (lost the race: read
--             again); an expired record: replace it, fenced on the token read; a live one:
--             mismatch / replay / in_progress from the read alone (no write, no xid, no lock);
--             an in_progress record whose lease ended: take it over, fenced on the token read.
--   complete  one UPDATE fenced on token and status; when it touches nothing, a read says why
--             (IK001 / IK002 / IK003).
--   seen      read first (a duplicate costs a read); else INSERT ... ON CONFLICT DO UPDATE
--             only when the old row expired.
--   fingerprint  'sha256:' || hex of the jsonb's text form (not RFC 8785 canonical JSON: the
--             extension's fingerprint does more work for a stronger answer).
--
-- Same table layout, constraints and indexes as idempotency.keys / idempotency.messages
-- (release 0.2.0: no CHECK constraints, the partial index's predicate names locked_until).
-- Load with: psql -v ON_ERROR_STOP=1 -f bench/plpgsql_peer.sql

DROP SCHEMA IF EXISTS peer CASCADE;
CREATE SCHEMA peer;

CREATE TABLE peer.keys (
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
CREATE INDEX keys_expires_at_idx ON peer.keys (expires_at);
CREATE INDEX keys_in_progress_idx ON peer.keys (locked_until)
    WHERE status = 'in_progress' AND locked_until IS NOT NULL;

CREATE TABLE peer.messages (
    scope      text        NOT NULL,
    message_id text        NOT NULL,
    seen_at    timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    CONSTRAINT messages_pkey PRIMARY KEY (scope, message_id)
);
CREATE INDEX messages_expires_at_idx ON peer.messages (expires_at);

CREATE TYPE peer.claim_result AS (
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

-- Argument checks are written inline in each function (22004 for NULL, 22023 for an empty
-- value, one over 255 characters or one holding control characters; a non-positive ttl or
-- lease): a helper function per check would cost a PL/pgSQL call each.

CREATE FUNCTION peer.claim(
    p_scope text, p_key text, p_fingerprint text DEFAULT NULL,
    p_ttl interval DEFAULT NULL, p_lease interval DEFAULT NULL
) RETURNS peer.claim_result
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now      timestamptz := now();
    v_expires  timestamptz;
    v_lease    timestamptz;
    v_ttl      interval;
    v_lease_len interval;
    v_token    uuid;
    r          peer.keys%ROWTYPE;
    res        peer.claim_result;
    v_rp       text;
    v_rd       jsonb;
BEGIN
    IF p_scope IS NULL THEN
        RAISE EXCEPTION 'argument "scope" must not be null' USING ERRCODE = '22004';
    END IF;
    IF p_scope = '' OR length(p_scope) > 255 OR p_scope ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'invalid argument "scope": must be 1 to 255 characters without control characters'
            USING ERRCODE = '22023';
    END IF;
    IF p_key IS NULL THEN
        RAISE EXCEPTION 'argument "key" must not be null' USING ERRCODE = '22004';
    END IF;
    IF p_key = '' OR length(p_key) > 255 OR p_key ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'invalid argument "key": must be 1 to 255 characters without control characters'
            USING ERRCODE = '22023';
    END IF;
    v_ttl := coalesce(p_ttl, nullif(current_setting('peer.default_ttl', true), '')::interval, interval '24 hours');
    IF v_ttl <= interval '0' OR v_ttl > interval '10000 years' THEN
        RAISE EXCEPTION 'invalid argument "ttl": must be a positive interval' USING ERRCODE = '22023';
    END IF;
    v_lease_len := coalesce(p_lease, nullif(current_setting('peer.default_lease', true), '')::interval, interval '5 minutes');
    IF v_lease_len <= interval '0' OR v_lease_len > interval '10000 years' THEN
        RAISE EXCEPTION 'invalid argument "lease": must be a positive interval' USING ERRCODE = '22023';
    END IF;
    v_expires := v_now + v_ttl;
    v_lease   := v_now + v_lease_len;

    FOR round IN 1..10 LOOP
        SELECT * INTO r FROM peer.keys WHERE scope = p_scope AND key = p_key;

        IF NOT FOUND THEN
            v_token := gen_random_uuid();
            INSERT INTO peer.keys (scope, key, fingerprint, status, token, attempts, locked_until,
                                   created_at, updated_at, expires_at)
            VALUES (p_scope, p_key, p_fingerprint, 'in_progress', v_token, 1, v_lease,
                    v_now, v_now, v_expires)
            ON CONFLICT (scope, key) DO NOTHING;
            IF FOUND THEN
                res.outcome := 'claimed'; res.token := v_token; res.attempts := 1;
                res.expires_at := v_expires; res.locked_until := v_lease;
                RETURN res;
            END IF;
            CONTINUE;  -- another transaction inserted it first: read what it left
        END IF;

        IF r.expires_at <= v_now THEN  -- expired: as if absent; replace it, fenced on its token
            v_token := gen_random_uuid();
            UPDATE peer.keys
               SET fingerprint = p_fingerprint, status = 'in_progress', token = v_token, attempts = 1,
                   locked_until = v_lease, recovery_point = NULL, recovery_data = NULL,
                   response_status = NULL, response_headers = NULL, response_body = NULL,
                   created_at = v_now, updated_at = v_now, completed_at = NULL, expires_at = v_expires
             WHERE scope = p_scope AND key = p_key AND token = r.token AND expires_at <= v_now;
            IF FOUND THEN
                res.outcome := 'claimed'; res.token := v_token; res.attempts := 1;
                res.expires_at := v_expires; res.locked_until := v_lease;
                RETURN res;
            END IF;
            CONTINUE;
        END IF;

        IF r.fingerprint IS DISTINCT FROM p_fingerprint THEN
            res.outcome := 'mismatch'; res.http_status := 422; res.expires_at := r.expires_at;
            RETURN res;
        END IF;
        IF r.status = 'completed' THEN
            res.outcome := 'replay'; res.http_status := r.response_status;
            res.response_status := r.response_status; res.response_headers := r.response_headers;
            res.response_body := r.response_body; res.attempts := r.attempts;
            res.expires_at := r.expires_at;
            RETURN res;
        END IF;
        IF r.locked_until > v_now THEN
            res.outcome := 'in_progress'; res.http_status := 409; res.attempts := r.attempts;
            res.expires_at := r.expires_at; res.locked_until := r.locked_until;
            RETURN res;
        END IF;

        -- The owner's lease ended: take the claim over, fenced on the token read.
        v_token := gen_random_uuid();
        UPDATE peer.keys
           SET token = v_token, attempts = r.attempts + 1, locked_until = v_lease, updated_at = v_now,
               expires_at = greatest(r.expires_at, v_expires)
         WHERE scope = p_scope AND key = p_key AND token = r.token AND status = 'in_progress'
           AND locked_until <= v_now AND expires_at > v_now
        RETURNING recovery_point, recovery_data INTO v_rp, v_rd;
        IF FOUND THEN
            res.outcome := 'reclaimed'; res.token := v_token; res.attempts := r.attempts + 1;
            res.recovery_point := v_rp; res.recovery_data := v_rd;
            res.expires_at := greatest(r.expires_at, v_expires); res.locked_until := v_lease;
            RETURN res;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'could not claim scope %, key %: it kept changing concurrently', p_scope, p_key
        USING ERRCODE = '40001';
END
$$;

CREATE FUNCTION peer.complete(
    p_scope text, p_key text, p_token uuid, p_response_status int,
    p_response_body jsonb DEFAULT NULL, p_response_headers jsonb DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now timestamptz := now();
    r     record;
BEGIN
    IF p_scope IS NULL THEN
        RAISE EXCEPTION 'argument "scope" must not be null' USING ERRCODE = '22004';
    END IF;
    IF p_scope = '' OR length(p_scope) > 255 OR p_scope ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'invalid argument "scope": must be 1 to 255 characters without control characters'
            USING ERRCODE = '22023';
    END IF;
    IF p_key IS NULL THEN
        RAISE EXCEPTION 'argument "key" must not be null' USING ERRCODE = '22004';
    END IF;
    IF p_key = '' OR length(p_key) > 255 OR p_key ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'invalid argument "key": must be 1 to 255 characters without control characters'
            USING ERRCODE = '22023';
    END IF;
    IF p_token IS NULL THEN
        RAISE EXCEPTION 'argument "token" must not be null' USING ERRCODE = '22004';
    END IF;
    IF p_response_status IS NULL THEN
        RAISE EXCEPTION 'argument "response_status" must not be null' USING ERRCODE = '22004';
    END IF;
    IF p_response_status NOT BETWEEN 100 AND 599 THEN
        RAISE EXCEPTION 'invalid argument "response_status": must be between 100 and 599' USING ERRCODE = '22023';
    END IF;
    IF p_response_headers IS NOT NULL AND jsonb_typeof(p_response_headers) <> 'object' THEN
        RAISE EXCEPTION 'invalid argument "response_headers": must be a JSON object' USING ERRCODE = '22023';
    END IF;

    UPDATE peer.keys
       SET status = 'completed', locked_until = NULL, response_status = p_response_status,
           response_headers = p_response_headers, response_body = p_response_body,
           completed_at = v_now, updated_at = v_now
     WHERE scope = p_scope AND key = p_key AND token = p_token AND status = 'in_progress'
       AND expires_at > v_now;
    IF FOUND THEN
        RETURN;
    END IF;

    SELECT token, status, expires_at INTO r FROM peer.keys WHERE scope = p_scope AND key = p_key;
    IF NOT FOUND OR r.expires_at <= v_now THEN
        RAISE EXCEPTION 'no live idempotency record for scope %, key %', p_scope, p_key USING ERRCODE = 'IK001';
    ELSIF r.token <> p_token OR r.status <> 'completed' THEN
        RAISE EXCEPTION 'token does not own the idempotency record for scope %, key %', p_scope, p_key
            USING ERRCODE = 'IK002';
    ELSE
        RAISE EXCEPTION 'idempotency record for scope %, key % is already completed', p_scope, p_key
            USING ERRCODE = 'IK003';
    END IF;
END
$$;

CREATE FUNCTION peer.seen(p_scope text, p_message_id text, p_ttl interval DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now     timestamptz := now();
    v_expires timestamptz;
    v_live    timestamptz;
    v_ttl     interval;
BEGIN
    IF p_scope IS NULL THEN
        RAISE EXCEPTION 'argument "scope" must not be null' USING ERRCODE = '22004';
    END IF;
    IF p_scope = '' OR length(p_scope) > 255 OR p_scope ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'invalid argument "scope": must be 1 to 255 characters without control characters'
            USING ERRCODE = '22023';
    END IF;
    IF p_message_id IS NULL THEN
        RAISE EXCEPTION 'argument "message_id" must not be null' USING ERRCODE = '22004';
    END IF;
    IF p_message_id = '' OR length(p_message_id) > 255 OR p_message_id ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'invalid argument "message_id": must be 1 to 255 characters without control characters'
            USING ERRCODE = '22023';
    END IF;
    v_ttl := coalesce(p_ttl, nullif(current_setting('peer.default_ttl', true), '')::interval, interval '24 hours');
    IF v_ttl <= interval '0' OR v_ttl > interval '10000 years' THEN
        RAISE EXCEPTION 'invalid argument "ttl": must be a positive interval' USING ERRCODE = '22023';
    END IF;
    v_expires := v_now + v_ttl;

    SELECT expires_at INTO v_live FROM peer.messages WHERE scope = p_scope AND message_id = p_message_id;
    IF FOUND AND v_live > v_now THEN
        RETURN false;  -- a duplicate: answered from the read, nothing written
    END IF;
    INSERT INTO peer.messages AS m (scope, message_id, seen_at, expires_at)
    VALUES (p_scope, p_message_id, v_now, v_expires)
    ON CONFLICT (scope, message_id) DO UPDATE SET seen_at = v_now, expires_at = v_expires
        WHERE m.expires_at <= v_now;
    RETURN FOUND;
END
$$;

-- The fingerprint a user writes by hand: the hash of jsonb's text form.
CREATE FUNCTION peer.fingerprint(payload jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 'sha256:' || encode(sha256(convert_to(payload::text, 'UTF8')), 'hex');
