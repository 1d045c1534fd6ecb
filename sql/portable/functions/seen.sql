-- idem_seen: a duplicate is answered from a read, with nothing written and no transaction id.
CREATE FUNCTION idempotency.idem_seen(scope text, message_id text, ttl interval DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text;
    now_ timestamptz := now();
    live_until timestamptz;
    n bigint;
BEGIN
    problem := coalesce(idempotency.portable_key_error('scope', scope), idempotency.portable_key_error('message_id', message_id));
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    SELECT a.value, a.problem INTO ttl, problem
      FROM idempotency.portable_interval_arg('ttl', ttl, 'idempotency.default_ttl', interval '24 hours') AS a;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'idem_seen cannot run on a read-only server'
            USING ERRCODE = '25006', HINT = 'Claims must run on the primary; idem_lookup works on a standby.';
    END IF;
    SELECT m.expires_at INTO live_until FROM idempotency.messages AS m
     WHERE m.scope = idem_seen.scope AND m.message_id = idem_seen.message_id;
    IF FOUND AND live_until > now_ THEN
        RETURN false;
    END IF;
    -- Behind another open transaction's insert of the same id this waits on the unique
    -- index, then touches nothing if that transaction committed.
    INSERT INTO idempotency.messages AS m (scope, message_id, seen_at, expires_at)
    VALUES (idem_seen.scope, idem_seen.message_id, now_, now_ + ttl)
    ON CONFLICT (scope, message_id) DO UPDATE SET seen_at = now_, expires_at = now_ + ttl
     WHERE m.expires_at <= now_;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n = 1;
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

    -- The distinct ids not live in the log, in byte order. OFFSET 0 keeps the look-up one
    -- index look-up per id (0.4.1): as a join it could be planned as a hash anti join that
    -- reads the whole scope, while the statistics still said the scope was small.
    SELECT array_agg(d.id ORDER BY d.id COLLATE "C") INTO unseen
      FROM (SELECT DISTINCT u.id FROM unnest(message_ids) AS u(id)) AS d
     WHERE NOT EXISTS (SELECT FROM idempotency.messages AS m
                        WHERE m.scope = idem_seen_many.scope AND m.message_id = d.id AND m.expires_at > now_ OFFSET 0);
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
