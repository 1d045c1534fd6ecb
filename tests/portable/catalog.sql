-- Everything a portable install holds in schema idempotency, as text, sorted: an install of
-- release N followed by the upgrade file to M must print the same as a fresh install of M
-- (tests/portable/run.sh, section upgrade).
\pset format unaligned
\pset tuples_only on
SELECT kind || '|' || name || '|' || coalesce(def, '') FROM (
    SELECT 'function' AS kind, p.oid::regprocedure::text AS name,
           pg_get_functiondef(p.oid) || ' acl=' || coalesce(p.proacl::text, '-')
           || ' comment=' || coalesce(obj_description(p.oid, 'pg_proc'), '-') AS def
      FROM pg_proc p WHERE p.pronamespace = 'idempotency'::regnamespace
    UNION ALL
    SELECT CASE c.relkind WHEN 'r' THEN 'table' WHEN 'v' THEN 'view' WHEN 'i' THEN 'index'
                          WHEN 'c' THEN 'type' ELSE c.relkind::text END,
           c.relname,
           coalesce(pg_get_viewdef(c.oid), '') || coalesce(pg_get_indexdef(c.oid), '')
           || ' options=' || coalesce(array_to_string(c.reloptions, ','), '-')
           || ' acl=' || coalesce(c.relacl::text, '-')
           || ' comment=' || coalesce(obj_description(c.oid, 'pg_class'), '-')
           || ' columns=' || (SELECT coalesce(string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                                                || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
                                                || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), ''), ', ' ORDER BY a.attnum), '')
                                FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                               WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped)
      FROM pg_class c WHERE c.relnamespace = 'idempotency'::regnamespace
    UNION ALL
    SELECT 'type comment', t.typname, obj_description(t.oid, 'pg_type')
      FROM pg_type t WHERE t.typnamespace = 'idempotency'::regnamespace AND t.typtype = 'c'
    UNION ALL
    SELECT 'constraint', conrelid::regclass::text || '.' || conname, pg_get_constraintdef(oid)
      FROM pg_constraint WHERE connamespace = 'idempotency'::regnamespace
) AS o ORDER BY 1;
