-- The portable edition 0.6.0 registered with pg_tle (Trusted Language Extensions: AWS RDS
-- and Aurora, Supabase), so that CREATE EXTENSION idempotency installs it. Generated from
-- idempotency-portable--0.6.0.sql, which it holds unchanged between the $_pgtle_$ quotes;
-- both are written by scripts/assemble_portable.py (tests/portable/assembly.sh checks them).
-- Steps (docs/portable.md, "Install with pg_tle"); not tested in CI (pg_tle is not packaged
-- for this project's test machines; checked by hand with pg_tle 1.5.2, issue 21).
--     CREATE EXTENSION IF NOT EXISTS pg_tle;          -- a superuser (rds_superuser on RDS) only
--     GRANT pgtle_admin TO your_admin_role;
--     \i sql/portable/pgtle.sql                       -- as a member of pgtle_admin
--     CREATE SCHEMA IF NOT EXISTS idempotency;
--     CREATE EXTENSION idempotency SCHEMA idempotency;
-- Not on a server holding the native edition's files (pg_tle refuses the name). Upgrades:
-- pgtle.install_update_path, then pgtle.set_default_version, then ALTER EXTENSION UPDATE.
SELECT pgtle.install_extension(
    'idempotency',
    '0.6.0',
    'Idempotency keys, leases and message de-duplication inside your own transaction (portable edition: SQL and PL/pgSQL)',
$_pgtle_$
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

-- The record, the message log and the claim result type (as sql/bootstrap.sql).

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
    expires_at       timestamptz NOT NULL,
    CONSTRAINT keys_pkey PRIMARY KEY (scope, key)
);

COMMENT ON TABLE idempotency.keys IS
    'One idempotency record per (scope, key). Written through the idem_* functions; '
    'a record with expires_at <= now() is treated as absent until idem_sweep deletes it.';

ALTER TABLE idempotency.keys SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01
);

CREATE INDEX keys_expires_at_idx ON idempotency.keys (expires_at);

CREATE INDEX keys_in_progress_idx ON idempotency.keys (locked_until)
    WHERE status = 'in_progress' AND locked_until IS NOT NULL;

-- The sweep with tombstones on (idempotency.tombstone_ttl): records that still hold a
-- response, by expiry, so that each batch finds the expired ones to turn into tombstones
-- without stepping over the tombstones it already made.
CREATE INDEX keys_responses_idx ON idempotency.keys (expires_at)
    WHERE response_body IS NOT NULL OR response_headers IS NOT NULL;

CREATE TABLE idempotency.messages (
    scope      text        NOT NULL,
    message_id text        NOT NULL,
    seen_at    timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    CONSTRAINT messages_pkey PRIMARY KEY (scope, message_id)
);

COMMENT ON TABLE idempotency.messages IS
    'Message ids recorded by idem_seen; expired rows are treated as absent until idem_sweep deletes them.';

CREATE INDEX messages_expires_at_idx ON idempotency.messages (expires_at);

ALTER TABLE idempotency.messages SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01
);

