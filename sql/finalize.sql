-- Runs last in the install script, after the functions.

-- One scalar subquery a column, each answered from an index where one fits, so that an
-- alert reading only `stale`, `expired` or `oldest_in_progress_age` stays cheap on a big
-- table (unused columns of a view are not computed). `completed` has to count every live
-- record. "locked_until IS NOT NULL" (always true of an in_progress record) is there so
-- that the partial index keys_in_progress_idx applies. Each condition on the partition key
-- (the CASE expression, spelled as sql/bootstrap.sql partitions keys) keeps the planner to
-- the partitions that can hold what is counted: claims in flight (-infinity), the periods
-- not over. `expired` counts what waits for the sweep's DELETE (claims and records past the
-- periods); a period over waits for its drop (idempotency.partitions).
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

-- Sweeps a backlog of any size in batches of batch_size, committing after each, until a
-- batch finds fewer rows than it could take, sleeping `pause` after each full batch. By
-- default in short bursts (200 rows, about 2 ms of work on 2 cores) with 4 ms pauses: a
-- sweep that takes a core for seconds at a time doubles or triples the p99 of the claims
-- running beside it, as any busy backend does (BENCHMARKS.md, Expiry at scale);
-- idem_sweep_all(10000, '0') sweeps as fast as it can. CALL it outside a transaction block
-- (pg_cron does). No SET search_path here: a procedure that commits cannot have one, so
-- every name and operator is qualified instead.
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

-- Schedules the sweep and the release of stale claims with pg_cron, in this database.
-- Returns the two jobs; calling it again updates them (pg_cron jobs are named).
CREATE FUNCTION idempotency.schedule_maintenance(
    sweep_schedule text DEFAULT '*/5 * * * *',
    reclaim_schedule text DEFAULT '* * * * *'
) RETURNS TABLE (jobname text, jobid bigint, schedule text, command text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Only pg_cron's own cron.schedule: a schema named cron that someone else created (a
    -- database owner can) must not get to run code as the caller, often a superuser.
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
