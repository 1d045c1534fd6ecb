-- ---------------------------------------------------------------------------------------
-- The key lock (docs/reliability.md#the-key-lock) and what a claim under REPEATABLE READ or
-- SERIALIZABLE does instead of reading the key again.
--
-- A claim that may create a record (idem_claim of a free key), and idem_seen / idem_seen_many
-- for an id they may record, first take a transaction-level advisory lock:
--     pg_advisory_xact_lock(7649, h)   (scope, key)        [messages: 7650]
-- h is a 32-bit hash of the scope, U+0001 (which no scope, key or message id may hold) and
-- the key or id. The native edition locks a 64-bit hash in a lock space of its own; SQL can
-- only reach the advisory lock space that applications share, so an application lock on
-- (7649, h) or (7650, h) makes a claim wait for it, as two keys whose hashes meet do. A
-- lock is never an answer: each claim then reads its own key. pg_locks shows the lock as
-- `advisory`, classid 7649 (7650), objsubid 2.

-- The mask that idempotency.key_lock_bits (for tests only: fewer bits make keys share locks)
-- puts on the 32-bit hash: -1 (every bit) unless it is set below 32; NULL when it is set to
-- anything but an integer from 1 to 64.
CREATE FUNCTION idempotency.portable_lock_mask() RETURNS int
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    raw text := btrim(coalesce(current_setting('idempotency.key_lock_bits', true), ''));
    bits int;
BEGIN
    IF raw = '' THEN
        RETURN -1;
    END IF;
    IF raw !~ '^[0-9]{1,2}$' THEN
        RETURN NULL;
    END IF;
    bits := raw::int;
    IF bits < 1 OR bits > 64 THEN
        RETURN NULL;
    END IF;
    RETURN CASE WHEN bits >= 32 THEN -1 ELSE ((1::bigint << bits) - 1)::int END;
END
$$;

-- The error for a bad idempotency.key_lock_bits, as "SQLSTATE message".
CREATE FUNCTION idempotency.portable_lock_mask_error() RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT format('22023 invalid value for setting "idempotency.key_lock_bits": "%s" (it must be an integer from 1 to 64)',
                  current_setting('idempotency.key_lock_bits', true))
$$;

-- Under REPEATABLE READ or SERIALIZABLE the transaction's snapshot never shows what another
-- transaction committed after it was taken. So a claim of a key that is free in its
-- snapshot cannot read the key again once it holds the key lock, as the native edition does
-- with the latest snapshot; it asks every partition's primary key instead: a stand-in row of
-- the key goes into each partition with ON CONFLICT DO NOTHING, and comes out again at once
-- (deleted by token). A record of the key that the snapshot cannot see makes PostgreSQL
-- refuse the INSERT with 40001, "could not serialize access due to concurrent update" (the
-- native edition's answer); a record the snapshot sees is left alone. Run only under the key
-- lock, so no other claim of the key is writing meanwhile.
CREATE FUNCTION idempotency.portable_check_key(scope text, key text) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    stand_in uuid := gen_random_uuid();
    now_ timestamptz := now();
BEGIN
    -- One row per partition: in_progress for the claims' partition, completed with an expiry
    -- in each period, completed past every period for the far one.
    INSERT INTO idempotency.keys AS k (scope, key, status, token, attempts, locked_until,
                                       created_at, updated_at, expires_at)
    SELECT portable_check_key.scope, portable_check_key.key,
           CASE WHEN b.is_default OR b.lower_bound IS NOT NULL THEN 'completed' ELSE 'in_progress' END,
           stand_in, 1, CASE WHEN b.is_default OR b.lower_bound IS NOT NULL THEN NULL ELSE now_ END,
           now_, now_,
           CASE WHEN b.is_default THEN 'infinity'::timestamptz ELSE coalesce(b.lower_bound, now_) END
      FROM idempotency.partition_bounds('idempotency.keys') AS b
    ON CONFLICT DO NOTHING;
    DELETE FROM idempotency.keys AS k
     WHERE k.scope = portable_check_key.scope AND k.key = portable_check_key.key AND k.token = stand_in;
END
$$;

-- The same for message ids about to be recorded: a stand-in row of each in every partition
-- of idempotency.messages (seen_at -infinity marks them), deleted again at once.
CREATE FUNCTION idempotency.portable_check_messages(scope text, message_ids text[]) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO idempotency.messages AS m (scope, message_id, seen_at, expires_at)
    SELECT portable_check_messages.scope, u.id, '-infinity'::timestamptz,
           CASE WHEN b.is_default THEN 'infinity'::timestamptz ELSE b.lower_bound END
      FROM unnest(message_ids) AS u(id), idempotency.partition_bounds('idempotency.messages') AS b
    ON CONFLICT DO NOTHING;
    DELETE FROM idempotency.messages AS m
     WHERE m.scope = portable_check_messages.scope AND m.message_id = ANY (message_ids)
       AND m.seen_at = '-infinity'::timestamptz;
END
$$;

-- Row-level security and the key lock (docs/security.md; the native edition's src/policy.rs).
-- A claim of a key in a scope whose INSERT policy refuses the current role must fail with
-- 42501 at once, as the INSERT does, even while another tenant's transaction holds that key:
-- waiting for the key's lock first would make it wait (and tell it that the key is held).
-- So where row-level security applies to the current role (row_security_active), a claim
-- that finds the lock taken first tries the write: the row is inserted in a subtransaction
-- that is always rolled back; 42501 passes through, anything else the trial meets (a unique
-- violation, a wait) is left to the real write. The same for idem_seen / idem_seen_many.
CREATE FUNCTION idempotency.portable_trial_claim(scope text, key text, fingerprint text, token uuid,
                                                 locked_until timestamptz, now_ timestamptz,
                                                 expires_at timestamptz) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO idempotency.keys
           (scope, key, fingerprint, status, token, attempts, locked_until, created_at, updated_at, expires_at)
    VALUES (portable_trial_claim.scope, portable_trial_claim.key, portable_trial_claim.fingerprint,
            'in_progress', portable_trial_claim.token, 1, portable_trial_claim.locked_until, now_, now_,
            portable_trial_claim.expires_at);
    RAISE EXCEPTION 'the trial write is rolled back';
EXCEPTION
    WHEN insufficient_privilege THEN
        RAISE;
    WHEN OTHERS THEN
        NULL;
END
$$;

CREATE FUNCTION idempotency.portable_trial_messages(scope text, message_ids text[], now_ timestamptz,
                                                    expires_at timestamptz) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO idempotency.messages (scope, message_id, seen_at, expires_at)
    SELECT portable_trial_messages.scope, u.id, now_, portable_trial_messages.expires_at
      FROM unnest(message_ids) AS u(id);
    RAISE EXCEPTION 'the trial write is rolled back';
EXCEPTION
    WHEN insufficient_privilege THEN
        RAISE;
    WHEN OTHERS THEN
        NULL;
END
$$;