-- Installed as an extension (pg_tle, or a control file), pg_dump keeps the rows of both
-- tables; run with psql -f there is no extension and pg_dump keeps everything anyway.
DO $$
BEGIN
    PERFORM pg_catalog.pg_extension_config_dump('idempotency.keys', '');
    PERFORM pg_catalog.pg_extension_config_dump('idempotency.messages', '');
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
-- with nothing written and no transaction id taken; only a claim that goes ahead writes (an
-- insert, the replacement of an expired record, or the takeover of a claim whose lease
-- ended). A write that finds the record changed under it reads again.
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
-- 0.6.0: deferred is accepted and answers exactly as in the native edition, but the
-- portable edition cannot hold a key without a row (it has no memory that lives until the
-- transaction ends, nor a hook at COMMIT): it writes the in_progress record at once, as
-- without deferred, and idem_complete updates it (docs/portable.md).

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

    <<waiting>>
    LOOP
        expires := now_ + ttl;
        lease_end := now_ + lease;
        answer := NULL;
        <<rounds>>
        FOR round IN 1..10 LOOP
            SELECT k.fingerprint, k.status, k.token, k.attempts, k.locked_until, k.expires_at,
                   k.response_status, k.response_headers, k.response_body, k.recovery_point, k.recovery_data
              INTO rec
              FROM idempotency.keys AS k
             WHERE k.scope = idem_claim.scope AND k.key = idem_claim.key;
            IF NOT FOUND THEN
                new_token := coalesce(idem_claim.token, gen_random_uuid());
                INSERT INTO idempotency.keys AS k
                       (scope, key, fingerprint, status, token, attempts, locked_until,
                        created_at, updated_at, expires_at)
                VALUES (idem_claim.scope, idem_claim.key, idem_claim.fingerprint, 'in_progress',
                        new_token, 1, lease_end, now_, now_, expires)
                ON CONFLICT (scope, key) DO NOTHING;
                GET DIAGNOSTICS n = ROW_COUNT;
                IF n = 1 THEN
                    answer := ROW('claimed', new_token, NULL, NULL, NULL, NULL, NULL, NULL, 1, expires, lease_end);
                    EXIT rounds;
                END IF;
                CONTINUE; -- another transaction inserted it first: read what it left
            END IF;

            IF rec.expires_at <= now_ THEN
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
                new_token := coalesce(idem_claim.token, gen_random_uuid());
                UPDATE idempotency.keys AS k
                   SET fingerprint = idem_claim.fingerprint, status = 'in_progress', token = new_token,
                       attempts = 1, locked_until = lease_end, recovery_point = NULL, recovery_data = NULL,
                       response_status = NULL, response_headers = NULL, response_body = NULL,
                       created_at = now_, updated_at = now_, completed_at = NULL, expires_at = expires
                 WHERE k.scope = idem_claim.scope AND k.key = idem_claim.key
                   AND k.token = rec.token AND k.expires_at <= now_;
                GET DIAGNOSTICS n = ROW_COUNT;
                IF n = 1 THEN
                    answer := ROW('claimed', new_token, NULL, NULL, NULL, NULL, NULL, NULL, 1, expires, lease_end);
                    EXIT rounds;
                END IF;
                CONTINUE;
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

            -- The owner's lease ended: take the claim over, fenced on the token read.
            new_token := coalesce(idem_claim.token, gen_random_uuid());
            new_expires := greatest(rec.expires_at, expires);
            UPDATE idempotency.keys AS k
               SET token = new_token, attempts = rec.attempts + 1, locked_until = lease_end,
                   updated_at = now_, expires_at = new_expires
             WHERE k.scope = idem_claim.scope AND k.key = idem_claim.key
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

        EXIT waiting WHEN answer.outcome <> 'in_progress' OR wait IS NULL OR wait = interval '0'
                       OR current_setting('transaction_isolation') IN ('repeatable read', 'serializable');
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
-- when it touches no row, a read says why.

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
    rec record;
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

    UPDATE idempotency.keys AS k
       SET status = 'completed', locked_until = NULL, response_status = idem_complete.response_status,
           response_headers = idem_complete.response_headers, response_body = idem_complete.response_body,
           completed_at = now_, updated_at = now_
     WHERE k.scope = idem_complete.scope AND k.key = idem_complete.key
       AND k.token = idem_complete.token AND k.status = 'in_progress'
       AND k.expires_at > now_;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n = 1 THEN
        RETURN;
    END IF;
    SELECT k.token, k.status, k.expires_at INTO rec
      FROM idempotency.keys AS k WHERE k.scope = idem_complete.scope AND k.key = idem_complete.key;
    IF NOT FOUND OR rec.expires_at <= now_ THEN
        RAISE EXCEPTION 'no live idempotency record for scope %, key %',
            idempotency.portable_quote(scope), idempotency.portable_quote(key)
            USING ERRCODE = 'IK001', DETAIL = 'The key was never claimed, was released, or its record expired.';
    ELSIF rec.token = idem_complete.token AND rec.status = 'completed' THEN
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
    rec record;
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
     WHERE k.scope = idem_checkpoint.scope AND k.key = idem_checkpoint.key
       AND k.token = idem_checkpoint.token AND k.status = 'in_progress'
       AND k.expires_at > now_
    RETURNING k.locked_until INTO lease_end;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n = 1 THEN
        RETURN lease_end;
    END IF;
    SELECT k.token, k.status, k.expires_at INTO rec
      FROM idempotency.keys AS k WHERE k.scope = idem_checkpoint.scope AND k.key = idem_checkpoint.key;
    IF NOT FOUND OR rec.expires_at <= now_ THEN
        RAISE EXCEPTION 'no live idempotency record for scope %, key %',
            idempotency.portable_quote(scope), idempotency.portable_quote(key)
            USING ERRCODE = 'IK001', DETAIL = 'The key was never claimed, was released, or its record expired.';
    ELSIF rec.token = idem_checkpoint.token AND rec.status = 'completed' THEN
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
     WHERE k.scope = idem_release.scope AND k.key = idem_release.key
       AND k.token = idem_release.token AND k.status = 'in_progress'
       AND k.expires_at > now();
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n = 1;
END
$$;

