-- ---------------------------------------------------------------------------------------
-- idem_complete, idem_checkpoint and idem_release: one statement fenced on the token;
-- when it touches no row, a read says why. Claims in flight live in their own partition
-- (keys_claims, sql/bootstrap.sql): each statement names the partition key, so that the
-- planner reads only that one.

-- Why a statement fenced on `token` touched no claim of (scope, key), from the record as a
-- read finds it now (after the write: a fresh snapshot), the 0.5.0 table included while it is
-- there: IK001 (no live record), IK003 (completed by this token) or IK002 (another owner).
CREATE FUNCTION idempotency.portable_not_owned(scope text, key text, token uuid, now_ timestamptz) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    rec record;
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_class AS c WHERE c.relnamespace = 'idempotency'::pg_catalog.regnamespace AND c.relname = 'keys_legacy') THEN
        SELECT r.token, r.status, r.expires_at INTO rec
          FROM (SELECT k.token, k.status, k.expires_at FROM idempotency.keys AS k
                 WHERE k.scope = portable_not_owned.scope AND k.key = portable_not_owned.key
                UNION ALL
                SELECT l.token, l.status, l.expires_at FROM idempotency.keys_legacy AS l
                 WHERE l.scope = portable_not_owned.scope AND l.key = portable_not_owned.key) AS r
         ORDER BY r.expires_at DESC LIMIT 1;
    ELSE
        SELECT k.token, k.status, k.expires_at INTO rec
          FROM idempotency.keys AS k WHERE k.scope = portable_not_owned.scope AND k.key = portable_not_owned.key
         ORDER BY k.expires_at DESC LIMIT 1;
    END IF;
    RETURN CASE WHEN NOT FOUND OR rec.expires_at <= now_ THEN 'IK001'
                WHEN rec.token = portable_not_owned.token AND rec.status = 'completed' THEN 'IK003'
                ELSE 'IK002' END;
END
$$;

