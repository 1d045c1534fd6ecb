-- idempotency 0.3.0 -> 0.4.0. Frozen once released, as every upgrade script.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.4.0'" to load this file. \quit

-- Issue 15: waiting duplicates (idem_claim's wait), claims safe to retry (idem_claim's
-- token), tombstones (setting idempotency.tombstone_ttl, outcome expired) and batches of
-- messages (idem_seen_many).
--
-- Builds one index (keys_responses_idx) over the records that hold a response: the UPDATE
-- blocks writes to idempotency.keys while it is built (about as long as building
-- keys_expires_at_idx takes on the same table).

-- The sweep with tombstones on (idempotency.tombstone_ttl): records that still hold a
-- response, by expiry, so that each batch finds the expired ones to turn into tombstones
-- without stepping over the tombstones it already made. A claim (no response yet) is not
-- in it; a tombstone leaves it.
CREATE INDEX keys_responses_idx ON idempotency.keys (expires_at)
    WHERE response_body IS NOT NULL OR response_headers IS NOT NULL;

COMMENT ON TYPE idempotency.claim_result IS
    'What idem_claim answers: outcome is claimed, reclaimed, replay, in_progress, mismatch or expired (tombstones on). '
    'locked_until (added after the contract''s columns) is the end of the owner''s lease.';

-- idem_claim gets two arguments with defaults (wait, token), and a new C symbol (the library
-- keeps the old one for databases not updated yet). A function's arguments cannot change in
-- place, so it is dropped and created again: grants on it (EXECUTE) must be made
-- again, and the UPDATE fails (rather than drop them) if a view or function of yours
-- depends on it. On Citus, call idempotency.distribute() again afterwards to delegate it.
DROP FUNCTION idempotency.idem_claim(text, text, text, interval, interval);
CREATE FUNCTION idempotency."idem_claim"(
	"scope" TEXT,
	"key" TEXT,
	"fingerprint" TEXT DEFAULT NULL,
	"ttl" interval DEFAULT NULL,
	"lease" interval DEFAULT NULL,
	"wait" interval DEFAULT NULL,
	"token" uuid DEFAULT NULL
) RETURNS idempotency.claim_result
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'idem_claim_wait_token_wrapper';

CREATE FUNCTION idempotency."idem_seen_many"(
	"scope" TEXT,
	"message_ids" TEXT[],
	"ttl" interval DEFAULT NULL
) RETURNS bool[]
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'idem_seen_many_wrapper';

-- The NULL-scope guard (sql/citus.sql), on the two new scope-first functions.
ALTER FUNCTION idempotency.idem_claim(text, text, text, interval, interval, interval, uuid)
    SUPPORT idempotency.idem_scope_support;
ALTER FUNCTION idempotency.idem_seen_many(text, text[], interval)
    SUPPORT idempotency.idem_scope_support;

-- stats: a last column, tombstones.
CREATE OR REPLACE VIEW idempotency.stats AS
SELECT
    (SELECT count(*) FROM idempotency.keys
      WHERE status = 'in_progress' AND locked_until IS NOT NULL
        AND expires_at > now())                                                AS in_progress,
    (SELECT count(*) FROM idempotency.keys
      WHERE status = 'completed' AND expires_at > now())                      AS completed,
    (SELECT count(*) FROM idempotency.keys
      WHERE status = 'in_progress' AND locked_until <= now()
        AND expires_at > now())                                                AS stale,
    (SELECT count(*) FROM idempotency.keys WHERE expires_at <= now())          AS expired,
    (SELECT now() - min(created_at) FROM idempotency.keys
      WHERE status = 'in_progress' AND locked_until IS NOT NULL
        AND expires_at > now())                                                AS oldest_in_progress_age,
    (SELECT count(*) FROM idempotency.messages WHERE expires_at > now())       AS messages,
    (SELECT count(*) FROM idempotency.messages WHERE expires_at <= now())      AS expired_messages,
    (SELECT count(*) FROM idempotency.keys
      WHERE status = 'completed' AND expires_at <= now()
        AND expires_at > now() - COALESCE(
              pg_catalog.current_setting('idempotency.tombstone_ttl', true), '0')::interval) AS tombstones;

COMMENT ON VIEW idempotency.stats IS
    'One row for monitoring: live records by status, stale claims (lease ended), expired rows '
    'awaiting idem_sweep, the age of the oldest in_progress claim, and tombstones (expired '
    'completed records inside idempotency.tombstone_ttl; counted in expired too).';