-- idem_lookup: the live record, read-only (no transaction id), so it works on a standby.
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
    RETURN QUERY
        SELECT k.* FROM idempotency.keys AS k
         WHERE k.scope = idem_lookup.scope AND k.key = idem_lookup.key AND k.expires_at > now();
END
$$;

-- idem_seen: a duplicate is answered from a read, with nothing written and no transaction id.
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
    n bigint;
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
    SELECT m.expires_at INTO live_until FROM idempotency.messages AS m
     WHERE m.scope = idem_seen.scope AND m.message_id = idem_seen.message_id;
    IF FOUND AND live_until > now_ THEN
        RETURN false;
    END IF;
    -- Behind another open transaction's insert of the same id this waits on the unique
    -- index, then touches nothing if that transaction committed.
    INSERT INTO idempotency.messages AS m (scope, message_id, seen_at, expires_at)
    VALUES (idem_seen.scope, idem_seen.message_id, now_, now_ + ttl)
    ON CONFLICT (scope, message_id) DO UPDATE SET seen_at = now_, expires_at = now_ + ttl
     WHERE m.expires_at <= now_;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n = 1;
END
$$;

-- idem_seen_many (0.4.0): idem_seen for a batch, in one call. A batch of duplicates is
-- answered from one read (nothing written, no transaction id). The new ids are recorded by
-- one INSERT in byte order: two batches that share ids lock them in the same order, so one
-- waits for the other instead of deadlocking. Element i is true when message_ids[i] was
-- recorded now and is its first occurrence in the batch.
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

    -- The distinct ids not live in the log, in byte order. OFFSET 0 keeps the look-up one
    -- index look-up per id (0.4.1): as a join it could be planned as a hash anti join that
    -- reads the whole scope, while the statistics still said the scope was small.
    SELECT array_agg(d.id ORDER BY d.id COLLATE "C") INTO unseen
      FROM (SELECT DISTINCT u.id FROM unnest(message_ids) AS u(id)) AS d
     WHERE NOT EXISTS (SELECT FROM idempotency.messages AS m
                        WHERE m.scope = idem_seen_many.scope AND m.message_id = d.id AND m.expires_at > now_ OFFSET 0);
    IF unseen IS NOT NULL THEN
        -- Behind another open transaction's insert of the same id this waits on the unique
        -- index; an id that transaction recorded is not returned.
        WITH ins AS (
            INSERT INTO idempotency.messages AS m (scope, message_id, seen_at, expires_at)
            SELECT idem_seen_many.scope, u.id, now_, now_ + ttl FROM unnest(unseen) AS u(id)
            ON CONFLICT (scope, message_id) DO UPDATE SET seen_at = now_, expires_at = now_ + ttl
             WHERE m.expires_at <= now_
            RETURNING m.message_id)
        SELECT array_agg(ins.message_id) INTO recorded FROM ins;
    END IF;
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

