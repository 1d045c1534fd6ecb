-- idempotency 0.6.0, PORTABLE EDITION: the SQL contract of the native extension
-- (docs/portable.md), in SQL and PL/pgSQL only, for servers that load no custom library
-- (RDS, Aurora, Cloud SQL, Azure, Supabase, Neon ...). PostgreSQL 14 or later.
--
-- Install: as the database owner (no superuser needed), once per database:
--     psql -v ON_ERROR_STOP=1 -d DB -f sql/portable/idempotency-portable--0.6.0.sql
-- or as a SQL-only extension named idempotency (pg_tle: sql/portable/pgtle.sql; a control
-- file without module_pathname: tests/portable/run.sh). Upgrade an install of release N by
-- running sql/portable/idempotency-portable--N--M.sql. Moving to the native extension, and
-- back: docs/portable.md.
--
-- Released files are frozen: a change is a new release with an upgrade file.
--
-- The same schema, table, type, view and functions as the native 0.6.0, with the same
-- argument names, defaults, volatility, outcomes and SQLSTATEs. Settings are read with
-- current_setting(name, true): unset means the documented default, and a bad value is
-- refused (22023) where it is used rather than when it is SET. Every function pins
-- search_path, so nothing on the caller's path can stand in for a name it uses.
-- The helpers named portable_* are this edition's own.

-- Created here unless it exists: CREATE EXTENSION (a control file with schema = idempotency)
-- creates it first, and an extension script may not name a schema it does not own.
DO $$
BEGIN
    IF pg_catalog.to_regnamespace('idempotency') IS NULL THEN
        CREATE SCHEMA idempotency;
    END IF;
END
$$;

-- The record, the message log and the claim result type (as sql/bootstrap.sql): both tables
-- partitioned by time (0.6.0), with the partitions the install makes.

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

-- Claims in flight: small, changed in place (checkpoints, takeovers), emptied as claims
-- complete. Vacuumed after 1 % of it changed rather than PostgreSQL's default 20 %.
CREATE TABLE idempotency.keys_claims PARTITION OF idempotency.keys (
    CONSTRAINT keys_claims_pkey PRIMARY KEY (scope, key)
) FOR VALUES FROM (MINVALUE) TO ('1970-01-01 00:00:00+00');

ALTER TABLE idempotency.keys_claims SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01
);

-- idem_reclaim_stale and idempotency.stats: claims by end of lease. Partial: the predicate
-- names locked_until too, so that it is implied only by queries on the lease ("locked_until
-- <= now"), and the fenced UPDATEs of idem_checkpoint ("status = 'in_progress'" and a key)
-- use the primary key.
CREATE INDEX keys_in_progress_idx ON idempotency.keys_claims (locked_until)
    WHERE status = 'in_progress' AND locked_until IS NOT NULL;

-- idem_sweep: claims that expired without being completed, oldest first.
CREATE INDEX keys_claims_expires_at_idx ON idempotency.keys_claims (expires_at);

-- Completed records whose expiry lies past the partitions made so far (a ttl longer than
-- idempotency.default_ttl plus two periods, or no idem_sweep yet): swept by DELETE as every
-- record was before 0.6.0, and moved into each partition idem_sweep makes.
CREATE TABLE idempotency.keys_far PARTITION OF idempotency.keys (
    CONSTRAINT keys_far_pkey PRIMARY KEY (scope, key)
) DEFAULT;

ALTER TABLE idempotency.keys_far SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01
);

-- idem_sweep: expired records, oldest first; and the rows a new partition takes over.
CREATE INDEX keys_far_expires_at_idx ON idempotency.keys_far (expires_at);

-- The sweep with tombstones on (idempotency.tombstone_ttl): records that still hold a
-- response, by expiry, so that each batch finds the expired ones to turn into tombstones
-- without stepping over the tombstones it already made. (A partition of its own keeps the
-- responses until it is dropped; its claims answer expired without them.)
CREATE INDEX keys_responses_idx ON idempotency.keys_far (expires_at)
    WHERE response_body IS NOT NULL OR response_headers IS NOT NULL;

-- Message ids seen by idem_seen, one row per (scope, message_id), partitioned by expiry as
-- the completed records are.
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

-- Installed as an extension (pg_tle, or a control file), pg_dump keeps the rows of the
-- extension's own partitions (the periods idem_sweep makes are tables of their own to
-- pg_dump, which keeps them and their rows anyway); run with psql -f there is no extension
-- and pg_dump keeps everything anyway.
DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('idempotency.keys_claims', '');
    PERFORM pg_catalog.pg_extension_config_dump('idempotency.keys_far', '');
    PERFORM pg_catalog.pg_extension_config_dump('idempotency.messages_far', '');
EXCEPTION WHEN feature_not_supported THEN
    NULL; -- not inside CREATE EXTENSION
END
$$;

CREATE TYPE idempotency.claim_result AS (
    outcome          text,
    token            uuid,
    http_status      int,
    response_status  int,
    response_headers jsonb,
    response_body    jsonb,
    recovery_point   text,
    recovery_data    jsonb,
    attempts         int,
    expires_at       timestamptz,
    locked_until     timestamptz
);

COMMENT ON TYPE idempotency.claim_result IS
    'What idem_claim answers: outcome is claimed, reclaimed, replay, in_progress, mismatch or expired (tombstones on). '
    'locked_until (added after the contract''s columns) is the end of the owner''s lease.';

-- Which release of the portable edition is installed (an install made with psql -f has no
-- extversion): upgrade files check it before they change anything.
CREATE FUNCTION idempotency.portable_version() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT '0.6.0' $$;

-- ---------------------------------------------------------------------------------------
-- The records' time partitions, made ahead and dropped behind by idem_sweep (as
-- sql/partitions.sql, which both editions read).

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

