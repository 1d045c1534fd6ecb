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

-- Deletes expired records; with idempotency.tombstone_ttl on (0.4.0), turns expired
-- completed records into tombstones and deletes tombstones past their end. Returns the rows
-- it changed.
--
-- 0.6.0 (docs/operations.md#partitions): row by row only what the periods do not hold: the
-- claims in flight (keys_claims), the records past the periods (keys_far, messages_far:
-- each statement names the partition key and the span of the periods, so that the planner
-- reads only those partitions), and the tables of a 0.5.0 install while they are there. Each
-- step picks at most what is left of the budget, then changes exactly those rows if they
-- are still past the cut-off; the budget spent, it stops. Then, within the budget, it moves
-- live records of the 0.5.0 tables into the partitions, sweeps the sending side, and last
-- makes and drops the periods (sql/partitions.sql). The native edition does that last step
-- only outside a transaction block (ATTACH and DROP hold their locks until COMMIT); PL/pgSQL
-- cannot tell whether it runs in one, so this edition always does it (docs/portable.md):
-- run idem_sweep in a transaction of its own, as pg_cron and idem_sweep_all do.
CREATE FUNCTION idempotency.idem_sweep(max_rows int DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    problem text;
    now_ timestamptz := now();
    kept timestamptz;
    dist record;
    tombstone_ttl interval;
    legacy_keys boolean := EXISTS (SELECT FROM pg_catalog.pg_class AS c WHERE c.relnamespace = 'idempotency'::pg_catalog.regnamespace AND c.relname = 'keys_legacy');
    legacy_messages boolean := EXISTS (SELECT FROM pg_catalog.pg_class AS c WHERE c.relnamespace = 'idempotency'::pg_catalog.regnamespace AND c.relname = 'messages_legacy');
    keys_lo timestamptz;
    keys_hi timestamptz;
    messages_lo timestamptz;
    messages_hi timestamptz;
    steps text[];
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
    kept := now_ - coalesce(tombstone_ttl, interval '0');
    dist := idempotency.portable_distributed();
    -- The span of each table's periods (the earliest lower and the latest upper bound;
    -- 'infinity' for both when there is none): what keeps a sweep of the far partition out
    -- of them.
    SELECT coalesce(min(b.lower_bound), 'infinity'), coalesce(max(b.upper_bound), 'infinity')
      INTO keys_lo, keys_hi
      FROM idempotency.partition_bounds('idempotency.keys') AS b
     WHERE NOT b.is_default AND b.lower_bound IS NOT NULL;
    SELECT coalesce(min(b.lower_bound), 'infinity'), coalesce(max(b.upper_bound), 'infinity')
      INTO messages_lo, messages_hi
      FROM idempotency.partition_bounds('idempotency.messages') AS b
     WHERE NOT b.is_default AND b.lower_bound IS NOT NULL;

    -- Claims leave no tombstone; past the periods, tombstones are deleted once they end,
    -- completed records dropping their response (and checkpoint) when they expire.
    steps := ARRAY['claims', 'far'];
    IF tombstone_ttl IS NOT NULL THEN
        steps := steps || 'tombstones'::text;
    END IF;
    IF legacy_keys THEN
        steps := steps || 'legacy'::text;
        IF tombstone_ttl IS NOT NULL THEN
            steps := steps || 'legacy tombstones'::text;
        END IF;
    END IF;
    steps := steps || 'messages'::text;
    IF legacy_messages THEN
        steps := steps || 'legacy messages'::text;
    END IF;
    FOREACH step IN ARRAY steps LOOP
        IF swept >= max_rows THEN
            RETURN swept;
        END IF;
        scopes := NULL;
        IF step = 'claims' THEN
            IF dist.keys THEN
                SELECT array_agg(p.scope), array_agg(p.key) INTO scopes, ids
                  FROM (SELECT k.scope, k.key FROM idempotency.keys AS k
                         WHERE (CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) = '-infinity'
                           AND k.expires_at <= now_
                         ORDER BY k.expires_at LIMIT max_rows - swept) AS p;
            ELSE
                SELECT array_agg(p.scope), array_agg(p.key) INTO scopes, ids
                  FROM (SELECT k.scope, k.key FROM idempotency.keys AS k
                         WHERE (CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) = '-infinity'
                           AND k.expires_at <= now_
                         ORDER BY k.expires_at LIMIT max_rows - swept FOR UPDATE SKIP LOCKED) AS p;
            END IF;
            IF scopes IS NOT NULL THEN
                DELETE FROM idempotency.keys AS t
                 USING ROWS FROM (unnest(scopes), unnest(ids)) AS picked(scope, id)
                 WHERE (NOT dist.keys OR t.scope = ANY (scopes))
                   AND (CASE WHEN t.status = 'completed' THEN t.expires_at ELSE '-infinity'::timestamptz END) = '-infinity'
                   AND t.scope = picked.scope AND t.key = picked.id AND t.expires_at <= now_;
                GET DIAGNOSTICS n = ROW_COUNT;
                swept := swept + n;
            END IF;
        ELSIF step = 'far' THEN
            IF dist.keys THEN
                SELECT array_agg(p.scope), array_agg(p.key) INTO scopes, ids
                  FROM (SELECT k.scope, k.key FROM idempotency.keys AS k
                         WHERE (CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) >= '1970-01-01 00:00:00+00'::timestamptz
                           AND ((CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) < keys_lo
                                OR (CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) >= keys_hi)
                           AND k.expires_at <= kept
                         ORDER BY k.expires_at LIMIT max_rows - swept) AS p;
            ELSE
                SELECT array_agg(p.scope), array_agg(p.key) INTO scopes, ids
                  FROM (SELECT k.scope, k.key FROM idempotency.keys AS k
                         WHERE (CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) >= '1970-01-01 00:00:00+00'::timestamptz
                           AND ((CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) < keys_lo
                                OR (CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) >= keys_hi)
                           AND k.expires_at <= kept
                         ORDER BY k.expires_at LIMIT max_rows - swept FOR UPDATE SKIP LOCKED) AS p;
            END IF;
            IF scopes IS NOT NULL THEN
                DELETE FROM idempotency.keys AS t
                 USING ROWS FROM (unnest(scopes), unnest(ids)) AS picked(scope, id)
                 WHERE (NOT dist.keys OR t.scope = ANY (scopes))
                   AND (CASE WHEN t.status = 'completed' THEN t.expires_at ELSE '-infinity'::timestamptz END) >= '1970-01-01 00:00:00+00'::timestamptz
                   AND ((CASE WHEN t.status = 'completed' THEN t.expires_at ELSE '-infinity'::timestamptz END) < keys_lo
                        OR (CASE WHEN t.status = 'completed' THEN t.expires_at ELSE '-infinity'::timestamptz END) >= keys_hi)
                   AND t.scope = picked.scope AND t.key = picked.id AND t.expires_at <= kept;
                GET DIAGNOSTICS n = ROW_COUNT;
                swept := swept + n;
            END IF;
        ELSIF step = 'tombstones' THEN
            -- Through keys_responses_idx (its predicate spelled the same): the tombstones
            -- already made are not stepped over. (A period keeps its responses until it is
            -- dropped; its records answer expired without them.)
            IF dist.keys THEN
                SELECT array_agg(p.scope), array_agg(p.key) INTO scopes, ids
                  FROM (SELECT k.scope, k.key FROM idempotency.keys AS k
                         WHERE (CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) >= '1970-01-01 00:00:00+00'::timestamptz
                           AND ((CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) < keys_lo
                                OR (CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) >= keys_hi)
                           AND (k.response_body IS NOT NULL OR k.response_headers IS NOT NULL) AND k.expires_at <= now_
                         ORDER BY k.expires_at LIMIT max_rows - swept) AS p;
            ELSE
                SELECT array_agg(p.scope), array_agg(p.key) INTO scopes, ids
                  FROM (SELECT k.scope, k.key FROM idempotency.keys AS k
                         WHERE (CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) >= '1970-01-01 00:00:00+00'::timestamptz
                           AND ((CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) < keys_lo
                                OR (CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) >= keys_hi)
                           AND (k.response_body IS NOT NULL OR k.response_headers IS NOT NULL) AND k.expires_at <= now_
                         ORDER BY k.expires_at LIMIT max_rows - swept FOR UPDATE SKIP LOCKED) AS p;
            END IF;
            IF scopes IS NOT NULL THEN
                UPDATE idempotency.keys AS t
                   SET response_body = NULL, response_headers = NULL, recovery_point = NULL, recovery_data = NULL
                  FROM ROWS FROM (unnest(scopes), unnest(ids)) AS picked(scope, id)
                 WHERE (NOT dist.keys OR t.scope = ANY (scopes))
                   AND (CASE WHEN t.status = 'completed' THEN t.expires_at ELSE '-infinity'::timestamptz END) >= '1970-01-01 00:00:00+00'::timestamptz
                   AND ((CASE WHEN t.status = 'completed' THEN t.expires_at ELSE '-infinity'::timestamptz END) < keys_lo
                        OR (CASE WHEN t.status = 'completed' THEN t.expires_at ELSE '-infinity'::timestamptz END) >= keys_hi)
                   AND t.scope = picked.scope AND t.key = picked.id
                   AND t.status = 'completed' AND t.expires_at <= now_;
                GET DIAGNOSTICS n = ROW_COUNT;
                swept := swept + n;
            END IF;
        ELSIF step = 'legacy' THEN
            -- The 0.5.0 table (never distributed: the update leaves a distributed table as it is).
            SELECT array_agg(p.scope), array_agg(p.key) INTO scopes, ids
              FROM (SELECT l.scope, l.key FROM idempotency.keys_legacy AS l WHERE l.expires_at <= kept
                     ORDER BY l.expires_at LIMIT max_rows - swept FOR UPDATE SKIP LOCKED) AS p;
            IF scopes IS NOT NULL THEN
                DELETE FROM idempotency.keys_legacy AS t
                 USING ROWS FROM (unnest(scopes), unnest(ids)) AS picked(scope, id)
                 WHERE t.scope = picked.scope AND t.key = picked.id AND t.expires_at <= kept;
                GET DIAGNOSTICS n = ROW_COUNT;
                swept := swept + n;
            END IF;
        ELSIF step = 'legacy tombstones' THEN
            SELECT array_agg(p.scope), array_agg(p.key) INTO scopes, ids
              FROM (SELECT l.scope, l.key FROM idempotency.keys_legacy AS l
                     WHERE (l.response_body IS NOT NULL OR l.response_headers IS NOT NULL) AND l.expires_at <= now_
                     ORDER BY l.expires_at LIMIT max_rows - swept FOR UPDATE SKIP LOCKED) AS p;
            IF scopes IS NOT NULL THEN
                UPDATE idempotency.keys_legacy AS t
                   SET response_body = NULL, response_headers = NULL, recovery_point = NULL, recovery_data = NULL
                  FROM ROWS FROM (unnest(scopes), unnest(ids)) AS picked(scope, id)
                 WHERE t.scope = picked.scope AND t.key = picked.id
                   AND t.status = 'completed' AND t.expires_at <= now_;
                GET DIAGNOSTICS n = ROW_COUNT;
                swept := swept + n;
            END IF;
        ELSIF step = 'messages' THEN
            IF dist.messages THEN
                SELECT array_agg(p.scope), array_agg(p.message_id) INTO scopes, ids
                  FROM (SELECT m.scope, m.message_id FROM idempotency.messages AS m
                         WHERE (m.expires_at < messages_lo OR m.expires_at >= messages_hi) AND m.expires_at <= now_
                         ORDER BY m.expires_at LIMIT max_rows - swept) AS p;
            ELSE
                SELECT array_agg(p.scope), array_agg(p.message_id) INTO scopes, ids
                  FROM (SELECT m.scope, m.message_id FROM idempotency.messages AS m
                         WHERE (m.expires_at < messages_lo OR m.expires_at >= messages_hi) AND m.expires_at <= now_
                         ORDER BY m.expires_at LIMIT max_rows - swept FOR UPDATE SKIP LOCKED) AS p;
            END IF;
            IF scopes IS NOT NULL THEN
                DELETE FROM idempotency.messages AS t
                 USING ROWS FROM (unnest(scopes), unnest(ids)) AS picked(scope, id)
                 WHERE (NOT dist.messages OR t.scope = ANY (scopes))
                   AND (t.expires_at < messages_lo OR t.expires_at >= messages_hi)
                   AND t.scope = picked.scope AND t.message_id = picked.id AND t.expires_at <= now_;
                GET DIAGNOSTICS n = ROW_COUNT;
                swept := swept + n;
            END IF;
        ELSE -- 'legacy messages'
            SELECT array_agg(p.scope), array_agg(p.message_id) INTO scopes, ids
              FROM (SELECT l.scope, l.message_id FROM idempotency.messages_legacy AS l WHERE l.expires_at <= now_
                     ORDER BY l.expires_at LIMIT max_rows - swept FOR UPDATE SKIP LOCKED) AS p;
            IF scopes IS NOT NULL THEN
                DELETE FROM idempotency.messages_legacy AS t
                 USING ROWS FROM (unnest(scopes), unnest(ids)) AS picked(scope, id)
                 WHERE t.scope = picked.scope AND t.message_id = picked.id AND t.expires_at <= now_;
                GET DIAGNOSTICS n = ROW_COUNT;
                swept := swept + n;
            END IF;
        END IF;
    END LOOP;

    -- A 0.5.0 install: live records move from the tables they were kept in into the
    -- partitions, latest expiry first, within what is left of the budget (not counted in
    -- it). Expired ones are only deleted (above): a claim may be replacing one. A live record
    -- is never replaced, so moving it needs no key lock; a read sees it in one table or the
    -- other.
    IF legacy_keys AND swept < max_rows THEN
        WITH moved AS (
            DELETE FROM idempotency.keys_legacy AS l
             USING (SELECT p.scope, p.key FROM idempotency.keys_legacy AS p WHERE p.expires_at > now_
                     ORDER BY p.expires_at DESC LIMIT max_rows - swept FOR UPDATE SKIP LOCKED) AS picked
             WHERE l.scope = picked.scope AND l.key = picked.key AND l.expires_at > now_
            RETURNING l.*)
        INSERT INTO idempotency.keys SELECT * FROM moved;
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n > 0 THEN
            RAISE NOTICE 'idem_sweep: moved % live records from idempotency.keys_legacy into the partitions', n;
        END IF;
    END IF;
    IF legacy_messages AND swept < max_rows THEN
        WITH moved AS (
            DELETE FROM idempotency.messages_legacy AS l
             USING (SELECT p.scope, p.message_id FROM idempotency.messages_legacy AS p WHERE p.expires_at > now_
                     ORDER BY p.expires_at DESC LIMIT max_rows - swept FOR UPDATE SKIP LOCKED) AS picked
             WHERE l.scope = picked.scope AND l.message_id = picked.message_id AND l.expires_at > now_
            RETURNING l.*)
        INSERT INTO idempotency.messages SELECT * FROM moved;
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n > 0 THEN
            RAISE NOTICE 'idem_sweep: moved % live records from idempotency.messages_legacy into the partitions', n;
        END IF;
    END IF;
    swept := swept + idempotency.send_sweep(max_rows - swept);
    PERFORM count(*) FROM idempotency.partitions_maintain();
    RETURN swept;
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
         WHERE (CASE WHEN s.status = 'completed' THEN s.expires_at ELSE '-infinity'::timestamptz END) = '-infinity'
           AND s.status = 'in_progress' AND s.locked_until <= now_ AND s.expires_at > now_
         ORDER BY s.locked_until LIMIT max_rows
           FOR UPDATE SKIP LOCKED
    LOOP
        -- Each is fenced again: nothing changes when a claim took the row over meanwhile.
        -- Claims in flight are in the claims' partition: the partition key says so.
        IF release THEN
            DELETE FROM idempotency.keys AS k
             WHERE (CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) = '-infinity'
               AND k.scope = stale.scope AND k.key = stale.key AND k.token = stale.token
               AND k.status = 'in_progress' AND k.locked_until <= now_ AND k.expires_at > now_
            RETURNING k.recovery_point, k.recovery_data INTO changed;
            new_token := stale.token;
        ELSE
            new_token := gen_random_uuid();
            UPDATE idempotency.keys AS k
               SET token = new_token, attempts = stale.attempts + 1, locked_until = lease_end, updated_at = now_
             WHERE (CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) = '-infinity'
               AND k.scope = stale.scope AND k.key = stale.key AND k.token = stale.token
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
