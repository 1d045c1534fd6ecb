-- idempotency 0.2.0 -> 0.3.0. Frozen once released, as every upgrade script.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.3.0'" to load this file. \quit

-- idem_sweep_all sweeps in short bursts by default: batches of 200 with a 4 ms pause after
-- each (0.2.0: batches of 10000 back to back, which doubled to tripled the p99 of the claims
-- running beside it on 2 cores). Replaced in place, so grants on it and pg_cron jobs that
-- call it are kept; idem_sweep_all(10000, '0') is the old default.
CREATE OR REPLACE PROCEDURE idempotency.idem_sweep_all(
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
