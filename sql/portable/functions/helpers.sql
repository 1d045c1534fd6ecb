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
