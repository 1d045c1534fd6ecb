-- idem_seen: a duplicate is answered from a read, with nothing written and no transaction id.
-- 0.6.0: message ids live in time partitions (sql/bootstrap.sql) and in the 0.5.0 table while
-- it is there; a new one is recorded under its lock (keylock.sql), after the expired record
-- it replaces is deleted.
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
    legacy boolean;
    mask int;
    lock_key int;
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
    legacy := EXISTS (SELECT FROM pg_catalog.pg_class AS c WHERE c.relnamespace = 'idempotency'::pg_catalog.regnamespace AND c.relname = 'messages_legacy');
    FOR round IN 1..2 LOOP
        -- The id's latest record (a period about to be dropped may still hold an older one),
        -- the 0.5.0 table included while it is there.
        IF legacy THEN
            SELECT max(r.expires_at) INTO live_until
              FROM (SELECT m.expires_at FROM idempotency.messages AS m
                     WHERE m.scope = idem_seen.scope AND m.message_id = idem_seen.message_id
                    UNION ALL
                    SELECT l.expires_at FROM idempotency.messages_legacy AS l
                     WHERE l.scope = idem_seen.scope AND l.message_id = idem_seen.message_id) AS r;
        ELSE
            SELECT m.expires_at INTO live_until FROM idempotency.messages AS m
             WHERE m.scope = idem_seen.scope AND m.message_id = idem_seen.message_id
             ORDER BY m.expires_at DESC LIMIT 1;
        END IF;
        IF live_until > now_ THEN
            RETURN false;
        END IF;
        EXIT WHEN round = 2;
        -- Seen for the first time (or only expired): recorded under the id's lock (keylock.sql),
        -- after a second read (a fresh snapshot under READ COMMITTED), so that a delivery
        -- that waited for another transaction's sighting of the id answers false once that
        -- one committed.
        mask := idempotency.portable_lock_mask();
        IF mask IS NULL THEN
            problem := idempotency.portable_lock_mask_error();
            RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
        END IF;
        lock_key := hashtext((idem_seen.scope || chr(1) || idem_seen.message_id) COLLATE "C") & mask;
        IF NOT pg_try_advisory_xact_lock(7650, lock_key) THEN
            -- Row-level security: the INSERT policy answers before any wait (keylock.sql).
            IF row_security_active('idempotency.messages') THEN
                PERFORM idempotency.portable_trial_messages(idem_seen.scope, ARRAY[idem_seen.message_id],
                                                            now_, now_ + ttl);
            END IF;
            PERFORM pg_advisory_xact_lock(7650, lock_key);
        END IF;
        IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
            -- The snapshot cannot show an id recorded after it: 40001 if there is one.
            PERFORM idempotency.portable_check_messages(idem_seen.scope, ARRAY[idem_seen.message_id]);
            EXIT;
        END IF;
    END LOOP;
    IF live_until IS NOT NULL THEN
        DELETE FROM idempotency.messages AS m
         WHERE m.scope = idem_seen.scope AND m.message_id = idem_seen.message_id AND m.expires_at <= now_;
        IF legacy THEN
            DELETE FROM idempotency.messages_legacy AS l
             WHERE l.scope = idem_seen.scope AND l.message_id = idem_seen.message_id AND l.expires_at <= now_;
        END IF;
    END IF;
    INSERT INTO idempotency.messages (scope, message_id, seen_at, expires_at)
    VALUES (idem_seen.scope, idem_seen.message_id, now_, now_ + ttl);
    RETURN true;
END
$$;

