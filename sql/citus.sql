-- Scaling out with Citus: idempotency.distribute().
-- Runs in the install script after the functions. Nothing here needs Citus to install:
-- Citus is only looked up when distribute() is called.

-- Distributes idempotency.keys and idempotency.messages by scope (colocated), and
-- delegates every scope-first function to the worker that holds the scope's shard.
-- Call it once on the Citus coordinator, after the workers are added (Citus creates this
-- extension on them). Calling it again changes nothing that is already done.
--
-- Delegation is only done for functions that carry the extension's planner support
-- function (the NULL-scope guard): Citus 13.0 crashes the coordinator when a delegated
-- call gets a NULL distribution argument, and the guard turns that into SQLSTATE 22004
-- at plan time, before Citus looks at the call. Without the guard the tables are still
-- distributed and every call works, run from the coordinator.
CREATE FUNCTION idempotency.distribute(delegate boolean DEFAULT true)
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
          -- The sending side's table stays on the coordinator (docs/operations.md).
          AND p.proname OPERATOR(pg_catalog.<>) ALL (ARRAY['idem_send', 'idem_send_result'])
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

COMMENT ON FUNCTION idempotency.distribute(boolean) IS
    'On a Citus coordinator: distributes idempotency.keys and idempotency.messages by scope (colocated) '
    'and delegates the scope-first functions to the workers. Fails with 55000 where Citus is not installed.';

-- The NULL-scope guard: attached to the scope-first functions when this build has the
-- planner support function idempotency.idem_scope_support(internal) (written in Rust).
-- It refuses a NULL constant scope with 22004 while the call is planned, which is before
-- Citus's function-call delegation reads the scope.
DO $$
DECLARE
    fn regprocedure;
BEGIN
    IF pg_catalog.to_regprocedure('idempotency.idem_scope_support(internal)') IS NULL THEN
        RETURN;
    END IF;
    FOR fn IN
        SELECT p.oid::regprocedure FROM pg_catalog.pg_proc AS p
        WHERE p.pronamespace OPERATOR(pg_catalog.=) 'idempotency'::regnamespace
          AND p.prokind OPERATOR(pg_catalog.=) 'f'
          AND p.proargnames[1] OPERATOR(pg_catalog.=) 'scope'
          AND p.proargtypes[0] OPERATOR(pg_catalog.=) 'pg_catalog.text'::regtype
          -- The sending side's table stays on the coordinator (docs/operations.md).
          AND p.proname OPERATOR(pg_catalog.<>) ALL (ARRAY['idem_send', 'idem_send_result'])
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SUPPORT idempotency.idem_scope_support', fn);
    END LOOP;
END
$$;
