-- idempotency 0.5.0 -> 0.6.0. Frozen once released, as every upgrade script.
-- It brings a database at 0.5.0 to exactly what a fresh install of 0.6.0 creates, keeping the
-- data (tests/upgrade/run.sh compares the two). Say here, and in the changelogs, if it
-- rewrites a table or rebuilds an index: the UPDATE blocks writes meanwhile.
-- (Written by scripts/release.sh; with no change to the native SQL it stays as it is.)
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.6.0'" to load this file. \quit

-- Issue 34: claims that write nothing until their record is complete. idem_claim gets the
-- argument `deferred` (default false) and a new C symbol (the library keeps the old one for
-- databases not updated yet). A function's arguments cannot change in place, so it is
-- dropped and created again: grants on it (EXECUTE) must be made again, and the UPDATE
-- fails (rather than drop them) if a view or function of yours depends on it. On Citus,
-- call idempotency.distribute() again afterwards to delegate it.
DROP FUNCTION idempotency.idem_claim(text, text, text, interval, interval, interval, uuid);
CREATE FUNCTION idempotency."idem_claim"(
	"scope" TEXT,
	"key" TEXT,
	"fingerprint" TEXT DEFAULT NULL,
	"ttl" interval DEFAULT NULL,
	"lease" interval DEFAULT NULL,
	"wait" interval DEFAULT NULL,
	"token" uuid DEFAULT NULL,
	"deferred" bool DEFAULT false
) RETURNS idempotency.claim_result
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'idem_claim_deferred_wrapper';

-- The NULL-scope guard (sql/citus.sql), on the new idem_claim.
ALTER FUNCTION idempotency.idem_claim(text, text, text, interval, interval, interval, uuid, boolean)
    SUPPORT idempotency.idem_scope_support;

-- Issue 35: records in time partitions (docs/operations.md#partitions). The 0.5.0 tables
-- stay, renamed keys_legacy and messages_legacy, with their rows, grants, policies and
-- indexes; the new keys and messages are partitioned (as sql/bootstrap.sql makes them), with
-- the same grants, row-level security and policies. Claims in flight move now (a few rows:
-- the functions look for a claim in keys_claims only); every other record stays where it is,
-- and the functions read the legacy tables after the partitions while they are there.
-- idem_sweep then moves their live records into the partitions in batches, deletes the
-- expired ones as before, and drops each legacy table once it is empty (as the tables'
-- owner). So the UPDATE rewrites no table and holds its locks for as long as the claims in
-- flight take to move. On Citus, where keys is distributed, the tables stay as they are
-- (distributed, not partitioned) and nothing moves: docs/operations.md#citus.
-- For the UPDATE only (dropped at its end): gives the new table what the renamed one had:
-- its owner, grants, row-level security and policies (so that roles and tenants keep exactly
-- the access they had, docs/security.md), and the owner to its partitions.
CREATE FUNCTION idempotency.upgrade_copy_access(old regclass, new regclass, parts regclass[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    owner name := (SELECT pg_get_userbyid(c.relowner) FROM pg_class AS c WHERE c.oid = old);
    p regclass;
    g record;
    pol record;
BEGIN
    EXECUTE format('ALTER TABLE %s OWNER TO %I', new, owner);
    FOREACH p IN ARRAY parts LOOP
        EXECUTE format('ALTER TABLE %s OWNER TO %I', p, owner);
    END LOOP;
    FOR g IN
        SELECT a.grantee, a.privilege_type, a.is_grantable
          FROM pg_class AS c, aclexplode(c.relacl) AS a
         WHERE c.oid = old AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON %s TO %s%s', g.privilege_type, new,
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(g.grantee)) END,
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
    IF (SELECT c.relrowsecurity FROM pg_class AS c WHERE c.oid = old) THEN
        EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', new);
    END IF;
    IF (SELECT c.relforcerowsecurity FROM pg_class AS c WHERE c.oid = old) THEN
        EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', new);
    END IF;
    FOR pol IN
        SELECT y.polname, y.polpermissive, y.polcmd,
               pg_get_expr(y.polqual, y.polrelid) AS qual, pg_get_expr(y.polwithcheck, y.polrelid) AS checked,
               (SELECT string_agg(CASE WHEN r = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r)) END, ', ')
                  FROM unnest(y.polroles) AS r) AS roles
          FROM pg_policy AS y WHERE y.polrelid = old
    LOOP
        EXECUTE format('CREATE POLICY %I ON %s AS %s FOR %s TO %s%s%s', pol.polname, new,
                       CASE WHEN pol.polpermissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END,
                       CASE pol.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE'
                                       WHEN 'd' THEN 'DELETE' ELSE 'ALL' END,
                       pol.roles,
                       coalesce(' USING (' || pol.qual || ')', ''),
                       coalesce(' WITH CHECK (' || pol.checked || ')', ''));
    END LOOP;
END
$$;

DO $upgrade$
DECLARE
    citus boolean := EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus');
    distributed boolean := false;
    con record;
