-- ---------------------------------------------------------------------------------------
-- Housekeeping that never waits for a claim: rows are picked FOR UPDATE SKIP LOCKED. On
-- Citus, where a multi-shard SELECT cannot lock, the pick does not lock and the write
-- re-checks under the row lock (as the native edition).

-- Whether idempotency.keys (first) and idempotency.messages are Citus distributed tables.
CREATE FUNCTION idempotency.portable_distributed(OUT keys boolean, OUT messages boolean)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    keys := false;
    messages := false;
    IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid OPERATOR(pg_catalog.=) ''idempotency.keys''::pg_catalog.regclass), '
                '       EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid OPERATOR(pg_catalog.=) ''idempotency.messages''::pg_catalog.regclass)'
            INTO keys, messages;
    END IF;
END
$$;

-- Deletes expired records. With idempotency.tombstone_ttl on (0.4.0), within the same
-- budget: records expired longer ago than tombstone_ttl (tombstones past their end) are
-- deleted, claims that expired in_progress are deleted (they leave no tombstone), and
-- completed records that expired become tombstones (response and checkpoint dropped).
CREATE FUNCTION idempotency.idem_sweep(max_rows int DEFAULT 10000)
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
    RETURN swept + idempotency.send_sweep(max_rows - swept);
END
$$;

CREATE FUNCTION idempotency.idem_reclaim_stale(
    max_rows int DEFAULT 1000,
    release boolean DEFAULT true,
    lease interval DEFAULT NULL
) RETURNS TABLE (scope text, key text, token uuid, attempts int, recovery_point text, recovery_data jsonb)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text;
    now_ timestamptz := now();
    lease_end timestamptz;
    stale record;
    changed record;
    new_token uuid;
BEGIN
    IF max_rows IS NULL THEN
        RAISE EXCEPTION 'argument "max_rows" must not be null' USING ERRCODE = '22004';
    END IF;
    IF max_rows <= 0 THEN
        RAISE EXCEPTION 'invalid argument "max_rows": must be positive (got %)', max_rows USING ERRCODE = '22023';
    END IF;
    IF release IS NULL THEN
        RAISE EXCEPTION 'argument "release" must not be null' USING ERRCODE = '22004';
    END IF;
    SELECT a.value, a.problem INTO lease, problem
      FROM idempotency.portable_interval_arg('lease', lease, 'idempotency.default_lease', interval '5 minutes') AS a;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'idem_reclaim_stale cannot run on a read-only server'
            USING ERRCODE = '25006', HINT = 'Claims must run on the primary; idem_lookup works on a standby.';
    END IF;
    lease_end := now_ + lease;

    FOR stale IN
        SELECT s.scope, s.key, s.token, s.attempts FROM idempotency.keys AS s
         WHERE s.status = 'in_progress' AND s.locked_until <= now_ AND s.expires_at > now_
         ORDER BY s.locked_until LIMIT max_rows
           FOR UPDATE SKIP LOCKED
    LOOP
        -- Each is fenced again: nothing changes when a claim took the row over meanwhile.
        IF release THEN
            DELETE FROM idempotency.keys AS k
             WHERE k.scope = stale.scope AND k.key = stale.key AND k.token = stale.token
               AND k.status = 'in_progress' AND k.locked_until <= now_ AND k.expires_at > now_
            RETURNING k.recovery_point, k.recovery_data INTO changed;
            new_token := stale.token;
        ELSE
            new_token := gen_random_uuid();
            UPDATE idempotency.keys AS k
               SET token = new_token, attempts = stale.attempts + 1, locked_until = lease_end, updated_at = now_
             WHERE k.scope = stale.scope AND k.key = stale.key AND k.token = stale.token
               AND k.status = 'in_progress' AND k.locked_until <= now_ AND k.expires_at > now_
            RETURNING k.recovery_point, k.recovery_data INTO changed;
        END IF;
        IF FOUND THEN
            idem_reclaim_stale.scope := stale.scope;
            idem_reclaim_stale.key := stale.key;
            idem_reclaim_stale.token := new_token;
            idem_reclaim_stale.attempts := CASE WHEN release THEN stale.attempts ELSE stale.attempts + 1 END;
            idem_reclaim_stale.recovery_point := changed.recovery_point;
            idem_reclaim_stale.recovery_data := changed.recovery_data;
            RETURN NEXT;
        END IF;
    END LOOP;
END
$$;
