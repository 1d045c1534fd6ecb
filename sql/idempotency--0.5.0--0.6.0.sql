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
    (SELECT count(*) FROM idempotency.outbound WHERE state = 'gave_up')         AS outbound_gave_up;

COMMENT ON VIEW idempotency.stats IS
    'One row for monitoring: live records by status, stale claims (lease ended), expired rows '
    'awaiting idem_sweep''s DELETE (claims, and records past the time partitions), the age of the oldest in_progress claim, and tombstones (expired '
    'completed records inside idempotency.tombstone_ttl; counted in expired too), and the '
    'sending side''s idempotency.outbound rows by state.';
-- <<< stats view