BEGIN
    IF citus THEN
        EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition '
                'WHERE logicalrelid OPERATOR(pg_catalog.=) ''idempotency.keys''::pg_catalog.regclass)'
            INTO distributed;
    END IF;
    IF distributed THEN
        RAISE NOTICE 'idempotency 0.6.0: idempotency.keys is distributed by Citus; it stays as it is (not partitioned)';
        RETURN;
    END IF;

    ALTER TABLE idempotency.keys RENAME TO keys_legacy;
    ALTER TABLE idempotency.keys_legacy RENAME CONSTRAINT keys_pkey TO keys_legacy_pkey;
    ALTER INDEX idempotency.keys_expires_at_idx RENAME TO keys_legacy_expires_at_idx;
    ALTER INDEX idempotency.keys_responses_idx RENAME TO keys_legacy_responses_idx;
    ALTER INDEX idempotency.keys_in_progress_idx RENAME TO keys_legacy_in_progress_idx;
    COMMENT ON TABLE idempotency.keys_legacy IS
        'The records of idempotency 0.5.0, read after idempotency.keys until idem_sweep has moved '
        'or deleted them all and dropped this table.';
    ALTER TABLE idempotency.messages RENAME TO messages_legacy;
    ALTER TABLE idempotency.messages_legacy RENAME CONSTRAINT messages_pkey TO messages_legacy_pkey;
    ALTER INDEX idempotency.messages_expires_at_idx RENAME TO messages_legacy_expires_at_idx;
    COMMENT ON TABLE idempotency.messages_legacy IS
        'The message ids of idempotency 0.5.0, read after idempotency.messages until idem_sweep '
        'has moved or deleted them all and dropped this table.';
    -- PostgreSQL 18 names the NOT NULL constraints (keys_scope_not_null ...): the renamed
    -- tables' go with them, so that the new tables' get the same names as a fresh install's.
    FOR con IN
        SELECT c.conrelid::pg_catalog.regclass AS tab, c.conname
          FROM pg_catalog.pg_constraint AS c
         WHERE c.conrelid OPERATOR(pg_catalog.=) ANY (ARRAY['idempotency.keys_legacy'::pg_catalog.regclass,
                                                            'idempotency.messages_legacy'::pg_catalog.regclass])
           AND c.contype OPERATOR(pg_catalog.=) 'n'
    LOOP
        EXECUTE pg_catalog.format('ALTER TABLE %s RENAME CONSTRAINT %I TO %I', con.tab, con.conname,
                                  pg_catalog.regexp_replace(con.conname, '^(keys|messages)_', '\1_legacy_'));
    END LOOP;

    CREATE TABLE idempotency.keys (
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
        expires_at       timestamptz NOT NULL
    ) PARTITION BY RANGE ((CASE WHEN status = 'completed' THEN expires_at ELSE '-infinity'::timestamptz END));
    COMMENT ON TABLE idempotency.keys IS
        'One idempotency record per (scope, key). Written through the idem_* functions; '
        'a record with expires_at <= now() is treated as absent until idem_sweep drops or deletes it.';
    CREATE TABLE idempotency.keys_claims PARTITION OF idempotency.keys (
        CONSTRAINT keys_claims_pkey PRIMARY KEY (scope, key)
    ) FOR VALUES FROM (MINVALUE) TO ('1970-01-01 00:00:00+00');
    ALTER TABLE idempotency.keys_claims SET (
        autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_vacuum_insert_scale_factor = 0.01
    );
    CREATE INDEX keys_in_progress_idx ON idempotency.keys_claims (locked_until)
        WHERE status = 'in_progress' AND locked_until IS NOT NULL;
    CREATE INDEX keys_claims_expires_at_idx ON idempotency.keys_claims (expires_at);
    CREATE TABLE idempotency.keys_far PARTITION OF idempotency.keys (
        CONSTRAINT keys_far_pkey PRIMARY KEY (scope, key)
    ) DEFAULT;
    ALTER TABLE idempotency.keys_far SET (
        autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_vacuum_insert_scale_factor = 0.01
    );
    CREATE INDEX keys_far_expires_at_idx ON idempotency.keys_far (expires_at);
    CREATE INDEX keys_responses_idx ON idempotency.keys_far (expires_at)
        WHERE response_body IS NOT NULL OR response_headers IS NOT NULL;

    CREATE TABLE idempotency.messages (
        scope      text        NOT NULL,
        message_id text        NOT NULL,
        seen_at    timestamptz NOT NULL,
        expires_at timestamptz NOT NULL
    ) PARTITION BY RANGE (expires_at);
    COMMENT ON TABLE idempotency.messages IS
        'Message ids recorded by idem_seen; expired rows are treated as absent until idem_sweep drops or deletes them.';
    CREATE TABLE idempotency.messages_far PARTITION OF idempotency.messages (
        CONSTRAINT messages_far_pkey PRIMARY KEY (scope, message_id)
    ) DEFAULT;
    ALTER TABLE idempotency.messages_far SET (
        autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_vacuum_insert_scale_factor = 0.01
    );
    CREATE INDEX messages_far_expires_at_idx ON idempotency.messages_far (expires_at);

    PERFORM pg_catalog.pg_extension_config_dump('idempotency.keys_claims', '');
    PERFORM pg_catalog.pg_extension_config_dump('idempotency.keys_far', '');
    PERFORM pg_catalog.pg_extension_config_dump('idempotency.messages_far', '');

    PERFORM idempotency.upgrade_copy_access('idempotency.keys_legacy', 'idempotency.keys',
                                            ARRAY['idempotency.keys_claims', 'idempotency.keys_far']::regclass[]);
    PERFORM idempotency.upgrade_copy_access('idempotency.messages_legacy', 'idempotency.messages',
                                            ARRAY['idempotency.messages_far']::regclass[]);

    -- idem_lookup returns rows of idempotency.keys: the renamed table's row type went with
    -- it, so the function is made again for the new table (its grants must be made again, and
    -- the UPDATE fails rather than drop a view or function of yours that depends on it).
    DROP FUNCTION idempotency.idem_lookup(text, text);
    CREATE FUNCTION idempotency."idem_lookup"(
        "scope" TEXT,
        "key" TEXT
    ) RETURNS SETOF idempotency.keys
    STABLE PARALLEL RESTRICTED
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'idem_lookup_wrapper';
    ALTER FUNCTION idempotency.idem_lookup(text, text) SUPPORT idempotency.idem_scope_support;

    -- The claims in flight (and any record not completed) move now.
    WITH moved AS (DELETE FROM idempotency.keys_legacy WHERE status OPERATOR(pg_catalog.<>) 'completed' RETURNING *)
    INSERT INTO idempotency.keys SELECT * FROM moved;
END
$upgrade$;

DROP FUNCTION idempotency.upgrade_copy_access(regclass, regclass, regclass[]);

-- The time partitions' functions and view: sql/partitions.sql as released in 0.6.0.
-- >>> sql/partitions.sql
CREATE FUNCTION idempotency.partition_period_seconds() RETURNS float8
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    raw text := current_setting('idempotency.partition_period', true);
    val interval;
BEGIN
    IF raw IS NULL OR raw = '' THEN
        RETURN 86400;
    END IF;
    BEGIN
        val := raw::interval;
    EXCEPTION WHEN data_exception OR syntax_error THEN
        val := NULL;
    END;
    IF val = interval '0' THEN
        RETURN 0;
    END IF;
    IF val IS NULL OR extract(month FROM val) <> 0 OR extract(year FROM val) <> 0
       OR val < interval '1 second' OR val > interval '366 days' THEN
        RAISE EXCEPTION 'invalid value for setting "idempotency.partition_period": "%" (it must be 0 or a fixed length of 1 second to 366 days, no months)', raw
            USING ERRCODE = '22023';
    END IF;
    RETURN extract(epoch FROM val);
END
$$;

-- One partition of a table: its relation, and its bounds (NULL: MINVALUE / MAXVALUE; the
-- default partition has both NULL and is_default).
CREATE FUNCTION idempotency.partition_bounds(parent regclass)
RETURNS TABLE (part regclass, lower_bound timestamptz, upper_bound timestamptz, is_default boolean)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.oid::regclass,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\)'))[1]::timestamptz,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)'))[1]::timestamptz,
           pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT'
      FROM pg_inherits AS i
      JOIN pg_class AS c ON c.oid = i.inhrelid
     WHERE i.inhparent = parent
$$;