-- Deletes expired records. With idempotency.tombstone_ttl on (0.4.0), within the same
-- budget: records expired longer ago than tombstone_ttl (tombstones past their end) are
-- deleted, claims that expired in_progress are deleted (they leave no tombstone), and
-- completed records that expired become tombstones (response and checkpoint dropped).
CREATE FUNCTION idempotency.idem_sweep(max_rows int DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    problem text;
    now_ timestamptz := now();
    dist record;
    tombstone_ttl interval;
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
    dist := idempotency.portable_distributed();

    -- Each step picks at most what is left of the budget, then changes exactly those rows
    -- if they are still past the cut-off.
    FOREACH step IN ARRAY CASE WHEN tombstone_ttl IS NULL THEN ARRAY['delete']
                               ELSE ARRAY['delete', 'expired claims', 'tombstones'] END LOOP
        EXIT WHEN swept >= max_rows;
        scopes := NULL;
        IF step = 'delete' THEN
            IF dist.keys THEN
                SELECT array_agg(p.scope), array_agg(p.key) INTO scopes, ids
                  FROM (SELECT k.scope, k.key FROM idempotency.keys AS k
                         WHERE k.expires_at <= now_ - coalesce(tombstone_ttl, interval '0')
                         ORDER BY k.expires_at LIMIT max_rows - swept) AS p;
            ELSE
                SELECT array_agg(p.scope), array_agg(p.key) INTO scopes, ids
                  FROM (SELECT k.scope, k.key FROM idempotency.keys AS k
                         WHERE k.expires_at <= now_ - coalesce(tombstone_ttl, interval '0')
                         ORDER BY k.expires_at LIMIT max_rows - swept FOR UPDATE SKIP LOCKED) AS p;
            END IF;
            IF scopes IS NOT NULL THEN
                DELETE FROM idempotency.keys AS t
                 USING ROWS FROM (unnest(scopes), unnest(ids)) AS picked(scope, id)
                 WHERE (NOT dist.keys OR t.scope = ANY (scopes))
                   AND t.scope = picked.scope AND t.key = picked.id
                   AND t.expires_at <= now_ - coalesce(tombstone_ttl, interval '0');
                GET DIAGNOSTICS n = ROW_COUNT;
                swept := swept + n;
            END IF;
        ELSIF step = 'expired claims' THEN
            IF dist.keys THEN
                SELECT array_agg(p.scope), array_agg(p.key) INTO scopes, ids
                  FROM (SELECT k.scope, k.key FROM idempotency.keys AS k
                         WHERE k.status = 'in_progress' AND k.locked_until IS NOT NULL AND k.expires_at <= now_
                         ORDER BY k.locked_until LIMIT max_rows - swept) AS p;
            ELSE
                SELECT array_agg(p.scope), array_agg(p.key) INTO scopes, ids
                  FROM (SELECT k.scope, k.key FROM idempotency.keys AS k
                         WHERE k.status = 'in_progress' AND k.locked_until IS NOT NULL AND k.expires_at <= now_
                         ORDER BY k.locked_until LIMIT max_rows - swept FOR UPDATE SKIP LOCKED) AS p;
            END IF;
            IF scopes IS NOT NULL THEN
                DELETE FROM idempotency.keys AS t
                 USING ROWS FROM (unnest(scopes), unnest(ids)) AS picked(scope, id)
                 WHERE (NOT dist.keys OR t.scope = ANY (scopes))
                   AND t.scope = picked.scope AND t.key = picked.id
                   AND t.status = 'in_progress' AND t.expires_at <= now_;
                GET DIAGNOSTICS n = ROW_COUNT;
                swept := swept + n;
            END IF;
        ELSE
            -- Through keys_responses_idx (its predicate spelled the same): the tombstones
            -- already made are not stepped over.
            IF dist.keys THEN
                SELECT array_agg(p.scope), array_agg(p.key) INTO scopes, ids
                  FROM (SELECT k.scope, k.key FROM idempotency.keys AS k
                         WHERE (k.response_body IS NOT NULL OR k.response_headers IS NOT NULL) AND k.expires_at <= now_
                         ORDER BY k.expires_at LIMIT max_rows - swept) AS p;
            ELSE
                SELECT array_agg(p.scope), array_agg(p.key) INTO scopes, ids
                  FROM (SELECT k.scope, k.key FROM idempotency.keys AS k
                         WHERE (k.response_body IS NOT NULL OR k.response_headers IS NOT NULL) AND k.expires_at <= now_
                         ORDER BY k.expires_at LIMIT max_rows - swept FOR UPDATE SKIP LOCKED) AS p;
            END IF;
            IF scopes IS NOT NULL THEN
                UPDATE idempotency.keys AS t
                   SET response_body = NULL, response_headers = NULL, recovery_point = NULL, recovery_data = NULL
                  FROM ROWS FROM (unnest(scopes), unnest(ids)) AS picked(scope, id)
                 WHERE (NOT dist.keys OR t.scope = ANY (scopes))
                   AND t.scope = picked.scope AND t.key = picked.id
                   AND t.status = 'completed' AND t.expires_at <= now_;
                GET DIAGNOSTICS n = ROW_COUNT;
                swept := swept + n;
            END IF;
        END IF;
    END LOOP;
    IF swept >= max_rows THEN
        RETURN swept;
    END IF;

    scopes := NULL;
    IF dist.messages THEN
        SELECT array_agg(p.scope), array_agg(p.message_id) INTO scopes, ids
          FROM (SELECT m.scope, m.message_id FROM idempotency.messages AS m WHERE m.expires_at <= now_
                 ORDER BY m.expires_at LIMIT max_rows - swept) AS p;
    ELSE
        SELECT array_agg(p.scope), array_agg(p.message_id) INTO scopes, ids
          FROM (SELECT m.scope, m.message_id FROM idempotency.messages AS m WHERE m.expires_at <= now_
                 ORDER BY m.expires_at LIMIT max_rows - swept FOR UPDATE SKIP LOCKED) AS p;
    END IF;
    IF scopes IS NOT NULL THEN
        DELETE FROM idempotency.messages AS t
         USING ROWS FROM (unnest(scopes), unnest(ids)) AS picked(scope, id)
         WHERE (NOT dist.messages OR t.scope = ANY (scopes))
           AND t.scope = picked.scope AND t.message_id = picked.id AND t.expires_at <= now_;
        GET DIAGNOSTICS n = ROW_COUNT;
        swept := swept + n;
    END IF;
    RETURN swept + idempotency.send_sweep(max_rows - swept);
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
         WHERE s.status = 'in_progress' AND s.locked_until <= now_ AND s.expires_at > now_
         ORDER BY s.locked_until LIMIT max_rows
           FOR UPDATE SKIP LOCKED
    LOOP
        -- Each is fenced again: nothing changes when a claim took the row over meanwhile.
        IF release THEN
            DELETE FROM idempotency.keys AS k
             WHERE k.scope = stale.scope AND k.key = stale.key AND k.token = stale.token
               AND k.status = 'in_progress' AND k.locked_until <= now_ AND k.expires_at > now_
            RETURNING k.recovery_point, k.recovery_data INTO changed;
            new_token := stale.token;
        ELSE
            new_token := gen_random_uuid();
            UPDATE idempotency.keys AS k
               SET token = new_token, attempts = stale.attempts + 1, locked_until = lease_end, updated_at = now_
             WHERE k.scope = stale.scope AND k.key = stale.key AND k.token = stale.token
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

-- The three idem_send* functions are SQL over these PL/pgSQL bodies: their arguments and
-- result columns share names (scope, key, ...), which PL/pgSQL refuses.
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
    'awaiting idem_sweep, the age of the oldest in_progress claim, and tombstones (expired '
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
$_pgtle_$
);