-- distribute(): idem_seen_many is colocated with idempotency.messages, like idem_seen.
CREATE OR REPLACE FUNCTION idempotency.distribute(delegate boolean DEFAULT true)
RETURNS TABLE (object text, action text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tbl regclass;
    colocate text;
    method "char";
    dist_column text;
    fn regprocedure;
    fn_name text;
    delegated boolean;
    guarded boolean;
    on_coordinator boolean;
BEGIN
    IF delegate IS NULL THEN
        RAISE EXCEPTION 'argument "delegate" must not be null' USING ERRCODE = '22004';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
        RAISE EXCEPTION 'Citus is not installed in database %', pg_catalog.current_database()
            USING ERRCODE = '55000',
                  HINT = 'On every node: shared_preload_libraries = ''citus'' (restart) and CREATE EXTENSION citus; '
                         'in this database. On the coordinator: citus_set_coordinator_host, citus_add_node for each '
                         'worker (Citus creates this extension on them), then call idempotency.distribute() there.';
    END IF;
    EXECUTE 'SELECT pg_catalog.citus_is_coordinator()' INTO on_coordinator;
    IF NOT on_coordinator THEN
        RAISE EXCEPTION 'idempotency.distribute() must be called on the Citus coordinator'
            USING ERRCODE = '55000',
                  HINT = 'Connect to the coordinator (or set it with citus_set_coordinator_host) and call it there.';
    END IF;

    -- The tables: keys first, then messages colocated with it.
    FOREACH tbl IN ARRAY ARRAY['idempotency.keys'::regclass, 'idempotency.messages'::regclass] LOOP
        object := tbl::text;
        method := NULL;
        dist_column := NULL;
        EXECUTE 'SELECT p.partmethod, pg_catalog.column_to_column_name(p.logicalrelid, p.partkey) '
                'FROM pg_catalog.pg_dist_partition AS p WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1'
            INTO method, dist_column USING tbl;
        IF method IS NULL THEN
            colocate := CASE WHEN tbl OPERATOR(pg_catalog.=) 'idempotency.keys'::regclass
                             THEN 'default' ELSE 'idempotency.keys' END;
            EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''scope'', colocate_with => $2)'
                USING tbl, colocate;
            -- Rows that were there before are now in the shards; drop the hidden local copy.
            EXECUTE 'SELECT pg_catalog.truncate_local_data_after_distributing_table($1)' USING tbl;
            action := 'distributed by scope';
        ELSIF method OPERATOR(pg_catalog.=) 'h' AND dist_column OPERATOR(pg_catalog.=) 'scope' THEN
            action := 'already distributed by scope';
        ELSE
            RAISE EXCEPTION '% is already a Citus table, but not hash-distributed by scope', tbl
                USING ERRCODE = '55000',
                      HINT = 'Every call reaches one shard only when the table is distributed by scope. '
                             'Undo it with undistribute_table(''' || tbl::text || '''), then call idempotency.distribute() again.';
        END IF;
        RETURN NEXT;
    END LOOP;

    -- The scope-first functions (first argument named scope): idem_claim, idem_complete,
    -- idem_checkpoint, idem_release, idem_lookup, idem_seen and idem_seen_many.
    FOR fn, fn_name, guarded IN
        SELECT p.oid::regprocedure, p.proname::text,
               COALESCE(s.pronamespace OPERATOR(pg_catalog.=) p.pronamespace, false)
        FROM pg_catalog.pg_proc AS p
        LEFT JOIN pg_catalog.pg_proc AS s ON s.oid OPERATOR(pg_catalog.=) p.prosupport
        WHERE p.pronamespace OPERATOR(pg_catalog.=) 'idempotency'::regnamespace
          AND p.prokind OPERATOR(pg_catalog.=) 'f'
          AND p.proargnames[1] OPERATOR(pg_catalog.=) 'scope'
          AND p.proargtypes[0] OPERATOR(pg_catalog.=) 'pg_catalog.text'::regtype
        ORDER BY p.proname
    LOOP
        object := fn::text;
        EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_object AS d '
                'WHERE d.classid OPERATOR(pg_catalog.=) ''pg_catalog.pg_proc''::pg_catalog.regclass '
                'AND d.objid OPERATOR(pg_catalog.=) $1 AND d.distribution_argument_index IS NOT NULL)'
            INTO delegated USING fn::oid;
        IF delegated THEN
            action := CASE WHEN guarded THEN 'already delegated'
                           ELSE 'already delegated, WITHOUT the NULL-scope guard: a NULL scope crashes the coordinator' END;
            IF NOT guarded THEN
                RAISE WARNING '% is delegated but has no NULL-scope guard', fn
                    USING DETAIL = 'Citus 13.0 crashes the coordinator when a delegated call gets a NULL distribution argument.',
                          HINT = 'Upgrade the idempotency extension to a version with the guard.';
            END IF;
        ELSIF NOT delegate THEN
            action := 'not delegated (delegate => false): runs on the coordinator';
        ELSIF NOT guarded THEN
            action := 'not delegated: this build has no NULL-scope guard; runs on the coordinator';
        ELSE
            colocate := CASE WHEN fn_name OPERATOR(pg_catalog.=) ANY (ARRAY['idem_seen', 'idem_seen_many'])
                             THEN 'idempotency.messages' ELSE 'idempotency.keys' END;
            EXECUTE 'SELECT pg_catalog.create_distributed_function($1, ''scope'', colocate_with => $2)'
                USING fn, colocate;
            action := 'delegated by scope, colocated with ' || colocate;
        END IF;
        RETURN NEXT;
    END LOOP;

    -- Delegated calls run on the workers with the workers' settings. ALTER ROLE ... SET is
    -- copied to them by Citus; ALTER DATABASE ... SET is not.
    IF EXISTS (SELECT FROM pg_catalog.pg_db_role_setting AS s
               JOIN pg_catalog.pg_database AS d ON d.oid OPERATOR(pg_catalog.=) s.setdatabase
               WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
                 AND s.setrole OPERATOR(pg_catalog.=) 0
                 AND pg_catalog.array_to_string(s.setconfig, ',') OPERATOR(pg_catalog.~) '(^|,)idempotency\.') THEN
        RAISE NOTICE 'idempotency.* is set with ALTER DATABASE here: Citus does not copy that to the workers'
            USING HINT = 'Run the same ALTER DATABASE ... SET on every worker, or use ALTER ROLE ... SET '
                         '(which Citus copies), or set it in every node''s postgresql.conf.';
    END IF;
END
$$;