-- ---------------------------------------------------------------------------------------
-- Helpers. None raises: the idem_* functions raise their errors themselves, so that an
-- error carries no extra CONTEXT line (psql prints PL/pgSQL's context only for callers).

-- What is wrong with a scope, key or message id (NULL: nothing): 1 to 255 characters, no
-- control characters (Unicode Cc: U+0000-U+001F, U+007F-U+009F).
CREATE FUNCTION idempotency.portable_key_problem(val text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bad text;
BEGIN
    IF val = '' THEN
        RETURN 'must not be empty';
    END IF;
    bad := substring(val FROM '[\x01-\x1f\x7f-\x9f]');
    IF bad IS NOT NULL THEN
        RETURN format('must not contain control characters (found U+%s)', upper(lpad(to_hex(ascii(bad)), 4, '0')));
    END IF;
    IF length(val) > 255 THEN
        RETURN format('must be at most 255 characters (got %s)', length(val));
    END IF;
    RETURN NULL;
END
$$;

-- The error for a scope, key or message id argument, as "SQLSTATE message" (NULL: none):
-- 22004 for NULL, 22023 naming what is wrong. The idem_* functions raise it themselves.
CREATE FUNCTION idempotency.portable_key_error(arg text, val text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN val IS NULL THEN '22004 argument "' || arg || '" must not be null'
                ELSE '22023 invalid argument "' || arg || '": ' || idempotency.portable_key_problem(val) END
$$;

-- What is wrong with a ttl or lease (NULL: nothing). Intervals compare as PostgreSQL
-- compares them (a month is 30 days, a day 24 hours), which is the native rule.
CREATE FUNCTION idempotency.portable_interval_problem(val interval) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN val <= interval '0' THEN 'must be a positive interval'
                WHEN val > interval '10000 years' THEN 'must be at most 10000 years' END
$$;

-- The interval setting `name` (idempotency.default_ttl or idempotency.default_lease), or
-- `fallback` when it is not set; NULL when it is set to something that is not a positive
-- interval of at most 10000 years.
CREATE FUNCTION idempotency.portable_interval_setting(name text, fallback interval) RETURNS interval
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    raw text := current_setting(name, true);
    val interval;
BEGIN
    IF raw IS NULL OR raw = '' THEN
        RETURN fallback;
    END IF;
    BEGIN
        val := raw::interval;
    EXCEPTION WHEN data_exception OR syntax_error THEN
        RETURN NULL;
    END;
    IF idempotency.portable_interval_problem(val) IS NOT NULL THEN
        RETURN NULL;
    END IF;
    RETURN val;
END
$$;

-- A ttl or lease argument: `val` when given (it must be positive, 22023 naming `arg`), else
-- the interval setting `setting`, else `fallback`. problem: NULL, or "SQLSTATE message".
CREATE FUNCTION idempotency.portable_interval_arg(arg text, val interval, setting text, fallback interval,
                                                  OUT value interval, OUT problem text)
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF val IS NOT NULL THEN
        value := val;
        problem := '22023 invalid argument "' || arg || '": ' || idempotency.portable_interval_problem(val);
    ELSE
        value := idempotency.portable_interval_setting(setting, fallback);
        IF value IS NULL THEN
            problem := format('22023 invalid value for setting "%s": "%s" (it must be a positive interval of at most 10000 years)',
                              setting, current_setting(setting, true));
        END IF;
    END IF;
END
$$;

-- idempotency.tombstone_ttl (0.4.0): value is NULL when tombstones are off (not set, or
-- zero), else the interval; problem ("SQLSTATE message") when it is set to something that
-- is not zero or a positive interval of at most 10000 years.
CREATE FUNCTION idempotency.portable_tombstone_ttl(OUT value interval, OUT problem text)
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    raw text := current_setting('idempotency.tombstone_ttl', true);
BEGIN
    IF raw IS NULL OR raw = '' THEN
        RETURN;
    END IF;
    BEGIN
        value := raw::interval;
    EXCEPTION WHEN data_exception OR syntax_error THEN
        value := interval '-1 second';
    END;
    IF value = interval '0' THEN
        value := NULL;
    ELSIF idempotency.portable_interval_problem(value) IS NOT NULL THEN
        value := NULL;
        problem := format('22023 invalid value for setting "idempotency.tombstone_ttl": "%s" (it must be zero or a positive interval of at most 10000 years)', raw);
    END IF;
END
$$;

-- idem_claim's wait in seconds, counted as PostgreSQL compares intervals (a month is 30
-- days, a day 24 hours; the native rule). Only called with 0 < wait <= 1 hour.
CREATE FUNCTION idempotency.portable_seconds(val interval) RETURNS float8
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT ((extract(year FROM val) * 12 + extract(month FROM val)) * 30 * 86400
            + extract(day FROM val) * 86400 + extract(hour FROM val) * 3600
            + extract(minute FROM val) * 60 + extract(second FROM val))::float8
$$;

-- idempotency.max_response_size in bytes: an integer in kB, or with a unit (B, kB, MB, GB,
-- TB) as PostgreSQL's memory settings take it; 1kB to 1GB, default 1MB. NULL: a bad value.
CREATE FUNCTION idempotency.portable_max_response_bytes() RETURNS bigint
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    raw text := btrim(coalesce(current_setting('idempotency.max_response_size', true), ''));
    parts text[];
    bytes numeric;
BEGIN
    IF raw = '' THEN
        RETURN 1048576;
    END IF;
    parts := regexp_match(raw, '^([0-9]+)\s*(B|kB|MB|GB|TB)?$');
    IF parts IS NULL OR length(parts[1]) > 15 THEN
        RETURN NULL;
    END IF;
    bytes := parts[1]::numeric * CASE coalesce(parts[2], 'kB')
        WHEN 'B' THEN 1 WHEN 'kB' THEN 1024 WHEN 'MB' THEN 1048576
        WHEN 'GB' THEN 1073741824 ELSE 1099511627776 END;
    IF bytes < 1024 OR bytes > 1073741824 THEN
        RETURN NULL;
    END IF;
    RETURN trunc(bytes / 1024)::bigint * 1024;
END
$$;

-- A jsonb value's size as stored uncompressed (varlena header included), as the native
-- edition measures it. A value read from a table may be compressed: then a fresh copy.
CREATE FUNCTION idempotency.portable_raw_size(val jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN val IS NULL THEN 0
                WHEN pg_column_compression(val) IS NULL THEN pg_column_size(val)
                ELSE pg_column_size(jsonb_path_query_first(val, '$')) END
$$;

-- A scope or key as the native edition's messages quote it: in double quotes, with
-- backslashes and double quotes escaped.
CREATE FUNCTION idempotency.portable_quote(val text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT '"' || replace(replace(val, '\', '\\'), '"', '\"') || '"'
$$;

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

-- ---------------------------------------------------------------------------------------
-- The fingerprint (RFC 8785).

-- A decimal number digits x 10^(n - length(digits)) (digits without leading or trailing
-- zeros) as ECMAScript's Number.prototype.toString writes it.
CREATE FUNCTION idempotency.portable_ecma_decimal(negative boolean, digits text, n int) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    k int := length(digits);
    body text;
BEGIN
    IF k <= n AND n <= 21 THEN
        body := digits || repeat('0', n - k);
    ELSIF 0 < n AND n <= 21 THEN
        body := substr(digits, 1, n) || '.' || substr(digits, n + 1);
    ELSIF -6 < n AND n <= 0 THEN
        body := '0.' || repeat('0', -n) || digits;
    ELSE
        body := substr(digits, 1, 1)
             || CASE WHEN k > 1 THEN '.' || substr(digits, 2) ELSE '' END
             || 'e' || CASE WHEN n > 0 THEN '+' ELSE '-' END || abs(n - 1)::text;
    END IF;
    RETURN CASE WHEN negative THEN '-' || body ELSE body END;
END
$$;

-- Whether the decimal number `num` (text) reads back as the double `x` (numbers that
-- overflow or round to zero cannot be cast, and are not x).
CREATE FUNCTION idempotency.portable_reads_back(num text, x float8) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN num::numeric >= power(2::numeric, 1024) - power(2::numeric, 970)
                  OR num::numeric * power(2::numeric, 1075) <= 1 THEN false
                ELSE num::float8 = x END
$$;

-- A JSON number as RFC 8785 writes it: the double nearest to it, printed as ECMAScript
-- prints numbers (the shortest digits that round-trip). NULL when it is beyond the double
-- range. Numbers of at most 15 significant digits are their own shortest form. Longer ones
-- go through float8, whose output (extra_float_digits > 0) is the shortest form strictly
-- inside the double's rounding interval; a shorter decimal that lies exactly on the
-- interval's edge also reads back as the same double (ties round to the even double), and
-- ECMAScript takes it, so those are tried too.
CREATE FUNCTION idempotency.portable_json_number(num numeric) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
SET extra_float_digits = 1
AS $$
DECLARE
    txt text := num::text;
    negative boolean := num < 0;
    mantissa text;
    int_part text;
    frac_part text;
    exponent int := 0;
    digits text;
    n int;
    x float8;
    shorter text;
    lower_ok boolean;
    upper text;
    upper_ok boolean;
BEGIN
    IF negative THEN
        txt := substr(txt, 2);
    END IF;
    IF txt ~ '^[1-9][0-9]{0,14}$' THEN
        RETURN num::text;
    END IF;
    FOR pass IN 1..2 LOOP
        mantissa := split_part(txt, 'e', 1);
        IF strpos(txt, 'e') > 0 THEN
            exponent := split_part(txt, 'e', 2)::int;
        END IF;
        int_part := ltrim(split_part(mantissa, '.', 1), '0');
        frac_part := split_part(mantissa, '.', 2);
        IF int_part = '' THEN
            digits := ltrim(frac_part, '0');
            n := length(digits) - length(frac_part);
        ELSE
            digits := int_part || frac_part;
            n := length(int_part);
        END IF;
        digits := rtrim(digits, '0');
        n := n + exponent;
        IF digits = '' THEN
            RETURN '0';
        END IF;
        EXIT WHEN pass = 2;
        IF length(digits) <= 15 AND n BETWEEN -290 AND 290 THEN
            RETURN idempotency.portable_ecma_decimal(negative, digits, n);
        END IF;
        -- Beyond the double range: what rounds to infinity is refused, what rounds to
        -- zero is 0 (half the smallest subnormal, 2^-1075, rounds to even: to zero).
        IF abs(num) >= power(2::numeric, 1024) - power(2::numeric, 970) THEN
            RETURN NULL;
        END IF;
        IF abs(num) * power(2::numeric, 1075) <= 1 THEN
            RETURN '0';
        END IF;
        x := abs(num)::float8;
        txt := x::text;
    END LOOP;
    -- digits x 10^(n - length(digits)) reads back as x; try one digit fewer, rounded down
    -- and up, while one of them still reads back as x (both: the even one).
    WHILE length(digits) > 1 LOOP
        shorter := substr(digits, 1, length(digits) - 1);
        lower_ok := idempotency.portable_reads_back(shorter || 'e' || (n - length(shorter)), x);
        upper := (shorter::numeric + 1)::text;
        upper_ok := idempotency.portable_reads_back(upper || 'e' || (n - length(shorter)), x);
        IF lower_ok AND upper_ok THEN
            upper_ok := right(upper, 1)::int % 2 = 0;
            lower_ok := NOT upper_ok;
        END IF;
        IF lower_ok THEN
            digits := rtrim(shorter, '0');
        ELSIF upper_ok THEN
            IF length(upper) > length(shorter) THEN
                n := n + 1; -- 99..9 + 1 = 100..0
            END IF;
            digits := rtrim(upper, '0');
        ELSE
            EXIT;
        END IF;
    END LOOP;
    RETURN idempotency.portable_ecma_decimal(negative, digits, n);
END
$$;

-- An object key as RFC 8785 orders keys (by UTF-16 code units) when compared in the C
-- collation (by code points). The orders differ only for characters at or above U+E000:
-- UTF-16 puts U+10000-U+10FFFF (surrogate pairs) before U+E000-U+FFFF. So each character
-- U+E000-U+FFFF gets U+10FFFF in front of it (after every supplementary character), and
-- U+10FFFF itself gets U+D7FF after it (before any of those).
CREATE FUNCTION idempotency.portable_key_order(val text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT regexp_replace(regexp_replace(val, '\U0010FFFF', E'\U0010FFFF\uD7FF', 'g'),
                          '([\uE000-\uFFFF])', E'\U0010FFFF\\1', 'g')
$$;

-- The fingerprint: 'sha256:' || hex of the payload's RFC 8785 canonical text, without the
-- top-level keys in `ignore`. One query: every value of the document becomes a row with its
-- path of sort keys (object keys in RFC 8785 order, array positions), written in the order
-- of those paths; each row brings its own comma, key, opening bracket or scalar, and the
-- closing brackets of the containers that end after it.
CREATE FUNCTION idempotency.idem_fingerprint(payload jsonb, ignore text[] DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    root jsonb := payload;
    canonical text;
    problem jsonb;
    num text;
BEGIN
    IF payload IS NULL THEN
        RETURN NULL;
    END IF;
    IF ignore IS NOT NULL AND jsonb_typeof(root) = 'object' THEN
        root := root - ignore;
    END IF;
    WITH RECURSIVE node(path, depth, closers, parent_kind, key, val, kind) AS (
        SELECT ARRAY[]::text[], 1, '', NULL::text, NULL::text, root, jsonb_typeof(root)
        UNION ALL
        SELECT n.path || c.sort_key, n.depth + 1,
               n.closers || CASE WHEN n.kind = 'object' THEN '}' ELSE ']' END,
               n.kind, c.key, c.val, jsonb_typeof(c.val)
          FROM node AS n
         CROSS JOIN LATERAL (
                SELECT e.key, e.value AS val,
                       CASE WHEN e.key !~ '[\uE000-\U0010FFFF]' THEN e.key
                            ELSE idempotency.portable_key_order(e.key) END AS sort_key
                  FROM jsonb_each(CASE WHEN n.kind = 'object' THEN n.val ELSE '{}' END) AS e
                UNION ALL
                SELECT NULL, a.value, lpad(a.position::text, 10, '0')
                  FROM jsonb_array_elements(CASE WHEN n.kind = 'array' THEN n.val ELSE '[]' END)
                       WITH ORDINALITY AS a(value, position)
               ) AS c
         WHERE n.kind IN ('object', 'array') AND n.depth <= 1000
    ),
    written AS (
        SELECT n.path, n.depth, n.closers, n.parent_kind, n.key, n.val, n.kind,
               n.kind IN ('object', 'array') AND n.val NOT IN ('{}', '[]') AS opens,
               CASE WHEN n.kind IN ('object', 'array') THEN NULL
                    WHEN n.kind <> 'number' THEN n.val::text
                    WHEN n.val::text ~ '^-?(0|[1-9][0-9]*)(\.[0-9]*[1-9])?$' AND n.val::text !~ '^-?0\.0{6}'
                         AND length(ltrim(translate(n.val::text, '-.', ''), '0')) <= 15 THEN n.val::text
                    ELSE idempotency.portable_json_number(n.val::numeric) END AS scalar,
               lag(n.depth) OVER w AS previous_depth,
               lead(n.depth, 1, 1) OVER w AS next_depth
          FROM node AS n
        WINDOW w AS (ORDER BY n.path COLLATE "C")
    )
    SELECT string_agg(CASE WHEN w.previous_depth >= w.depth THEN ',' ELSE '' END
                      || CASE WHEN w.parent_kind = 'object' THEN to_jsonb(w.key)::text || ':' ELSE '' END
                      || CASE WHEN w.opens THEN CASE WHEN w.kind = 'object' THEN '{' ELSE '[' END
                              ELSE coalesce(w.scalar, w.val::text) END
                      || CASE WHEN w.opens THEN ''
                              ELSE reverse(substr(w.closers, w.next_depth, w.depth - w.next_depth)) END,
                      '' ORDER BY w.path COLLATE "C"),
           (array_agg(CASE WHEN w.depth > 1000 AND w.kind IN ('object', 'array') THEN '"deep"'::jsonb ELSE w.val END
                      ORDER BY w.path COLLATE "C")
                FILTER (WHERE (w.depth > 1000 AND w.kind IN ('object', 'array'))
                           OR (w.kind = 'number' AND w.scalar IS NULL)))[1]
      INTO canonical, problem
      FROM written AS w;
    IF problem = '"deep"' THEN
        RAISE EXCEPTION 'invalid argument "payload": json nested deeper than 1000 levels' USING ERRCODE = '22023';
    ELSIF problem IS NOT NULL THEN
        num := problem::numeric::text;
        IF strpos(num, '.') > 0 THEN
            num := rtrim(rtrim(num, '0'), '.');
        END IF;
        RAISE EXCEPTION 'invalid argument "payload": number out of range for RFC 8785: %',
            CASE WHEN length(num) > 40 THEN substr(num, 1, 40) || '...' ELSE num END
            USING ERRCODE = '22023';
    END IF;
    RETURN 'sha256:' || encode(sha256(convert_to(canonical, 'UTF8')), 'hex');
END
$$;

CREATE FUNCTION idempotency.idem_fingerprint(payload bytea)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'sha256:' || encode(sha256(payload), 'hex')
$$;

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

-- ---------------------------------------------------------------------------------------
-- idem_complete, idem_checkpoint and idem_release: one statement fenced on the token;
-- when it touches no row, a read says why. Claims in flight live in their own partition
-- (keys_claims, sql/bootstrap.sql): each statement names the partition key, so that the
-- planner reads only that one.

-- Why a statement fenced on `token` touched no claim of (scope, key), from the record as a
-- read finds it now (after the write: a fresh snapshot), the 0.5.0 table included while it is
-- there: IK001 (no live record), IK003 (completed by this token) or IK002 (another owner).
CREATE FUNCTION idempotency.portable_not_owned(scope text, key text, token uuid, now_ timestamptz) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    rec record;
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_class AS c WHERE c.relnamespace = 'idempotency'::pg_catalog.regnamespace AND c.relname = 'keys_legacy') THEN
        SELECT r.token, r.status, r.expires_at INTO rec
          FROM (SELECT k.token, k.status, k.expires_at FROM idempotency.keys AS k
                 WHERE k.scope = portable_not_owned.scope AND k.key = portable_not_owned.key
                UNION ALL
                SELECT l.token, l.status, l.expires_at FROM idempotency.keys_legacy AS l
                 WHERE l.scope = portable_not_owned.scope AND l.key = portable_not_owned.key) AS r
         ORDER BY r.expires_at DESC LIMIT 1;
    ELSE
        SELECT k.token, k.status, k.expires_at INTO rec
          FROM idempotency.keys AS k WHERE k.scope = portable_not_owned.scope AND k.key = portable_not_owned.key
         ORDER BY k.expires_at DESC LIMIT 1;
    END IF;
    RETURN CASE WHEN NOT FOUND OR rec.expires_at <= now_ THEN 'IK001'
                WHEN rec.token = portable_not_owned.token AND rec.status = 'completed' THEN 'IK003'
                ELSE 'IK002' END;
END
$$;

CREATE FUNCTION idempotency.idem_complete(
    scope text,
    key text,
    token uuid,
    response_status int,
    response_body jsonb DEFAULT NULL,
    response_headers jsonb DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text;
    now_ timestamptz := now();
    size bigint;
    size_limit bigint;
    n bigint;
BEGIN
    problem := coalesce(idempotency.portable_key_error('scope', scope), idempotency.portable_key_error('key', key));
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    IF token IS NULL THEN
        RAISE EXCEPTION 'argument "token" must not be null' USING ERRCODE = '22004';
    END IF;
    IF response_status IS NULL THEN
        RAISE EXCEPTION 'argument "response_status" must not be null' USING ERRCODE = '22004';
    END IF;
    IF response_status < 100 OR response_status > 599 THEN
        RAISE EXCEPTION 'invalid argument "response_status": must be between 100 and 599 (got %)', response_status
            USING ERRCODE = '22023';
    END IF;
    IF response_headers IS NOT NULL AND jsonb_typeof(response_headers) <> 'object' THEN
        RAISE EXCEPTION 'invalid argument "response_headers": must be a JSON object (got %)',
            CASE WHEN jsonb_typeof(response_headers) = 'array' THEN 'array' ELSE 'scalar' END
            USING ERRCODE = '22023';
    END IF;
    size_limit := idempotency.portable_max_response_bytes();
    IF size_limit IS NULL THEN
        RAISE EXCEPTION 'invalid value for setting "idempotency.max_response_size": "%"', current_setting('idempotency.max_response_size', true)
            USING ERRCODE = '22023', DETAIL = 'The value must be between 1kB and 1GB (an integer is kB).';
    END IF;
    size := idempotency.portable_raw_size(response_body) + idempotency.portable_raw_size(response_headers);
    IF size > size_limit THEN
        RAISE EXCEPTION 'argument "response_body" is too large to store: % bytes, the limit is % bytes', size, size_limit
            USING ERRCODE = '54000',
                  HINT = 'Raise idempotency.max_response_size, or store a reference to the data instead of the data.';
    END IF;
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'idem_complete cannot run on a read-only server'
            USING ERRCODE = '25006', HINT = 'Claims must run on the primary; idem_lookup works on a standby.';
    END IF;

    -- The claim leaves the claims' partition and its completed record goes to the partition
    -- of its expiry: one statement (a takeover that waited on the claim finds it gone and
    -- reads again).
    WITH claim AS (
        DELETE FROM idempotency.keys AS k
         WHERE (CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) = '-infinity'
           AND k.scope = idem_complete.scope AND k.key = idem_complete.key
           AND k.token = idem_complete.token AND k.status = 'in_progress'
           AND k.expires_at > now_
        RETURNING k.scope, k.key, k.fingerprint, k.token, k.attempts, k.recovery_point, k.recovery_data,
                  k.created_at, k.expires_at)
    INSERT INTO idempotency.keys
           (scope, key, fingerprint, status, token, attempts, locked_until, recovery_point,
            recovery_data, response_status, response_headers, response_body, created_at,
            updated_at, completed_at, expires_at)
    SELECT c.scope, c.key, c.fingerprint, 'completed', c.token, c.attempts, NULL, c.recovery_point,
           c.recovery_data, idem_complete.response_status, idem_complete.response_headers,
           idem_complete.response_body, c.created_at, now_, now_, c.expires_at
      FROM claim AS c;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n = 1 THEN
        RETURN;
    END IF;
    problem := idempotency.portable_not_owned(scope, key, token, now_);
    IF problem = 'IK001' THEN
        RAISE EXCEPTION 'no live idempotency record for scope %, key %',
            idempotency.portable_quote(scope), idempotency.portable_quote(key)
            USING ERRCODE = 'IK001', DETAIL = 'The key was never claimed, was released, or its record expired.';
    ELSIF problem = 'IK003' THEN
        RAISE EXCEPTION 'idempotency record for scope %, key % is already completed',
            idempotency.portable_quote(scope), idempotency.portable_quote(key)
            USING ERRCODE = 'IK003',
                  HINT = 'Call idem_complete once per claim; retries get the stored response from idem_claim.';
    ELSE
        RAISE EXCEPTION 'token does not own the idempotency record for scope %, key %',
            idempotency.portable_quote(scope), idempotency.portable_quote(key)
            USING ERRCODE = 'IK002',
                  DETAIL = 'Another worker took the claim over after its lease ended, or the claim was released.',
                  HINT = 'Do not report success: the current owner will finish the operation. Renew long leases with idem_checkpoint.';
    END IF;
END
$$;

CREATE FUNCTION idempotency.idem_checkpoint(
    scope text,
    key text,
    token uuid,
    recovery_point text,
    recovery_data jsonb DEFAULT NULL,
    lease interval DEFAULT NULL
) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text;
    now_ timestamptz := now();
    size bigint;
    size_limit bigint;
    lease_end timestamptz;
    lease_given boolean;
    n bigint;
BEGIN
    problem := coalesce(idempotency.portable_key_error('scope', scope), idempotency.portable_key_error('key', key));
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    IF token IS NULL THEN
        RAISE EXCEPTION 'argument "token" must not be null' USING ERRCODE = '22004';
    END IF;
    IF recovery_point IS NULL THEN
        RAISE EXCEPTION 'argument "recovery_point" must not be null' USING ERRCODE = '22004';
    END IF;
    size_limit := idempotency.portable_max_response_bytes();
    IF size_limit IS NULL THEN
        RAISE EXCEPTION 'invalid value for setting "idempotency.max_response_size": "%"', current_setting('idempotency.max_response_size', true)
            USING ERRCODE = '22023', DETAIL = 'The value must be between 1kB and 1GB (an integer is kB).';
    END IF;
    size := idempotency.portable_raw_size(recovery_data) + octet_length(recovery_point);
    IF size > size_limit THEN
        RAISE EXCEPTION 'argument "recovery_data" is too large to store: % bytes, the limit is % bytes', size, size_limit
            USING ERRCODE = '54000',
                  HINT = 'Raise idempotency.max_response_size, or store a reference to the data instead of the data.';
    END IF;
    lease_given := lease IS NOT NULL;
    SELECT a.value, a.problem INTO lease, problem
      FROM idempotency.portable_interval_arg('lease', lease, 'idempotency.default_lease', interval '5 minutes') AS a;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'idem_checkpoint cannot run on a read-only server'
            USING ERRCODE = '25006', HINT = 'Claims must run on the primary; idem_lookup works on a standby.';
    END IF;

    -- Without a lease the claim keeps the length of the lease it was made with: every write
    -- of locked_until sets updated_at to the same now, so the difference is that length.
    UPDATE idempotency.keys AS k
       SET recovery_point = idem_checkpoint.recovery_point, recovery_data = idem_checkpoint.recovery_data,
           locked_until = now_ + CASE WHEN NOT lease_given AND k.locked_until > k.updated_at
                                      THEN k.locked_until - k.updated_at ELSE lease END,
           updated_at = now_
     WHERE (CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) = '-infinity'
       AND k.scope = idem_checkpoint.scope AND k.key = idem_checkpoint.key
       AND k.token = idem_checkpoint.token AND k.status = 'in_progress'
       AND k.expires_at > now_
    RETURNING k.locked_until INTO lease_end;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n = 1 THEN
        RETURN lease_end;
    END IF;
    problem := idempotency.portable_not_owned(scope, key, token, now_);
    IF problem = 'IK001' THEN
        RAISE EXCEPTION 'no live idempotency record for scope %, key %',
            idempotency.portable_quote(scope), idempotency.portable_quote(key)
            USING ERRCODE = 'IK001', DETAIL = 'The key was never claimed, was released, or its record expired.';
    ELSIF problem = 'IK003' THEN
        RAISE EXCEPTION 'idempotency record for scope %, key % is already completed',
            idempotency.portable_quote(scope), idempotency.portable_quote(key)
            USING ERRCODE = 'IK003',
                  HINT = 'Call idem_complete once per claim; retries get the stored response from idem_claim.';
    ELSE
        RAISE EXCEPTION 'token does not own the idempotency record for scope %, key %',
            idempotency.portable_quote(scope), idempotency.portable_quote(key)
            USING ERRCODE = 'IK002',
                  DETAIL = 'Another worker took the claim over after its lease ended, or the claim was released.',
                  HINT = 'Do not report success: the current owner will finish the operation. Renew long leases with idem_checkpoint.';
    END IF;
END
$$;

CREATE FUNCTION idempotency.idem_release(scope text, key text, token uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text;
    n bigint;
BEGIN
    problem := coalesce(idempotency.portable_key_error('scope', scope), idempotency.portable_key_error('key', key));
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    IF token IS NULL THEN
        RAISE EXCEPTION 'argument "token" must not be null' USING ERRCODE = '22004';
    END IF;
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'idem_release cannot run on a read-only server'
            USING ERRCODE = '25006', HINT = 'Claims must run on the primary; idem_lookup works on a standby.';
    END IF;
    DELETE FROM idempotency.keys AS k
     WHERE (CASE WHEN k.status = 'completed' THEN k.expires_at ELSE '-infinity'::timestamptz END) = '-infinity'
       AND k.scope = idem_release.scope AND k.key = idem_release.key
       AND k.token = idem_release.token AND k.status = 'in_progress'
       AND k.expires_at > now();
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n = 1;
END
$$;

-- idem_lookup: the live record, read-only (no transaction id), so it works on a standby;
-- the 0.5.0 table is read too while it is there (0.6.0).
CREATE FUNCTION idempotency.idem_lookup(scope text, key text)
RETURNS SETOF idempotency.keys
LANGUAGE plpgsql STABLE PARALLEL RESTRICTED
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    problem text;
BEGIN
    problem := coalesce(idempotency.portable_key_error('scope', scope), idempotency.portable_key_error('key', key));
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = left(problem, 5), MESSAGE = substr(problem, 7);
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_class AS c WHERE c.relnamespace = 'idempotency'::pg_catalog.regnamespace AND c.relname = 'keys_legacy') THEN
        RETURN QUERY
            SELECT k.* FROM idempotency.keys AS k
             WHERE k.scope = idem_lookup.scope AND k.key = idem_lookup.key AND k.expires_at > now()
            UNION ALL
            SELECT l.* FROM idempotency.keys_legacy AS l
             WHERE l.scope = idem_lookup.scope AND l.key = idem_lookup.key AND l.expires_at > now();
        RETURN;
    END IF;
    RETURN QUERY
        SELECT k.* FROM idempotency.keys AS k
         WHERE k.scope = idem_lookup.scope AND k.key = idem_lookup.key AND k.expires_at > now();
END
$$;

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

-- ---------------------------------------------------------------------------------------
-- The sending side (as sql/send.sql, which both editions read).

CREATE TABLE idempotency.outbound (
    scope              text        NOT NULL,
    operation          text        NOT NULL,
    key                text        NOT NULL,
    target             text        NOT NULL,
    request            jsonb,
    request_fingerprint text,
    state              text        NOT NULL DEFAULT 'pending',
    attempts           int         NOT NULL DEFAULT 0,
    next_attempt_at    timestamptz NOT NULL,
    give_up_at         timestamptz NOT NULL,
    token              uuid,
    locked_until       timestamptz,
    last_status        int,
    last_error         text,
    response_status    int,
    response_body      text,
    response_headers   jsonb,
    created_at         timestamptz NOT NULL,
    finished_at        timestamptz,
    expires_at         timestamptz,
    CONSTRAINT outbound_pkey PRIMARY KEY (scope, operation),
    CONSTRAINT outbound_state_check CHECK (state IN ('pending', 'sending', 'done', 'gave_up'))
);

COMMENT ON TABLE idempotency.outbound IS
    'One row per (scope, operation) the application sends to another service with an '
    'Idempotency-Key: written by idem_send in the business transaction, handed to senders by '
    'idem_send_next, finished by idem_send_result. done: the receiver''s final answer is in '
    'response_*; gave_up: no final answer before give_up_at, the outcome at the receiver is unknown.';

-- What idem_send_next reads, each in its order: first attempts, retries (a row being sent has
-- attempts > 0: its lease may end), and rows past give_up_at. Apart, so that a backlog of one
-- kind is never scanned to find the other.
CREATE INDEX outbound_first_due_idx ON idempotency.outbound (target, next_attempt_at)
    WHERE state = 'pending' AND attempts = 0;

CREATE INDEX outbound_retry_due_idx ON idempotency.outbound (target, next_attempt_at)
    WHERE state IN ('pending', 'sending') AND attempts > 0;

CREATE INDEX outbound_give_up_idx ON idempotency.outbound (target, give_up_at)
    WHERE state IN ('pending', 'sending');

CREATE INDEX outbound_expires_at_idx ON idempotency.outbound (expires_at)
    WHERE expires_at IS NOT NULL;

-- Sends that gave up, by when: idempotency.stats counts them and finds the latest (an alert
-- reads it) without reading the done rows.
CREATE INDEX outbound_gave_up_idx ON idempotency.outbound (finished_at)
    WHERE state = 'gave_up';

ALTER TABLE idempotency.outbound SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01
);

DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('idempotency.outbound', '');
EXCEPTION WHEN feature_not_supported THEN
    NULL; -- not inside CREATE EXTENSION
END
$$;

-- The retry budget, per target: the attempts idem_send_next handed out and the answers
-- idem_send_result recorded, counted in buckets of a sixtieth of idempotency.send_retry_window
-- (1 second by default). A backend counts in rows of its own (backend_pid): no two sessions
-- ever write the same row, so counting never waits for a lock. The budget sums the window.
CREATE TABLE idempotency.outbound_budget (
    target            text        NOT NULL,
    bucket            timestamptz NOT NULL,
    backend_pid       int         NOT NULL,
    first_attempts    bigint      NOT NULL DEFAULT 0,
    retries           bigint      NOT NULL DEFAULT 0,
    final_answers     bigint      NOT NULL DEFAULT 0,
    retryable_answers bigint      NOT NULL DEFAULT 0,
    CONSTRAINT outbound_budget_pkey PRIMARY KEY (target, bucket, backend_pid)
);

COMMENT ON TABLE idempotency.outbound_budget IS
    'Per target, the first attempts and retries handed out by idem_send_next and the final and '
    'retryable answers recorded by idem_send_result, in buckets of a sixtieth of '
    'idempotency.send_retry_window, one row per backend and bucket: the retry budget sums the '
    'window. Rows older than two windows (at least two minutes) are deleted as senders go and by '
    'idem_sweep.';

-- What is wrong with a scope, operation, target or key (NULL: nothing), as the idempotency
-- key rule: 1 to 255 characters, no control characters (U+0000-U+001F, U+007F-U+009F).
CREATE FUNCTION idempotency.send_text_problem(val text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bad text;
BEGIN
    IF val = '' THEN
        RETURN 'must not be empty';
    END IF;
    bad := substring(val FROM '[\x01-\x1f\x7f-\x9f]');
    IF bad IS NOT NULL THEN
        RETURN format('must not contain control characters (found U+%s)', upper(lpad(to_hex(ascii(bad)), 4, '0')));
    END IF;
    IF length(val) > 255 THEN
        RETURN format('must be at most 255 characters (got %s)', length(val));
    END IF;
    RETURN NULL;
END
$$;

-- Raises 22004 for a NULL, 22023 for a bad value, naming the argument.
CREATE FUNCTION idempotency.send_check_text(arg text, val text) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF val IS NULL THEN
        RAISE EXCEPTION 'argument "%" must not be null', arg USING ERRCODE = '22004';
    END IF;
    IF idempotency.send_text_problem(val) IS NOT NULL THEN
        RAISE EXCEPTION 'invalid argument "%": %', arg, idempotency.send_text_problem(val)
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- An interval argument or setting: positive, at most 10000 years (22023 naming it).
CREATE FUNCTION idempotency.send_check_interval(what text, val interval) RETURNS interval
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF val IS NOT NULL AND (val <= interval '0' OR val > interval '10000 years') THEN
        RAISE EXCEPTION 'invalid %: % (it must be a positive interval of at most 10000 years)', what, val
            USING ERRCODE = '22023';
    END IF;
    RETURN val;
END
$$;

-- The interval setting `name`, or `fallback` when it is not set. The native edition checks
-- the value when it is SET; the portable edition reads a placeholder, checked here.
CREATE FUNCTION idempotency.send_interval_setting(name text, fallback interval) RETURNS interval
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    raw text := current_setting(name, true);
    val interval;
BEGIN
    IF raw IS NULL OR raw = '' THEN
        RETURN fallback;
    END IF;
    BEGIN
        val := raw::interval;
    EXCEPTION WHEN data_exception OR syntax_error THEN
        RAISE EXCEPTION 'invalid value for setting "%": "%" (it must be a positive interval of at most 10000 years)', name, raw
            USING ERRCODE = '22023';
    END;
    RETURN idempotency.send_check_interval('value for setting "' || name || '"', val);
END
$$;

-- idempotency.send_retry_budget: a ratio, 0 or more (0: no retries), default 0.1.
CREATE FUNCTION idempotency.send_retry_budget() RETURNS float8
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    raw text := current_setting('idempotency.send_retry_budget', true);
    val float8;
BEGIN
    IF raw IS NULL OR raw = '' THEN
        RETURN 0.1;
    END IF;
    BEGIN
        val := raw::float8;
    EXCEPTION WHEN data_exception OR syntax_error THEN
        val := NULL;
    END;
    IF val IS NULL OR val < 0 OR val = 'NaN'::float8 OR val = 'Infinity'::float8 THEN
        RAISE EXCEPTION 'invalid value for setting "idempotency.send_retry_budget": "%" (it must be a number of 0 or more)', raw
            USING ERRCODE = '22023';
    END IF;
    RETURN val;
END
$$;

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

-- idem_send is SQL over this PL/pgSQL body: its arguments and result columns share names
-- (scope, key, ...), which PL/pgSQL refuses.
CREATE FUNCTION idempotency.send_prepare(p_scope text, p_operation text, p_target text, p_request jsonb,
                                         p_key text, p_give_up_after interval)
RETURNS SETOF idempotency.outbound
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key text := p_key;
    v_after interval;
    v_fingerprint text;
    v_row idempotency.outbound;
BEGIN
    PERFORM idempotency.send_check_text('scope', p_scope);
    PERFORM idempotency.send_check_text('operation', p_operation);
    PERFORM idempotency.send_check_text('target', p_target);
    IF v_key IS NOT NULL THEN
        PERFORM idempotency.send_check_text('key', v_key);
    END IF;
    v_after := coalesce(idempotency.send_check_interval('argument "give_up_after"', p_give_up_after),
                        idempotency.send_interval_setting('idempotency.send_give_up_after', interval '23 hours'));
    IF p_request IS NOT NULL THEN
        v_fingerprint := idempotency.idem_fingerprint(p_request);
    END IF;

    INSERT INTO idempotency.outbound AS o
           (scope, operation, key, target, request, request_fingerprint, state, attempts,
            next_attempt_at, give_up_at, created_at)
    VALUES (p_scope, p_operation, coalesce(v_key, gen_random_uuid()::text),
            p_target, p_request, v_fingerprint, 'pending', 0,
            now(), now() + v_after, now())
    ON CONFLICT ON CONSTRAINT outbound_pkey DO NOTHING
    RETURNING o.* INTO v_row;

    IF FOUND THEN
        -- Wakes the senders that LISTEN, at COMMIT (a rollback sends nothing).
        PERFORM pg_notify('idempotency_send', p_target);
    ELSE
        SELECT o.* INTO v_row FROM idempotency.outbound AS o
         WHERE o.scope = p_scope AND o.operation = p_operation;
        IF NOT FOUND THEN
            -- Another transaction's row, committed after this snapshot (REPEATABLE READ).
            RAISE EXCEPTION 'operation "%" in scope "%" was recorded by a concurrent transaction',
                  p_operation, p_scope
                USING ERRCODE = '40001';
        END IF;
        IF v_row.target IS DISTINCT FROM p_target
           OR v_row.request_fingerprint IS DISTINCT FROM v_fingerprint
           OR (v_key IS NOT NULL AND v_row.key IS DISTINCT FROM v_key) THEN
            RAISE EXCEPTION 'operation "%" in scope "%" is already recorded with another %',
                  p_operation, p_scope,
                  CASE WHEN v_row.target IS DISTINCT FROM p_target THEN 'target'
                       WHEN v_row.request_fingerprint IS DISTINCT FROM v_fingerprint THEN 'request'
                       ELSE 'key' END
                USING ERRCODE = 'IK004',
                      HINT = 'An operation is sent once; give a new operation id for a new request.';
        END IF;
    END IF;
    RETURN NEXT v_row;
END
$$;

CREATE FUNCTION idempotency.idem_send(
    scope text,
    operation text,
    target text,
    request jsonb DEFAULT NULL,
    key text DEFAULT NULL,
    give_up_after interval DEFAULT NULL
) RETURNS TABLE (key text, state text, attempts int, next_attempt_at timestamptz,
                 response_status int, response_body text, response_headers jsonb)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT o.key, o.state, o.attempts, o.next_attempt_at, o.response_status, o.response_body, o.response_headers
      FROM idempotency.send_prepare($1, $2, $3, $4, $5, $6) AS o
$$;

-- The retries `target` may still be handed out now (send_retries_allowed), from its counts
-- over the window: retries in every bucket that overlaps it, first attempts in the buckets
-- inside it, so that counting in buckets never loosens the bound.
CREATE FUNCTION idempotency.send_retry_allowance(target text) RETURNS bigint
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

-- The portable edition's idem_send_next and idem_send_result (the native edition's are in the
-- library: src/api/send_next.rs, send_result.rs, send_budget.rs), with the retry budget's
-- counting. The same answers, errors and SQLSTATEs in both editions: the regress tests 17_send,
-- 18_lease_length, 19_send_backoff and 23_send_budget run against both. What is shared (the
-- outbound tables, idem_send, the budget's arithmetic, the sweep) is in sql/send.sql.
-- Until 0.6.0 both editions ran these; an upgraded native database drops them
-- (sql/idempotency--0.5.0--0.6.0.sql).

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

-- One due row (locked by the caller): handed out (its new token: sending under a new lease,
-- attempts + 1), or, past give_up_at, gave_up (NULL).
CREATE FUNCTION idempotency.send_hand_out(r idempotency.outbound, lease interval) RETURNS uuid
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_token uuid;
BEGIN
    IF r.give_up_at <= now() THEN
        UPDATE idempotency.outbound AS o
           SET state = 'gave_up', token = NULL, locked_until = NULL, finished_at = now(),
               expires_at = now() + idempotency.send_interval_setting('idempotency.default_ttl', interval '24 hours'),
               last_error = coalesce(CASE WHEN r.state = 'sending' THEN 'lease ended without a result' END, o.last_error)
         WHERE o.scope = r.scope AND o.operation = r.operation;
        RETURN NULL;
    END IF;
    UPDATE idempotency.outbound AS o
       SET state = 'sending', attempts = o.attempts + 1, token = gen_random_uuid(),
           locked_until = now() + lease, next_attempt_at = now() + lease,
           last_error = CASE WHEN r.state = 'sending' THEN 'lease ended without a result' ELSE o.last_error END
     WHERE o.scope = r.scope AND o.operation = r.operation
    RETURNING o.token INTO v_token;
    RETURN v_token;
END
$$;

CREATE FUNCTION idempotency.send_take(p_target text, p_max_rows int, p_lease interval,
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

CREATE FUNCTION idempotency.idem_send_next(
    target text DEFAULT NULL,
    max_rows int DEFAULT 1,
    lease interval DEFAULT NULL,
    scope text DEFAULT NULL,
    operation text DEFAULT NULL
) RETURNS TABLE (scope text, operation text, target text, key text, request jsonb,
                 attempt int, token uuid, locked_until timestamptz, give_up_at timestamptz)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM idempotency.send_take($1, $2, $3, $4, $5)
$$;

CREATE FUNCTION idempotency.send_finish(p_scope text, p_operation text, p_token uuid, p_http_status int,
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

CREATE FUNCTION idempotency.idem_send_result(
    scope text,
    operation text,
    token uuid,
    http_status int DEFAULT NULL,
    response_body text DEFAULT NULL,
    response_headers jsonb DEFAULT NULL,
    retry_after interval DEFAULT NULL,
    error text DEFAULT NULL
) RETURNS TABLE (state text, attempts int, next_attempt_at timestamptz)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM idempotency.send_finish($1, $2, $3, $4, $5, $6, $7, $8)
$$;

-- idem_sweep's part (both editions call it last, with what is left of max_rows): deletes
-- done and gave_up rows past expires_at, oldest first, skipping rows another session holds,
-- and the budget's rows older than two windows (at least two minutes), skipping rows a
-- session holds. Returns the outbound rows deleted.
CREATE FUNCTION idempotency.send_sweep(max_rows bigint) RETURNS bigint
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

-- ---------------------------------------------------------------------------------------
-- The view, the batch sweep and pg_cron scheduling (as sql/finalize.sql).

CREATE VIEW idempotency.stats AS
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

-- No SET search_path: a procedure that commits cannot have one, so every name and
-- operator is qualified instead.
CREATE PROCEDURE idempotency.idem_sweep_all(
    batch_size int DEFAULT 200,
    pause interval DEFAULT '4 ms'
)
LANGUAGE plpgsql
AS $$
DECLARE
    deleted bigint;
    total bigint := 0;
    seconds float8;
BEGIN
    IF pause IS NULL OR pause OPERATOR(pg_catalog.<) '0'::pg_catalog.interval
       OR pause OPERATOR(pg_catalog.>) '1 hour'::pg_catalog.interval THEN
        RAISE EXCEPTION 'pause must be between 0 and 1 hour, not %', pause
            USING ERRCODE = '22023';
    END IF;
    seconds := pg_catalog.date_part('epoch', pause);
    LOOP
        deleted := idempotency.idem_sweep(batch_size);
        total := total OPERATOR(pg_catalog.+) deleted;
        COMMIT;
        EXIT WHEN deleted OPERATOR(pg_catalog.<) batch_size;
        IF seconds OPERATOR(pg_catalog.>) 0 THEN
            PERFORM pg_catalog.pg_sleep(seconds);
        END IF;
    END LOOP;
    RAISE NOTICE 'idem_sweep_all: deleted % expired rows', total;
END
$$;

CREATE FUNCTION idempotency.schedule_maintenance(
    sweep_schedule text DEFAULT '*/5 * * * *',
    reclaim_schedule text DEFAULT '* * * * *'
) RETURNS TABLE (jobname text, jobid bigint, schedule text, command text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Only pg_cron's own cron.schedule: a schema named cron that someone else created (a
    -- database owner can) must not get to run code as the caller.
    IF NOT EXISTS (
        SELECT FROM pg_catalog.pg_depend AS d
          JOIN pg_catalog.pg_extension AS e ON e.oid OPERATOR(pg_catalog.=) d.refobjid
         WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
           AND d.objid OPERATOR(pg_catalog.=) pg_catalog.to_regprocedure('cron.schedule(text,text,text)')
           AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.deptype OPERATOR(pg_catalog.=) 'e'
           AND e.extname OPERATOR(pg_catalog.=) 'pg_cron'
    ) THEN
        RAISE EXCEPTION 'pg_cron is not installed in database %', current_database()
            USING ERRCODE = '55000',
                  HINT = 'Set shared_preload_libraries = ''pg_cron'' and cron.database_name = '''
                         || current_database() || ''', restart the server, then CREATE EXTENSION pg_cron.';
    END IF;
    jobname := 'idempotency-sweep';
    schedule := sweep_schedule;
    command := 'CALL idempotency.idem_sweep_all()';
    EXECUTE 'SELECT cron.schedule($1, $2, $3)' INTO jobid USING jobname, schedule, command;
    RETURN NEXT;
    jobname := 'idempotency-reclaim-stale';
    schedule := reclaim_schedule;
    command := 'SELECT count(*) FROM idempotency.idem_reclaim_stale()';
    EXECUTE 'SELECT cron.schedule($1, $2, $3)' INTO jobid USING jobname, schedule, command;
    RETURN NEXT;
END
$$;

-- Citus (as sql/citus.sql, without the NULL-scope guard, which needs the native library:
-- the functions are not delegated and run on the coordinator).
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
