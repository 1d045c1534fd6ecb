-- ---------------------------------------------------------------------------------------
-- idem_claim. One read of (scope, key) answers replay, in_progress, mismatch and expired
-- with nothing written and no transaction id taken; only a claim that goes ahead writes (a
-- new record, the replacement of an expired record, or the takeover of a claim whose lease
-- ended). A takeover is fenced on the token read.
--
-- 0.4.0: a caller's token is stored by a new claim or a takeover, and a repeated call with
-- the token of the live in_progress record answers claimed again, writing nothing. With
-- idempotency.tombstone_ttl on, an expired completed record answers expired (410) until
-- expires_at + tombstone_ttl. A positive wait turns an in_progress answer into a wait: the
-- record is read again (a fresh snapshot per read under READ COMMITTED) after pg_sleep
-- pauses of 10 ms, growing to a tenth of the time waited so far, at most 100 ms, never past
-- the owner's lease end, the record's expiry or the wait's end; no row lock, no
-- transaction id; cancel and statement_timeout stop pg_sleep. Under REPEATABLE READ or
-- SERIALIZABLE the snapshot never shows a change: the answer is given at once.
--
-- 0.6.0: records live in time partitions (sql/bootstrap.sql), and the tables of a 0.5.0
-- install (keys_legacy) are read after them while they are there; a key has at most one
-- record, the latest expiry. A claim that would create a record first takes the key lock
-- (keylock.sql), then reads the key again: a claim that waited there for another
-- transaction's claim of the key sees what that transaction left (under REPEATABLE READ or
-- SERIALIZABLE, where it cannot, a record committed after the snapshot gives 40001). The
-- new record is an INSERT, after the DELETE of the expired record it replaces. deferred is
-- accepted and answers exactly as in the native edition, but this edition cannot hold a key
-- without a row (it has no memory that lives until the transaction ends, nor a hook at
-- COMMIT): it writes the in_progress record at once, as without deferred, and idem_complete
-- moves it (docs/portable.md).

CREATE FUNCTION idempotency.idem_claim(
    scope text,
    key text,
    fingerprint text DEFAULT NULL,
    ttl interval DEFAULT NULL,
    lease interval DEFAULT NULL,
    wait interval DEFAULT NULL,
    token uuid DEFAULT NULL,
    deferred boolean DEFAULT false
) RETURNS idempotency.claim_result
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text;
    now_ timestamptz := now();
    expires timestamptz;
    lease_end timestamptz;
    rec record;
    found_record boolean;
    legacy boolean;
    snapshot_kept boolean;
    locked boolean := false;
    mask int;
    lock_key int;
    new_token uuid;
    new_expires timestamptz;
    taken record;
    n bigint;
    tombstone_ttl interval;
    wait_started timestamptz;
    wait_until timestamptz;
    pause float8;
    answer idempotency.claim_result;