-- idem_seen_many (0.4.0): idem_seen for a batch, in one call. A batch of duplicates is
-- answered from one read (nothing written, no transaction id). The new ids are recorded by
-- one INSERT, under their locks (0.6.0). Element i is true when message_ids[i] was recorded
-- now and is its first occurrence in the batch.
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
    legacy boolean;
    snapshot_kept boolean;
    expired boolean;
    mask int;
    lock_keys int[];
    lock_key int;
    free int;
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

    legacy := EXISTS (SELECT FROM pg_catalog.pg_class AS c WHERE c.relnamespace = 'idempotency'::pg_catalog.regnamespace AND c.relname = 'messages_legacy');
    snapshot_kept := current_setting('transaction_isolation') IN ('repeatable read', 'serializable');
    FOR round IN 1..2 LOOP
        -- The distinct ids not live in the log (the 0.5.0 table included while it is there),
        -- and whether any of them has an expired record. Each id's latest expiry is a scalar
        -- subquery (one primary-key look-up per id and partition): a join with the array
        -- could be planned as a hash anti join that reads the whole scope, while the
        -- statistics still said the scope was small (0.4.1).
        IF legacy THEN
            SELECT array_agg(d.id), bool_or(d.latest IS NOT NULL) INTO unseen, expired
              FROM (SELECT u.id,
                           greatest((SELECT max(m.expires_at) FROM idempotency.messages AS m
                                      WHERE m.scope = idem_seen_many.scope AND m.message_id = u.id),
                                    (SELECT max(l.expires_at) FROM idempotency.messages_legacy AS l
                                      WHERE l.scope = idem_seen_many.scope AND l.message_id = u.id)) AS latest
                      FROM (SELECT DISTINCT x.id FROM unnest(coalesce(unseen, message_ids)) AS x(id)) AS u) AS d
             WHERE d.latest IS NULL OR d.latest <= now_;
        ELSE
            SELECT array_agg(d.id), bool_or(d.latest IS NOT NULL) INTO unseen, expired
              FROM (SELECT u.id,
                           (SELECT max(m.expires_at) FROM idempotency.messages AS m
                             WHERE m.scope = idem_seen_many.scope AND m.message_id = u.id) AS latest
                      FROM (SELECT DISTINCT x.id FROM unnest(coalesce(unseen, message_ids)) AS x(id)) AS u) AS d
             WHERE d.latest IS NULL OR d.latest <= now_;
        END IF;
        EXIT WHEN unseen IS NULL OR round = 2;
        -- The new ids are recorded under their locks (keylock.sql), taken in the order of the
        -- locks, so that two batches that share ids wait for each other instead of
        -- deadlocking: those free now at once, then (after the policy's answer where
        -- row-level security applies) the rest, waiting for each in turn. Then they are read
        -- again (a fresh snapshot under READ COMMITTED): an id that another transaction
        -- recorded meanwhile is not new. A batch holds one lock per new id until its
        -- transaction ends.
        mask := idempotency.portable_lock_mask();
        IF mask IS NULL THEN
            problem := idempotency.portable_lock_mask_error();
            RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
        END IF;
        SELECT array_agg(l.h ORDER BY l.h) INTO lock_keys
          FROM (SELECT DISTINCT hashtext((idem_seen_many.scope || chr(1) || u.id) COLLATE "C") & mask AS h
                  FROM unnest(unseen) AS u(id)) AS l;
        free := 0;
        FOREACH lock_key IN ARRAY lock_keys LOOP
            EXIT WHEN NOT pg_try_advisory_xact_lock(7650, lock_key);
            free := free + 1;
        END LOOP;
        IF free < cardinality(lock_keys) THEN
            IF row_security_active('idempotency.messages') THEN
                PERFORM idempotency.portable_trial_messages(idem_seen_many.scope, unseen, now_, now_ + ttl);
            END IF;
            PERFORM pg_advisory_xact_lock(7650, l.h)
               FROM unnest(lock_keys[free + 1:]) WITH ORDINALITY AS l(h, i) ORDER BY l.i;
        END IF;
        IF snapshot_kept THEN
            -- The snapshot cannot show an id recorded after it: 40001 if there is one.
            PERFORM idempotency.portable_check_messages(idem_seen_many.scope, unseen);
            EXIT;
        END IF;
    END LOOP;
    IF unseen IS NOT NULL THEN
        IF expired THEN
            DELETE FROM idempotency.messages AS m
             WHERE m.scope = idem_seen_many.scope AND m.message_id = ANY (unseen) AND m.expires_at <= now_;
            IF legacy THEN
                DELETE FROM idempotency.messages_legacy AS l
                 WHERE l.scope = idem_seen_many.scope AND l.message_id = ANY (unseen) AND l.expires_at <= now_;
            END IF;
        END IF;
        INSERT INTO idempotency.messages (scope, message_id, seen_at, expires_at)
        SELECT idem_seen_many.scope, u.id, now_, now_ + ttl FROM unnest(unseen) AS u(id);
    END IF;
    recorded := unseen;
    SELECT array_agg(r.id IS NOT NULL AND u.first ORDER BY u.i) INTO answer
      FROM (SELECT x.id, x.i, row_number() OVER (PARTITION BY x.id ORDER BY x.i) = 1 AS first
              FROM unnest(message_ids) WITH ORDINALITY AS x(id, i)) AS u
      LEFT JOIN unnest(recorded) AS r(id) ON r.id = u.id;
    RETURN answer;
END
$$;