CREATE FUNCTION idempotency.idem_complete(
    scope text,
    key text,
    token uuid,
    response_status int,
    response_body jsonb DEFAULT NULL,
    response_headers jsonb DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text;
    now_ timestamptz := now();
    size bigint;
    size_limit bigint;
    n bigint;
BEGIN
    problem := coalesce(idempotency.portable_key_error('scope', scope), idempotency.portable_key_error('key', key));
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    IF token IS NULL THEN
        RAISE EXCEPTION 'argument "token" must not be null' USING ERRCODE = '22004';
    END IF;
    IF response_status IS NULL THEN
        RAISE EXCEPTION 'argument "response_status" must not be null' USING ERRCODE = '22004';
    END IF;
    IF response_status < 100 OR response_status > 599 THEN
        RAISE EXCEPTION 'invalid argument "response_status": must be between 100 and 599 (got %)', response_status
            USING ERRCODE = '22023';
    END IF;
    IF response_headers IS NOT NULL AND jsonb_typeof(response_headers) <> 'object' THEN
        RAISE EXCEPTION 'invalid argument "response_headers": must be a JSON object (got %)',
            CASE WHEN jsonb_typeof(response_headers) = 'array' THEN 'array' ELSE 'scalar' END
            USING ERRCODE = '22023';
    END IF;
    size_limit := idempotency.portable_max_response_bytes();
    IF size_limit IS NULL THEN
        RAISE EXCEPTION 'invalid value for setting "idempotency.max_response_size": "%"', current_setting('idempotency.max_response_size', true)
            USING ERRCODE = '22023', DETAIL = 'The value must be between 1kB and 1GB (an integer is kB).';
    END IF;
    size := idempotency.portable_raw_size(response_body) + idempotency.portable_raw_size(response_headers);
    IF size > size_limit THEN
        RAISE EXCEPTION 'argument "response_body" is too large to store: % bytes, the limit is % bytes', size, size_limit
            USING ERRCODE = '54000',
                  HINT = 'Raise idempotency.max_response_size, or store a reference to the data instead of the data.';
    END IF;
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'idem_complete cannot run on a read-only server'
            USING ERRCODE = '25006', HINT = 'Claims must run on the primary; idem_lookup works on a standby.';
    END IF;

    -- The claim leaves the claims' partition and its completed record goes to the partition
    -- of its expiry: one statement (a takeover that waited on the claim finds it gone and
    -- reads again).
    WITH claim AS (
        DELETE FROM idempotency.keys AS k
         WHERE (CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) = '-infinity'
           AND k.scope = idem_complete.scope AND k.key = idem_complete.key
           AND k.token = idem_complete.token AND k.status = 'in_progress'
           AND k.expires_at > now_
        RETURNING k.scope, k.key, k.fingerprint, k.token, k.attempts, k.recovery_point, k.recovery_data,
                  k.created_at, k.expires_at)
    INSERT INTO idempotency.keys
           (scope, key, fingerprint, status, token, attempts, locked_until, recovery_point,
            recovery_data, response_status, response_headers, response_body, created_at,
            updated_at, completed_at, expires_at)
    SELECT c.scope, c.key, c.fingerprint, 'completed', c.token, c.attempts, NULL, c.recovery_point,
           c.recovery_data, idem_complete.response_status, idem_complete.response_headers,
           idem_complete.response_body, c.created_at, now_, now_, c.expires_at
      FROM claim AS c;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n = 1 THEN
        RETURN;
    END IF;
    problem := idempotency.portable_not_owned(scope, key, token, now_);
    IF problem = 'IK001' THEN
        RAISE EXCEPTION 'no live idempotency record for scope %, key %',
            idempotency.portable_quote(scope), idempotency.portable_quote(key)
            USING ERRCODE = 'IK001', DETAIL = 'The key was never claimed, was released, or its record expired.';
    ELSIF problem = 'IK003' THEN
        RAISE EXCEPTION 'idempotency record for scope %, key % is already completed',
            idempotency.portable_quote(scope), idempotency.portable_quote(key)
            USING ERRCODE = 'IK003',
                  HINT = 'Call idem_complete once per claim; retries get the stored response from idem_claim.';
    ELSE
        RAISE EXCEPTION 'token does not own the idempotency record for scope %, key %',
            idempotency.portable_quote(scope), idempotency.portable_quote(key)
            USING ERRCODE = 'IK002',
                  DETAIL = 'Another worker took the claim over after its lease ended, or the claim was released.',
                  HINT = 'Do not report success: the current owner will finish the operation. Renew long leases with idem_checkpoint.';
    END IF;
END
$$;

CREATE FUNCTION idempotency.idem_checkpoint(
    scope text,
    key text,
    token uuid,
    recovery_point text,
    recovery_data jsonb DEFAULT NULL,
    lease interval DEFAULT NULL
) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text;
    now_ timestamptz := now();
    size bigint;
    size_limit bigint;
    lease_end timestamptz;
    lease_given boolean;
    n bigint;
BEGIN
    problem := coalesce(idempotency.portable_key_error('scope', scope), idempotency.portable_key_error('key', key));
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    IF token IS NULL THEN
        RAISE EXCEPTION 'argument "token" must not be null' USING ERRCODE = '22004';
    END IF;
    IF recovery_point IS NULL THEN
        RAISE EXCEPTION 'argument "recovery_point" must not be null' USING ERRCODE = '22004';
    END IF;
    size_limit := idempotency.portable_max_response_bytes();
    IF size_limit IS NULL THEN
        RAISE EXCEPTION 'invalid value for setting "idempotency.max_response_size": "%"', current_setting('idempotency.max_response_size', true)
            USING ERRCODE = '22023', DETAIL = 'The value must be between 1kB and 1GB (an integer is kB).';
    END IF;
    size := idempotency.portable_raw_size(recovery_data) + octet_length(recovery_point);
    IF size > size_limit THEN
        RAISE EXCEPTION 'argument "recovery_data" is too large to store: % bytes, the limit is % bytes', size, size_limit
            USING ERRCODE = '54000',
                  HINT = 'Raise idempotency.max_response_size, or store a reference to the data instead of the data.';
    END IF;
    lease_given := lease IS NOT NULL;
    SELECT a.value, a.problem INTO lease, problem
      FROM idempotency.portable_interval_arg('lease', lease, 'idempotency.default_lease', interval '5 minutes') AS a;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'idem_checkpoint cannot run on a read-only server'
            USING ERRCODE = '25006', HINT = 'Claims must run on the primary; idem_lookup works on a standby.';
    END IF;

    -- Without a lease the claim keeps the length of the lease it was made with: every write
    -- of locked_until sets updated_at to the same now, so the difference is that length.
    UPDATE idempotency.keys AS k
       SET recovery_point = idem_checkpoint.recovery_point, recovery_data = idem_checkpoint.recovery_data,
           locked_until = now_ + CASE WHEN NOT lease_given AND k.locked_until > k.updated_at
                                      THEN k.locked_until - k.updated_at ELSE lease END,
           updated_at = now_
     WHERE (CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) = '-infinity'
       AND k.scope = idem_checkpoint.scope AND k.key = idem_checkpoint.key
       AND k.token = idem_checkpoint.token AND k.status = 'in_progress'
       AND k.expires_at > now_
    RETURNING k.locked_until INTO lease_end;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n = 1 THEN
        RETURN lease_end;
    END IF;
    problem := idempotency.portable_not_owned(scope, key, token, now_);
    IF problem = 'IK001' THEN
        RAISE EXCEPTION 'no live idempotency record for scope %, key %',
            idempotency.portable_quote(scope), idempotency.portable_quote(key)
            USING ERRCODE = 'IK001', DETAIL = 'The key was never claimed, was released, or its record expired.';
    ELSIF problem = 'IK003' THEN
        RAISE EXCEPTION 'idempotency record for scope %, key % is already completed',
            idempotency.portable_quote(scope), idempotency.portable_quote(key)
            USING ERRCODE = 'IK003',
                  HINT = 'Call idem_complete once per claim; retries get the stored response from idem_claim.';
    ELSE
        RAISE EXCEPTION 'token does not own the idempotency record for scope %, key %',
            idempotency.portable_quote(scope), idempotency.portable_quote(key)
            USING ERRCODE = 'IK002',
                  DETAIL = 'Another worker took the claim over after its lease ended, or the claim was released.',
                  HINT = 'Do not report success: the current owner will finish the operation. Renew long leases with idem_checkpoint.';
    END IF;
END
$$;

CREATE FUNCTION idempotency.idem_release(scope text, key text, token uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text;
    n bigint;
BEGIN
    problem := coalesce(idempotency.portable_key_error('scope', scope), idempotency.portable_key_error('key', key));
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    IF token IS NULL THEN
        RAISE EXCEPTION 'argument "token" must not be null' USING ERRCODE = '22004';
    END IF;
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'idem_release cannot run on a read-only server'
            USING ERRCODE = '25006', HINT = 'Claims must run on the primary; idem_lookup works on a standby.';
    END IF;
    DELETE FROM idempotency.keys AS k
     WHERE (CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) = '-infinity'
       AND k.scope = idem_release.scope AND k.key = idem_release.key
       AND k.token = idem_release.token AND k.status = 'in_progress'
       AND k.expires_at > now();
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n = 1;
END
$$;