BEGIN
    problem := coalesce(idempotency.portable_key_error('scope', scope), idempotency.portable_key_error('key', key));
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    SELECT a.value, a.problem INTO ttl, problem
      FROM idempotency.portable_interval_arg('ttl', ttl, 'idempotency.default_ttl', interval '24 hours') AS a;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    SELECT a.value, a.problem INTO lease, problem
      FROM idempotency.portable_interval_arg('lease', lease, 'idempotency.default_lease', interval '5 minutes') AS a;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    IF deferred IS NULL THEN
        RAISE EXCEPTION 'argument "deferred" must not be null' USING ERRCODE = '22004';
    END IF;
    IF wait < interval '0' THEN
        RAISE EXCEPTION 'invalid argument "wait": must not be negative' USING ERRCODE = '22023';
    END IF;
    IF wait > interval '1 hour' THEN
        RAISE EXCEPTION 'invalid argument "wait": must be at most 1 hour' USING ERRCODE = '22023';
    END IF;
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'idem_claim cannot run on a read-only server'
            USING ERRCODE = '25006', HINT = 'Claims must run on the primary; idem_lookup works on a standby.';
    END IF;

    legacy := EXISTS (SELECT FROM pg_catalog.pg_class AS c WHERE c.relnamespace = 'idempotency'::pg_catalog.regnamespace AND c.relname = 'keys_legacy');
    snapshot_kept := current_setting('transaction_isolation') IN ('repeatable read', 'serializable');

    <<waiting>>
    LOOP
        expires := now_ + ttl;
        lease_end := now_ + lease;
        answer := NULL;
        <<rounds>>
        FOR round IN 1..10 LOOP
            -- The record: the latest expiry among the partitions (a period about to be
            -- dropped may still hold an older, expired one) and the 0.5.0 table.
            IF legacy THEN
                SELECT r.fingerprint, r.status, r.token, r.attempts, r.locked_until, r.expires_at,
                       r.response_status, r.response_headers, r.response_body, r.recovery_point, r.recovery_data
                  INTO rec
                  FROM (SELECT k.fingerprint, k.status, k.token, k.attempts, k.locked_until, k.expires_at,
                               k.response_status, k.response_headers, k.response_body, k.recovery_point, k.recovery_data
                          FROM idempotency.keys AS k
                         WHERE k.scope = idem_claim.scope AND k.key = idem_claim.key
                        UNION ALL
                        SELECT l.fingerprint, l.status, l.token, l.attempts, l.locked_until, l.expires_at,
                               l.response_status, l.response_headers, l.response_body, l.recovery_point, l.recovery_data
                          FROM idempotency.keys_legacy AS l
                         WHERE l.scope = idem_claim.scope AND l.key = idem_claim.key) AS r
                 ORDER BY r.expires_at DESC LIMIT 1;
            ELSE
                SELECT k.fingerprint, k.status, k.token, k.attempts, k.locked_until, k.expires_at,
                       k.response_status, k.response_headers, k.response_body, k.recovery_point, k.recovery_data
                  INTO rec
                  FROM idempotency.keys AS k
                 WHERE k.scope = idem_claim.scope AND k.key = idem_claim.key
                 ORDER BY k.expires_at DESC LIMIT 1;
            END IF;
            found_record := FOUND;

            IF found_record AND rec.expires_at <= now_ THEN
                -- A completed record inside its tombstone answers expired (or mismatch).
                IF rec.status = 'completed' THEN
                    SELECT t.value, t.problem INTO tombstone_ttl, problem FROM idempotency.portable_tombstone_ttl() AS t;
                    IF problem IS NOT NULL THEN
                        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
                    END IF;
                    IF rec.expires_at + tombstone_ttl > now_ THEN
                        IF rec.fingerprint IS DISTINCT FROM idem_claim.fingerprint THEN
                            answer := ROW('mismatch', NULL, 422, NULL, NULL, NULL, NULL, NULL, NULL, rec.expires_at, NULL);
                        ELSE
                            answer := ROW('expired', NULL, 410, rec.response_status, NULL, NULL, NULL, NULL,
                                          rec.attempts, rec.expires_at, NULL);
                        END IF;
                        EXIT rounds;
                    END IF;
                END IF;
            END IF;

            IF NOT found_record OR rec.expires_at <= now_ THEN
                -- The key is free: a new claim, under the key lock. Once it is taken the key is
                -- read again (a new statement, so a fresh snapshot under READ COMMITTED): a
                -- claim that waited for another transaction's claim answers from what it left.
                IF NOT locked THEN
                    mask := idempotency.portable_lock_mask();
                    IF mask IS NULL THEN
                        problem := idempotency.portable_lock_mask_error();
                        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
                    END IF;
                    lock_key := hashtext((idem_claim.scope || chr(1) || idem_claim.key) COLLATE "C") & mask;
                    IF NOT pg_try_advisory_xact_lock(7649, lock_key) THEN
                        -- Row-level security: the INSERT policy answers before any wait (keylock.sql).
                        IF row_security_active('idempotency.keys') THEN
                            PERFORM idempotency.portable_trial_claim(idem_claim.scope, idem_claim.key,
                                idem_claim.fingerprint, coalesce(idem_claim.token, gen_random_uuid()),
                                lease_end, now_, expires);
                        END IF;
                        PERFORM pg_advisory_xact_lock(7649, lock_key);
                    END IF;
                    locked := true;
                    IF NOT snapshot_kept THEN
                        CONTINUE rounds;
                    END IF;
                    -- The snapshot cannot show a record committed after it: 40001 if there is one.
                    PERFORM idempotency.portable_check_key(idem_claim.scope, idem_claim.key);
                END IF;
                -- (A deferred claim refuses a READ ONLY transaction in the native edition's words,
                -- as it would at its write.)
                IF deferred AND current_setting('transaction_read_only') = 'on' THEN
                    RAISE EXCEPTION 'cannot execute idem_claim in a read-only transaction' USING ERRCODE = '25006';
                END IF;
                new_token := coalesce(idem_claim.token, gen_random_uuid());
                IF found_record THEN
                    DELETE FROM idempotency.keys AS k
                     WHERE k.scope = idem_claim.scope AND k.key = idem_claim.key
                       AND k.token = rec.token AND k.expires_at <= now_;
                    GET DIAGNOSTICS n = ROW_COUNT;
                    IF n = 0 AND legacy THEN
                        DELETE FROM idempotency.keys_legacy AS l
                         WHERE l.scope = idem_claim.scope AND l.key = idem_claim.key
                           AND l.token = rec.token AND l.expires_at <= now_;
                    END IF;
                END IF;
                INSERT INTO idempotency.keys
                       (scope, key, fingerprint, status, token, attempts, locked_until,
                        created_at, updated_at, expires_at)
                VALUES (idem_claim.scope, idem_claim.key, idem_claim.fingerprint, 'in_progress',
                        new_token, 1, lease_end, now_, now_, expires);
                answer := ROW('claimed', new_token, NULL, NULL, NULL, NULL, NULL, NULL, 1, expires, lease_end);
                EXIT rounds;
            END IF;

            IF rec.fingerprint IS DISTINCT FROM idem_claim.fingerprint THEN
                answer := ROW('mismatch', NULL, 422, NULL, NULL, NULL, NULL, NULL, NULL, rec.expires_at, NULL);
                EXIT rounds;
            END IF;
            IF rec.status = 'completed' THEN
                answer := ROW('replay', NULL, rec.response_status, rec.response_status, rec.response_headers,
                              rec.response_body, NULL, NULL, rec.attempts, rec.expires_at, NULL);
                EXIT rounds;
            END IF;
            -- The caller's own claim, repeated (its first answer was lost): nothing to write.
            -- Once its lease ended it is taken over below, with the caller's token: reclaimed.
            IF rec.token = idem_claim.token AND rec.locked_until > now_ THEN
                answer := ROW('claimed', rec.token, NULL, NULL, NULL, NULL, rec.recovery_point, rec.recovery_data,
                              rec.attempts, rec.expires_at, rec.locked_until);
                EXIT rounds;
            END IF;
            IF rec.locked_until > now_ THEN
                answer := ROW('in_progress', NULL, 409, NULL, NULL, NULL, NULL, NULL, rec.attempts,
                              rec.expires_at, rec.locked_until);
                EXIT rounds;
            END IF;

            -- The owner's lease ended: take the claim over, fenced on the token read. Claims
            -- in flight are in the claims' partition: the partition key says so.
            new_token := coalesce(idem_claim.token, gen_random_uuid());
            new_expires := greatest(rec.expires_at, expires);
            UPDATE idempotency.keys AS k
               SET token = new_token, attempts = rec.attempts + 1, locked_until = lease_end,
                   updated_at = now_, expires_at = new_expires
             WHERE (CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) = '-infinity'
               AND k.scope = idem_claim.scope AND k.key = idem_claim.key
               AND k.token = rec.token AND k.status = 'in_progress'
               AND k.locked_until <= now_ AND k.expires_at > now_
            RETURNING k.recovery_point, k.recovery_data INTO taken;
            IF FOUND THEN
                answer := ROW('reclaimed', new_token, NULL, NULL, NULL, NULL, taken.recovery_point,
                              taken.recovery_data, rec.attempts + 1, new_expires, lease_end);
                EXIT rounds;
            END IF;
        END LOOP;
        IF answer.outcome IS NULL THEN
            RAISE EXCEPTION 'could not claim scope %, key %: it kept changing concurrently',
                idempotency.portable_quote(scope), idempotency.portable_quote(key)
                USING ERRCODE = '40001', HINT = 'Retry the transaction.';
        END IF;

        EXIT waiting WHEN answer.outcome <> 'in_progress' OR wait IS NULL OR wait = interval '0' OR snapshot_kept;
        IF wait_until IS NULL THEN
            wait_started := clock_timestamp();
            wait_until := wait_started + idempotency.portable_seconds(wait) * interval '1 second';
        END IF;
        EXIT waiting WHEN now_ >= wait_until;
        now_ := clock_timestamp();
        pause := greatest(0.001, least(
            extract(epoch FROM wait_until - now_),
            greatest(0.01, least(0.1, extract(epoch FROM now_ - wait_started) / 10)),
            extract(epoch FROM answer.locked_until - now_),
            extract(epoch FROM answer.expires_at - now_)));
        PERFORM pg_sleep(pause);
        now_ := clock_timestamp();
    END LOOP;
    RETURN answer;
END
$$;
