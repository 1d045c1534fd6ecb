-- The records' time partitions (docs/operations.md#partitions): made ahead and dropped behind
-- by idem_sweep, which both editions call. Shared by both editions: the native build reads
-- this file (extension_sql_file! in src/lib.rs) and the portable release names each
-- statement (sql/portable/release.sql.in). Plain SQL and PL/pgSQL only.
--
-- A table's partitions: its own (keys_claims and keys_far, messages_far: made by the install
-- script) and one per period, each FOR VALUES FROM (lower) TO (upper) on the table's
-- partition key: completed records of keys by expires_at, messages by expires_at. The
-- periods are contiguous; each new one starts where the last ended and ends on the next
-- multiple of idempotency.partition_period counted from the Unix epoch. They are made to
-- cover now() + idempotency.default_ttl + two periods; a record past them goes to the far
-- partition, whose rows of a new period move into it when it is made. A period is dropped
-- once every record in it has expired (and, for keys, its tombstones ended).

-- idempotency.partition_period in seconds, checked: 0 (no periods: every completed record
-- goes to the far partition and is swept by DELETE, as before 0.6.0) or a fixed length (no
-- months) of 1 second to 366 days. The native edition checks the value when it is SET; the
-- portable edition reads a placeholder, checked here.
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
