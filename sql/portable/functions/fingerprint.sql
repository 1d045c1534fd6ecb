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