-- Makes the partitions of `parent` that new records need, moving into each the rows of
-- `far` (its default partition) that belong there, and drops the partitions whose every
-- record expired more than `grace` ago. Each step waits at most lock_timeout for its locks
-- (partitions_maintain sets 100 ms): a step that cannot have them is left for the next call,
-- with a NOTICE. Returns what it did: 'created' (with the rows moved in) or 'dropped' (with
-- the rows the statistics last counted in it).
CREATE FUNCTION idempotency.partition_maintain(parent regclass, far regclass, key_expr text,
                                               primary_key text, grace interval)
RETURNS TABLE (action text, partition_name text, rows_moved bigint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    period float8 := idempotency.partition_period_seconds();
    horizon timestamptz;
    start_at timestamptz;
    end_at timestamptz;
    last_upper timestamptz;
    made int := 0;
    name text;
    qualified text;
    moved bigint;
    distributed boolean;
    p record;
BEGIN
    horizon := now() + coalesce(nullif(current_setting('idempotency.default_ttl', true), '')::interval,
                                interval '24 hours')
               + make_interval(secs => 2 * period);
    SELECT max(b.upper_bound) INTO last_upper
      FROM idempotency.partition_bounds(parent) AS b
     WHERE NOT b.is_default AND b.lower_bound IS NOT NULL;
    -- A period that ended is not made: no new record expires in it.
    start_at := greatest(last_upper, to_timestamp(floor(extract(epoch FROM now()) / greatest(period, 1)) * greatest(period, 1)));
    WHILE period > 0 AND start_at < horizon AND made < 1000 LOOP
        end_at := to_timestamp((floor(extract(epoch FROM start_at) / period) + 1) * period);
        name := pg_catalog.format('%s_%s', (SELECT c.relname FROM pg_class AS c WHERE c.oid = parent),
                                  to_char(start_at AT TIME ZONE 'UTC', 'YYYYMMDD"t"HH24MISS'));
        qualified := pg_catalog.format('idempotency.%I', name);
        BEGIN
            EXECUTE pg_catalog.format(
                'CREATE TABLE %s (LIKE %s INCLUDING DEFAULTS INCLUDING STORAGE INCLUDING COMPRESSION)',
                qualified, parent);
            EXECUTE pg_catalog.format('ALTER TABLE %s ADD CONSTRAINT %I PRIMARY KEY (%s)',
                                      qualified, name || '_pkey', primary_key);
            -- So that ATTACH does not scan the new table for rows outside the period; the
            -- constraint is dropped once attached (every CHECK costs each INSERT a plan).
            EXECUTE pg_catalog.format('ALTER TABLE %s ADD CONSTRAINT %I CHECK (%s >= %L AND %s < %L)',
                                      qualified, name || '_period', key_expr, start_at, key_expr, end_at);
            -- The rows of this period that went to the far partition move here; no new one
            -- may go there meanwhile.
            EXECUTE pg_catalog.format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', far);
            EXECUTE pg_catalog.format(
                'WITH moved AS (DELETE FROM %s WHERE expires_at >= %L AND expires_at < %L RETURNING *) '
                'INSERT INTO %s SELECT * FROM moved', far, start_at, end_at, qualified);
            GET DIAGNOSTICS moved = ROW_COUNT;
            EXECUTE pg_catalog.format('ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM (%L) TO (%L)',
                                      parent, qualified, start_at, end_at);
            EXECUTE pg_catalog.format('ALTER TABLE %s DROP CONSTRAINT %I', qualified, name || '_period');
            -- On Citus the ATTACH distributed the new partition, copying the moved rows into
            -- its shards: the local copy they came from goes.
            IF moved > 0 AND pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
                EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition '
                        'WHERE logicalrelid OPERATOR(pg_catalog.=) $1)' INTO distributed USING qualified::regclass;
                IF distributed THEN
                    EXECUTE 'SELECT pg_catalog.truncate_local_data_after_distributing_table($1)'
                        USING qualified::regclass;
                END IF;
            END IF;
            action := 'created';
            partition_name := qualified;
            rows_moved := moved;
            RETURN NEXT;
        EXCEPTION
            WHEN lock_not_available THEN
                RAISE NOTICE 'idem_sweep: % was not made this time (its locks were busy); the next sweep makes it', qualified;
                EXIT;
            WHEN OTHERS THEN
                RAISE WARNING 'idem_sweep: % was not made: %', qualified, SQLERRM;
                EXIT;
        END;
        start_at := end_at;
        made := made + 1;
    END LOOP;

    FOR p IN
        SELECT b.part, c.reltuples
          FROM idempotency.partition_bounds(parent) AS b
          JOIN pg_class AS c ON c.oid = b.part
         WHERE NOT b.is_default AND b.lower_bound IS NOT NULL AND b.upper_bound + grace <= now()
         ORDER BY b.upper_bound
    LOOP
        partition_name := p.part::text;
        BEGIN
            EXECUTE pg_catalog.format('DROP TABLE %s', p.part);
            action := 'dropped';
            rows_moved := greatest(p.reltuples, 0)::bigint;
            RETURN NEXT;
        EXCEPTION
            WHEN lock_not_available THEN
                RAISE NOTICE 'idem_sweep: % was not dropped this time (a transaction was using the table); the next sweep drops it', partition_name;
                EXIT;
            WHEN OTHERS THEN
                RAISE WARNING 'idem_sweep: % was not dropped: %', partition_name, SQLERRM;
                EXIT;
        END;
    END LOOP;
END
$$;

-- A database updated from 0.5.0 keeps its records in keys_legacy and messages_legacy until
-- idem_sweep has moved the live ones into the partitions and deleted the expired ones
-- (sql/idempotency--0.5.0--0.6.0.sql): then the emptied table leaves the extension and is
-- dropped, waiting at most lock_timeout for its lock (the next sweep tries again).
CREATE FUNCTION idempotency.legacy_drop_when_empty()
RETURNS TABLE (action text, partition_name text, rows_moved bigint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    legacy regclass;
    empty boolean;
BEGIN
    FOREACH legacy IN ARRAY ARRAY[to_regclass('idempotency.keys_legacy'), to_regclass('idempotency.messages_legacy')] LOOP
        CONTINUE WHEN legacy IS NULL;
        EXECUTE format('SELECT NOT EXISTS (SELECT FROM %s)', legacy) INTO empty;
        CONTINUE WHEN NOT empty;
        partition_name := legacy::text;
        BEGIN
            -- The table and its row type were the extension's (before 0.6.0 the table was
            -- keys or messages): they leave it first.
            IF EXISTS (SELECT FROM pg_depend AS d JOIN pg_extension AS e ON e.oid = d.refobjid
                        WHERE d.classid = 'pg_class'::regclass AND d.objid = legacy AND d.deptype = 'e'
                          AND e.extname = 'idempotency') THEN
                EXECUTE format('ALTER EXTENSION idempotency DROP TABLE %s', legacy);
            END IF;
            IF EXISTS (SELECT FROM pg_depend AS d JOIN pg_extension AS e ON e.oid = d.refobjid
                        JOIN pg_class AS c ON c.reltype = d.objid
                        WHERE d.classid = 'pg_type'::regclass AND c.oid = legacy AND d.deptype = 'e'
                          AND e.extname = 'idempotency') THEN
                EXECUTE format('ALTER EXTENSION idempotency DROP TYPE %s', legacy);
            END IF;
            EXECUTE format('DROP TABLE %s', legacy);
            action := 'dropped';
            rows_moved := 0;
            RETURN NEXT;
        EXCEPTION WHEN OTHERS THEN
            RAISE WARNING 'idem_sweep: % is empty but was not dropped this time: %', partition_name, SQLERRM;
        END;
    END LOOP;
END
$$;

-- Would partitions_maintain() have something to do now: a period to make (the periods end
-- before now() + idempotency.default_ttl + one period) or to drop?
CREATE FUNCTION idempotency.partitions_due() RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT idempotency.partition_period_seconds() > 0 AND EXISTS (
               SELECT FROM (VALUES ('idempotency.keys'::regclass), ('idempotency.messages'::regclass)) AS t(parent)
                WHERE coalesce((SELECT max(b.upper_bound) FROM idempotency.partition_bounds(t.parent) AS b
                                 WHERE NOT b.is_default AND b.lower_bound IS NOT NULL), '-infinity')
                      < now() + coalesce(nullif(current_setting('idempotency.default_ttl', true), '')::interval,
                                         interval '24 hours')
                        + make_interval(secs => idempotency.partition_period_seconds()))
        OR EXISTS (
               SELECT FROM idempotency.partition_bounds('idempotency.keys') AS b
                WHERE NOT b.is_default AND b.lower_bound IS NOT NULL
                  AND b.upper_bound + coalesce(nullif(current_setting('idempotency.tombstone_ttl', true), '')::interval,
                                               interval '0') <= now()
               UNION ALL
               SELECT FROM idempotency.partition_bounds('idempotency.messages') AS b
                WHERE NOT b.is_default AND b.lower_bound IS NOT NULL AND b.upper_bound <= now())
$$;

-- The partitions of both tables, kept: what idem_sweep calls last, when it runs in a
-- transaction of its own (the locks of ATTACH and DROP last until COMMIT). For keys, a period
-- is dropped once its tombstones ended too (idempotency.tombstone_ttl). ATTACH and DROP need
-- the tables' owner: for any other role it does nothing but say so (a NOTICE); schedule the
-- sweep as the owner (schedule_maintenance does, as the role that calls it).
CREATE FUNCTION idempotency.partitions_maintain()
RETURNS TABLE (action text, partition_name text, rows_moved bigint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
AS $$
BEGIN
    IF NOT pg_has_role((SELECT c.relowner FROM pg_class AS c WHERE c.oid = 'idempotency.keys'::regclass), 'USAGE') THEN
        RAISE NOTICE 'idem_sweep: only the owner of idempotency.keys makes and drops its partitions; % is not', current_user
            USING HINT = 'Run idem_sweep as the owner of the extension''s tables (pg_cron: schedule it as that role).';
        RETURN;
    END IF;
    RETURN QUERY
    SELECT * FROM idempotency.partition_maintain(
        'idempotency.keys', 'idempotency.keys_far',
        '(CASE WHEN status = ''completed'' THEN expires_at ELSE ''-infinity''::timestamptz END)',
        'scope, key',
        coalesce(nullif(current_setting('idempotency.tombstone_ttl', true), '')::interval, interval '0'));
    RETURN QUERY
    SELECT * FROM idempotency.partition_maintain(
        'idempotency.messages', 'idempotency.messages_far', 'expires_at', 'scope, message_id', interval '0');
    RETURN QUERY SELECT * FROM idempotency.legacy_drop_when_empty();
END
$$;

-- Every partition of keys and messages with its period and the rows the statistics last
-- counted in it: what an operator looks at (docs/operations.md#partitions).
CREATE VIEW idempotency.partitions AS
SELECT b.part::text AS partition_name,
       CASE WHEN b.is_default THEN 'far'
            WHEN b.lower_bound IS NULL THEN 'claims'
            ELSE 'period' END AS kind,
       b.lower_bound, b.upper_bound,
       greatest(c.reltuples, 0)::bigint AS estimated_rows,
       pg_catalog.pg_total_relation_size(b.part) AS total_bytes
  FROM (SELECT * FROM idempotency.partition_bounds('idempotency.keys')
        UNION ALL
        SELECT * FROM idempotency.partition_bounds('idempotency.messages')) AS b
  JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) b.part;
-- <<< sql/partitions.sql

-- The stats view reads the partitions (as sql/finalize.sql).
-- Issue 32, a sending side you can leave running (docs/sending.md): idem_send_next never waits
-- for a lock (each backend counts in budget rows of its own, the lock of a target's retries is
-- only tried), and the retry budget gives retries back once the receiver answers again (final
-- answers earn them: send_retries_allowed, over the setting idempotency.send_retry_window).
-- outbound_budget: slot becomes backend_pid (its rows are kept: they count as before) and two
-- counts are added, without a rewrite (a constant default). The new partial index on the
-- gave_up rows reads idempotency.outbound once, blocking writes to it meanwhile.
DROP FUNCTION idempotency.send_count_attempts(text, bigint, bigint);

ALTER TABLE idempotency.outbound_budget RENAME COLUMN slot TO backend_pid;

-- PostgreSQL 18 keeps a NOT NULL as a constraint named after its column: it follows the rename.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_constraint
                WHERE conrelid = 'idempotency.outbound_budget'::pg_catalog.regclass
                  AND conname = 'outbound_budget_slot_not_null') THEN
        ALTER TABLE idempotency.outbound_budget
            RENAME CONSTRAINT outbound_budget_slot_not_null TO outbound_budget_backend_pid_not_null;
    END IF;
END
$$;

ALTER TABLE idempotency.outbound_budget
    ADD COLUMN final_answers bigint NOT NULL DEFAULT 0,
    ADD COLUMN retryable_answers bigint NOT NULL DEFAULT 0;

COMMENT ON TABLE idempotency.outbound_budget IS
    'Per target, the first attempts and retries handed out by idem_send_next and the final and '
    'retryable answers recorded by idem_send_result, in buckets of a sixtieth of '
    'idempotency.send_retry_window, one row per backend and bucket: the retry budget sums the '
    'window. Rows older than two windows (at least two minutes) are deleted as senders go and by '
    'idem_sweep.';

-- Sends that gave up, by when: idempotency.stats counts them and finds the latest (an alert
-- reads it) without reading the done rows.
CREATE INDEX outbound_gave_up_idx ON idempotency.outbound (finished_at)
    WHERE state = 'gave_up';

-- idempotency.send_retry_window: what the retry budget counts over, 1 second to 1 day, default
-- 1 minute (22023 otherwise, naming the setting).
CREATE FUNCTION idempotency.send_retry_window() RETURNS interval
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    val interval;
BEGIN
    -- The default, as SHOW prints it, without parsing (every count reads the setting).
    IF coalesce(current_setting('idempotency.send_retry_window', true), '') IN ('1min', '') THEN
        RETURN interval '1 minute';
    END IF;
    val := idempotency.send_interval_setting('idempotency.send_retry_window', interval '1 minute');
    IF val < interval '1 second' OR val > interval '1 day' THEN
        RAISE EXCEPTION 'invalid value for setting "idempotency.send_retry_window": "%" (it must be an interval of 1 second to 1 day)', val
            USING ERRCODE = '22023';
    END IF;
    RETURN val;
END
$$;

-- The retry budget's arithmetic, the one place it is written (docs/sending.md, "The retry
-- budget"): how many retries of a target may be handed out now, from its counts over the
-- window W (idempotency.send_retry_window):
--   bound   = floor(ratio * first_attempts + 10)     all that is allowed while the receiver fails
--   earned  = 2 * final_answers_since_failure        final answers recorded since the target's
--                                                    latest retryable answer, two retries each
--   retries        + now <= bound + earned            over W
--   recent_retries + now <= floor(bound / 6) + earned over the last sixth of W
-- While every answer is retryable nothing is earned and retries stay within the bound, spread
-- over the window (six sixths of floor(bound / 6) never add up to more than the bound), so that
-- one goes out in every sixth of it and sees the receiver back.
-- Once it answers, each final answer earns two retries: the retries double every round trip
-- (slow start) until the backlog is sent. ratio 0: no retries at all.
CREATE FUNCTION idempotency.send_retries_allowed(ratio float8, first_attempts bigint, retries bigint,
                                                 recent_retries bigint, final_answers_since_failure bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN ratio <= 0 THEN 0::bigint
                ELSE greatest(0, least(l.bound + l.earned - retries,
                                       floor(l.bound / 6) + l.earned - recent_retries))::bigint END
      FROM (SELECT least(floor(ratio * first_attempts + 10), 1e15::float8) AS bound,
                   least(2 * final_answers_since_failure::float8, 1e15::float8) AS earned) AS l
$$;

-- The retries `target` may still be handed out now (send_retries_allowed), from its counts
-- over the window: retries in every bucket that overlaps it, first attempts in the buckets
-- inside it, so that counting in buckets never loosens the bound.
CREATE OR REPLACE FUNCTION idempotency.send_retry_allowance(target text) RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ratio float8 := idempotency.send_retry_budget();
    w interval := idempotency.send_retry_window();
    width interval := w / 60;
    c record;
BEGIN
    IF ratio = 0 THEN
        RETURN 0;
    END IF;
    WITH counts AS (SELECT b.bucket, b.first_attempts, b.retries, b.final_answers, b.retryable_answers
                      FROM idempotency.outbound_budget AS b
                     WHERE b.target = send_retry_allowance.target AND b.bucket > now() - w - width),
         failed AS (SELECT max(n.bucket) AS at FROM counts AS n WHERE n.retryable_answers > 0)
    SELECT coalesce(sum(n.first_attempts) FILTER (WHERE n.bucket >= now() - w), 0)::bigint AS firsts,
           coalesce(sum(n.retries), 0)::bigint AS retries,
           coalesce(sum(n.retries) FILTER (WHERE n.bucket > now() - w / 6 - width), 0)::bigint AS recent,
           coalesce(sum(n.final_answers) FILTER (WHERE f.at IS NULL OR n.bucket > f.at), 0)::bigint AS earned
      INTO c
      FROM failed AS f LEFT JOIN counts AS n ON true;
    RETURN idempotency.send_retries_allowed(ratio, c.firsts, c.retries, c.recent, c.earned);
END
$$;

-- Counts, in this backend's own row of the current bucket, what idem_send_next handed out to
-- `target` and what idem_send_result recorded for it. No other session writes that row, so
-- this never waits for a lock. A backend's first count in a bucket also deletes the target's
-- rows older than two windows (at least two minutes), skipping any that a session holds.
CREATE FUNCTION idempotency.send_count(target text, first_attempts bigint, retries bigint,
                                       final_answers bigint, retryable_answers bigint) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    w interval := idempotency.send_retry_window();
    v_bucket timestamptz := date_bin(w / 60, now(), timestamptz '2000-01-01 00:00:00+00');
BEGIN
    UPDATE idempotency.outbound_budget AS b
       SET first_attempts = b.first_attempts + send_count.first_attempts,
           retries = b.retries + send_count.retries,
           final_answers = b.final_answers + send_count.final_answers,
           retryable_answers = b.retryable_answers + send_count.retryable_answers
     WHERE b.target = send_count.target AND b.bucket = v_bucket AND b.backend_pid = pg_backend_pid();
    IF FOUND THEN
        RETURN;
    END IF;
    INSERT INTO idempotency.outbound_budget
           (target, bucket, backend_pid, first_attempts, retries, final_answers, retryable_answers)
    VALUES (send_count.target, v_bucket, pg_backend_pid(), send_count.first_attempts, send_count.retries,
            send_count.final_answers, send_count.retryable_answers);
    DELETE FROM idempotency.outbound_budget AS b
     WHERE (b.target, b.bucket, b.backend_pid) IN (
           SELECT o.target, o.bucket, o.backend_pid FROM idempotency.outbound_budget AS o
            WHERE o.target = send_count.target AND o.bucket < now() - 2 * greatest(w, interval '1 minute')
              FOR UPDATE SKIP LOCKED);
END
$$;

CREATE OR REPLACE FUNCTION idempotency.send_take(p_target text, p_max_rows int, p_lease interval,
                                      p_scope text, p_operation text)
RETURNS TABLE (o_scope text, o_operation text, o_target text, o_key text, o_request jsonb,
               o_attempt int, o_token uuid, o_locked_until timestamptz, o_give_up_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_lease interval;
    v_target text;
    v_left int;
    v_allowance bigint;
    v_firsts bigint;
    v_retries bigint;
    v_row idempotency.outbound;
    v_token uuid;
BEGIN
    IF p_max_rows IS NULL THEN
        RAISE EXCEPTION 'argument "max_rows" must not be null' USING ERRCODE = '22004';
    END IF;
    IF p_max_rows < 1 OR p_max_rows > 10000 THEN
        RAISE EXCEPTION 'invalid argument "max_rows": must be between 1 and 10000 (got %)', p_max_rows
            USING ERRCODE = '22023';
    END IF;
    v_lease := coalesce(idempotency.send_check_interval('argument "lease"', p_lease),
                        idempotency.send_interval_setting('idempotency.default_lease', interval '5 minutes'));
    IF p_target IS NOT NULL THEN
        PERFORM idempotency.send_check_text('target', p_target);
    END IF;
    IF (p_scope IS NULL) <> (p_operation IS NULL) THEN
        RAISE EXCEPTION 'argument "%" must not be null when "%" is given',
              CASE WHEN p_scope IS NULL THEN 'scope' ELSE 'operation' END,
              CASE WHEN p_scope IS NULL THEN 'operation' ELSE 'scope' END
            USING ERRCODE = '22004';
    END IF;
    IF p_scope IS NOT NULL THEN
        PERFORM idempotency.send_check_text('scope', p_scope);
        PERFORM idempotency.send_check_text('operation', p_operation);
    END IF;

    v_left := p_max_rows;
    -- One target at a time (the budget is per target): the given one, the one of the given
    -- operation, or each target with sends not finished (read by skipping through the index).
    FOR v_target IN
        WITH RECURSIVE targets AS (
            (SELECT o.target FROM idempotency.outbound AS o
              WHERE p_target IS NULL AND p_scope IS NULL AND o.state IN ('pending', 'sending')
              ORDER BY o.target LIMIT 1)
            UNION ALL
            SELECT (SELECT o.target FROM idempotency.outbound AS o
                     WHERE o.state IN ('pending', 'sending') AND o.target > t.target
                     ORDER BY o.target LIMIT 1)
              FROM targets AS t WHERE t.target IS NOT NULL
        )
        SELECT p_target WHERE p_target IS NOT NULL
        UNION ALL
        SELECT o.target FROM idempotency.outbound AS o
         WHERE p_target IS NULL AND o.scope = p_scope AND o.operation = p_operation
        UNION ALL
        SELECT t.target FROM targets AS t WHERE t.target IS NOT NULL
    LOOP
        EXIT WHEN v_left = 0;
        v_allowance := NULL;
        v_firsts := 0;
        v_retries := 0;
        -- Due rows past give_up_at become gave_up now, whatever the budget holds back.
        FOR v_row IN
            SELECT o.* FROM idempotency.outbound AS o
             WHERE o.target = v_target AND o.state IN ('pending', 'sending') AND o.give_up_at <= now()
               AND o.next_attempt_at <= now()
               AND (p_scope IS NULL OR (o.scope = p_scope AND o.operation = p_operation))
             ORDER BY o.next_attempt_at LIMIT 1000
               FOR UPDATE SKIP LOCKED
        LOOP
            PERFORM idempotency.send_hand_out(v_row, v_lease);
        END LOOP;
        -- First attempts first (never held back by the budget), then retries; each due-first.
        -- Each query is LIMITed to what may be handed out: FOR UPDATE locks every row the
        -- loop fetches, and a row locked but not handed out would be kept from other senders.
        FOR v_row IN
            SELECT o.* FROM idempotency.outbound AS o
             WHERE o.target = v_target AND o.state = 'pending' AND o.attempts = 0
               AND o.next_attempt_at <= now()
               AND (p_scope IS NULL OR (o.scope = p_scope AND o.operation = p_operation))
             ORDER BY o.next_attempt_at LIMIT v_left
               FOR UPDATE SKIP LOCKED
        LOOP
            v_token := idempotency.send_hand_out(v_row, v_lease);
            IF v_token IS NOT NULL THEN
                v_firsts := v_firsts + 1;
                RETURN QUERY SELECT v_row.scope, v_row.operation, v_row.target, v_row.key, v_row.request,
                                    v_row.attempts + 1, v_token, now() + v_lease, v_row.give_up_at;
                v_left := v_left - 1;
            END IF;
        END LOOP;
        -- This call's first attempts count toward the budget the retries read.
        IF v_firsts > 0 THEN
            PERFORM idempotency.send_count(v_target, v_firsts, 0, 0, 0);
        END IF;
        -- Retries, only when one is due: one sender of a target at a time reads the budget and
        -- hands them out, holding a transaction-level advisory lock of the target, so that the
        -- next reads it with those retries counted (the packages' transactions end right after
        -- idem_send_next). The lock is only tried: a sender that finds it held hands out no
        -- retries this time (the holder does). Nothing in here ever waits for a lock, so no
        -- two senders can deadlock: rows are taken with SKIP LOCKED, counts go to rows of the
        -- backend's own.
        v_allowance := 0;
        IF v_left > 0 AND EXISTS (
            SELECT FROM idempotency.outbound AS o
             WHERE o.target = v_target AND o.state IN ('pending', 'sending')
               AND o.attempts > 0 AND o.next_attempt_at <= now()
               AND (p_scope IS NULL OR (o.scope = p_scope AND o.operation = p_operation)))
        THEN
            IF pg_try_advisory_xact_lock(hashtextextended('idempotency.outbound_budget ' || v_target, 0)) THEN
                v_allowance := idempotency.send_retry_allowance(v_target);
            END IF;
        END IF;
        IF v_allowance > 0 THEN
            FOR v_row IN
                SELECT o.* FROM idempotency.outbound AS o
                 WHERE o.target = v_target AND o.state IN ('pending', 'sending')
                   AND o.attempts > 0 AND o.next_attempt_at <= now()
                   AND (p_scope IS NULL OR (o.scope = p_scope AND o.operation = p_operation))
                 ORDER BY o.next_attempt_at LIMIT least(v_left, v_allowance)
                   FOR UPDATE SKIP LOCKED
            LOOP
                v_token := idempotency.send_hand_out(v_row, v_lease);
                IF v_token IS NOT NULL THEN
                    v_retries := v_retries + 1;
                    RETURN QUERY SELECT v_row.scope, v_row.operation, v_row.target, v_row.key, v_row.request,
                                        v_row.attempts + 1, v_token, now() + v_lease, v_row.give_up_at;
                    v_left := v_left - 1;
                END IF;
            END LOOP;
        END IF;
        IF v_retries > 0 THEN
            PERFORM idempotency.send_count(v_target, 0, v_retries, 0, 0);
        END IF;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION idempotency.send_finish(p_scope text, p_operation text, p_token uuid, p_http_status int,
                                        p_response_body text, p_response_headers jsonb,
                                        p_retry_after interval, p_error text)
RETURNS TABLE (o_state text, o_attempts int, o_next_attempt_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_row idempotency.outbound;
    v_base interval;
    v_cap interval;
    v_delay interval;
    v_retryable boolean;
BEGIN
    PERFORM idempotency.send_check_text('scope', p_scope);
    PERFORM idempotency.send_check_text('operation', p_operation);
    IF p_token IS NULL THEN
        RAISE EXCEPTION 'argument "token" must not be null' USING ERRCODE = '22004';
    END IF;
    IF p_http_status IS NOT NULL AND (p_http_status < 100 OR p_http_status > 599) THEN
        RAISE EXCEPTION 'invalid argument "http_status": must be between 100 and 599 (got %)', p_http_status
            USING ERRCODE = '22023';
    END IF;
    IF p_response_headers IS NOT NULL AND jsonb_typeof(p_response_headers) <> 'object' THEN
        RAISE EXCEPTION 'invalid argument "response_headers": must be a JSON object (got %)', jsonb_typeof(p_response_headers)
            USING ERRCODE = '22023';
    END IF;
    IF p_retry_after IS NOT NULL AND (p_retry_after < interval '0' OR p_retry_after > interval '10000 years') THEN
        RAISE EXCEPTION 'invalid argument "retry_after": % (it must be an interval of 0 to 10000 years)', p_retry_after
            USING ERRCODE = '22023';
    END IF;
    -- Read (and so checked) before the row: a bad setting is 22023 whatever the token holds.
    v_base := idempotency.send_interval_setting('idempotency.send_backoff_base', interval '1 second');
    v_cap := idempotency.send_interval_setting('idempotency.send_backoff_cap', interval '10 minutes');

    SELECT o.* INTO v_row FROM idempotency.outbound AS o
     WHERE o.scope = p_scope AND o.operation = p_operation
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no outbound record for operation "%" in scope "%"',
              p_operation, p_scope
            USING ERRCODE = 'IK001';
    END IF;
    IF v_row.state = 'done' AND v_row.token = p_token THEN
        RAISE EXCEPTION 'operation "%" in scope "%" is already done with this token',
              p_operation, p_scope
            USING ERRCODE = 'IK003';
    END IF;
    IF v_row.state <> 'sending' OR v_row.token IS DISTINCT FROM p_token THEN
        RAISE EXCEPTION 'the token no longer holds operation "%" in scope "%"',
              p_operation, p_scope
            USING ERRCODE = 'IK002',
                  HINT = 'Its lease ended and another sender took it, or its result was recorded.';
    END IF;

    v_retryable := p_http_status IS NULL OR p_http_status IN (408, 409, 425, 429, 500, 502, 503, 504);
    IF NOT v_retryable THEN
        UPDATE idempotency.outbound AS o
           SET state = 'done', locked_until = NULL, last_status = p_http_status, last_error = NULL,
               response_status = p_http_status, response_body = p_response_body,
               response_headers = p_response_headers, finished_at = now(),
               expires_at = now() + idempotency.send_interval_setting('idempotency.default_ttl', interval '24 hours')
         WHERE o.scope = v_row.scope AND o.operation = v_row.operation
        RETURNING o.state, o.attempts, o.next_attempt_at INTO o_state, o_attempts, o_next_attempt_at;
        -- A final answer earns retries (the retry budget).
        PERFORM idempotency.send_count(v_row.target, 0, 0, 1, 0);
        RETURN NEXT;
        RETURN;
    END IF;

    -- Exponential backoff with full jitter, never sooner than the receiver's Retry-After.
    v_delay := greatest(coalesce(p_retry_after, interval '0'),
                        random() * least(v_cap, v_base * power(2, least(v_row.attempts - 1, 60))));
    IF now() + v_delay >= v_row.give_up_at THEN
        UPDATE idempotency.outbound AS o
           SET state = 'gave_up', token = NULL, locked_until = NULL, last_status = p_http_status,
               last_error = p_error, finished_at = now(),
               expires_at = now() + idempotency.send_interval_setting('idempotency.default_ttl', interval '24 hours')
         WHERE o.scope = v_row.scope AND o.operation = v_row.operation
        RETURNING o.state, o.attempts, o.next_attempt_at INTO o_state, o_attempts, o_next_attempt_at;
    ELSE
        UPDATE idempotency.outbound AS o
           SET state = 'pending', token = NULL, locked_until = NULL, last_status = p_http_status,
               last_error = p_error, next_attempt_at = now() + v_delay
         WHERE o.scope = v_row.scope AND o.operation = v_row.operation
        RETURNING o.state, o.attempts, o.next_attempt_at INTO o_state, o_attempts, o_next_attempt_at;
    END IF;
    -- A retryable answer stops what final answers had earned (the retry budget).
    PERFORM idempotency.send_count(v_row.target, 0, 0, 0, 1);
    RETURN NEXT;
END
$$;

-- idem_sweep's part (both editions call it last, with what is left of max_rows): deletes
-- done and gave_up rows past expires_at, oldest first, skipping rows another session holds,
-- and the budget's rows older than two windows (at least two minutes), skipping rows a
-- session holds. Returns the outbound rows deleted.
CREATE OR REPLACE FUNCTION idempotency.send_sweep(max_rows bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    deleted bigint := 0;
BEGIN
    -- A role granted only the tables of 0.4 (keys, messages) keeps sweeping those: the
    -- outbound rows wait for a role that may delete them.
    IF NOT (has_table_privilege('idempotency.outbound', 'SELECT') AND has_table_privilege('idempotency.outbound', 'UPDATE')
            AND has_table_privilege('idempotency.outbound', 'DELETE')
            AND has_table_privilege('idempotency.outbound_budget', 'DELETE')) THEN
        RETURN 0;
    END IF;
    IF max_rows > 0 THEN
        DELETE FROM idempotency.outbound AS o
         USING (SELECT p.scope, p.operation FROM idempotency.outbound AS p
                 WHERE p.expires_at <= now() AND p.state IN ('done', 'gave_up')
                 ORDER BY p.expires_at LIMIT max_rows FOR UPDATE SKIP LOCKED) AS picked
         WHERE o.scope = picked.scope AND o.operation = picked.operation;
        GET DIAGNOSTICS deleted = ROW_COUNT;
    END IF;
    DELETE FROM idempotency.outbound_budget AS b
     WHERE (b.target, b.bucket, b.backend_pid) IN (
           SELECT o.target, o.bucket, o.backend_pid FROM idempotency.outbound_budget AS o
            WHERE o.bucket < now() - 2 * greatest(idempotency.send_retry_window(), interval '1 minute')
              FOR UPDATE SKIP LOCKED);
    RETURN deleted;
END
$$;

-- Issue 34: idem_send_next and idem_send_result run in the native library (src/api/send_next.rs,
-- send_result.rs): the same arguments, result columns, answers and errors. The library counts
-- the retry budget's first attempts and final answers in memory and writes them once a bucket
-- (docs/sending.md, "The retry budget"). The PL/pgSQL they ran on (send_take, send_hand_out,
-- send_finish, send_count) stays in the portable edition only. CREATE OR REPLACE keeps the two
-- functions' grants.
CREATE OR REPLACE FUNCTION idempotency."idem_send_next"(
	"target" TEXT DEFAULT NULL,
	"max_rows" INT DEFAULT 1,
	"lease" interval DEFAULT NULL,
	"scope" TEXT DEFAULT NULL,
	"operation" TEXT DEFAULT NULL
) RETURNS TABLE (
	"scope" TEXT,
	"operation" TEXT,
	"target" TEXT,
	"key" TEXT,
	"request" jsonb,
	"attempt" INT,
	"token" uuid,
	"locked_until" timestamp with time zone,
	"give_up_at" timestamp with time zone
)
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'idem_send_next_wrapper';

CREATE OR REPLACE FUNCTION idempotency."idem_send_result"(
	"scope" TEXT,
	"operation" TEXT,
	"token" uuid,
	"http_status" INT DEFAULT NULL,
	"response_body" TEXT DEFAULT NULL,
	"response_headers" jsonb DEFAULT NULL,
	"retry_after" interval DEFAULT NULL,
	"error" TEXT DEFAULT NULL
) RETURNS TABLE (
	"state" TEXT,
	"attempts" INT,
	"next_attempt_at" timestamp with time zone
)
VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'idem_send_result_wrapper';

DROP FUNCTION idempotency.send_take(text, integer, interval, text, text);
DROP FUNCTION idempotency.send_finish(text, text, uuid, integer, text, jsonb, interval, text);
DROP FUNCTION idempotency.send_hand_out(idempotency.outbound, interval);
DROP FUNCTION idempotency.send_count(text, bigint, bigint, bigint, bigint);

-- >>> stats view
CREATE OR REPLACE VIEW idempotency.stats AS
SELECT
    (SELECT count(*) FROM idempotency.keys
      WHERE (CASE WHEN status = 'completed' THEN expires_at ELSE '-infinity'::timestamptz END) = '-infinity'
        AND status = 'in_progress' AND locked_until IS NOT NULL
        AND expires_at > now())                                                AS in_progress,
    (SELECT count(*) FROM idempotency.keys
      WHERE (CASE WHEN status = 'completed' THEN expires_at ELSE '-infinity'::timestamptz END) > now()
        AND status = 'completed' AND expires_at > now())                      AS completed,
    (SELECT count(*) FROM idempotency.keys
      WHERE (CASE WHEN status = 'completed' THEN expires_at ELSE '-infinity'::timestamptz END) = '-infinity'
        AND status = 'in_progress' AND locked_until <= now()
        AND expires_at > now())                                                AS stale,
    (SELECT count(*) FROM idempotency.keys
      WHERE ((CASE WHEN status = 'completed' THEN expires_at ELSE '-infinity'::timestamptz END) = '-infinity'
             OR (CASE WHEN status = 'completed' THEN expires_at ELSE '-infinity'::timestamptz END)
                < (SELECT COALESCE(min(lower_bound), 'infinity') FROM idempotency.partition_bounds('idempotency.keys')
                    WHERE NOT is_default AND lower_bound IS NOT NULL)
             OR (CASE WHEN status = 'completed' THEN expires_at ELSE '-infinity'::timestamptz END)
                >= (SELECT COALESCE(max(upper_bound), 'infinity') FROM idempotency.partition_bounds('idempotency.keys')
                    WHERE NOT is_default AND lower_bound IS NOT NULL))
        AND expires_at <= now())                                               AS expired,
    (SELECT now() - min(created_at) FROM idempotency.keys
      WHERE (CASE WHEN status = 'completed' THEN expires_at ELSE '-infinity'::timestamptz END) = '-infinity'
        AND status = 'in_progress' AND locked_until IS NOT NULL
        AND expires_at > now())                                                AS oldest_in_progress_age,
    (SELECT count(*) FROM idempotency.messages WHERE expires_at > now())       AS messages,
    (SELECT count(*) FROM idempotency.messages
      WHERE (expires_at < (SELECT COALESCE(min(lower_bound), 'infinity') FROM idempotency.partition_bounds('idempotency.messages')
                            WHERE NOT is_default AND lower_bound IS NOT NULL)
             OR expires_at >= (SELECT COALESCE(max(upper_bound), 'infinity') FROM idempotency.partition_bounds('idempotency.messages')
                               WHERE NOT is_default AND lower_bound IS NOT NULL))
        AND expires_at <= now())                                               AS expired_messages,
    (SELECT count(*) FROM idempotency.keys
      WHERE (CASE WHEN status = 'completed' THEN expires_at ELSE '-infinity'::timestamptz END) <= now()
        AND (CASE WHEN status = 'completed' THEN expires_at ELSE '-infinity'::timestamptz END) > now() - COALESCE(NULLIF(
              pg_catalog.current_setting('idempotency.tombstone_ttl', true), ''), '0')::interval
        AND status = 'completed' AND expires_at <= now()
        AND expires_at > now() - COALESCE(NULLIF(
              pg_catalog.current_setting('idempotency.tombstone_ttl', true), ''), '0')::interval) AS tombstones,
    (SELECT count(*) FROM idempotency.outbound WHERE state = 'pending')         AS outbound_pending,
    (SELECT count(*) FROM idempotency.outbound WHERE state = 'sending')         AS outbound_sending,
    (SELECT count(*) FROM idempotency.outbound WHERE state = 'done')            AS outbound_done,
    (SELECT count(*) FROM idempotency.outbound WHERE state = 'gave_up')         AS outbound_gave_up,
    (SELECT count(*) FROM idempotency.outbound
      WHERE state IN ('pending', 'sending') AND next_attempt_at <= now())      AS outbound_due,
    (SELECT now() - min(next_attempt_at) FROM idempotency.outbound
      WHERE state IN ('pending', 'sending') AND next_attempt_at <= now())      AS outbound_oldest_due_age,
    (SELECT max(finished_at) FROM idempotency.outbound WHERE state = 'gave_up') AS outbound_last_gave_up_at;

COMMENT ON VIEW idempotency.stats IS
    'One row for monitoring: live records by status, stale claims (lease ended), expired rows '
    'awaiting idem_sweep''s DELETE (claims, and records past the time partitions), the age of the oldest in_progress claim, and tombstones (expired '
    'completed records inside idempotency.tombstone_ttl; counted in expired too), the '
    'sending side''s idempotency.outbound rows by state, the sends due now (not yet handed to a '
    'sender), how long the oldest of them has been due, and when a send last gave up.';
-- <<< stats view
