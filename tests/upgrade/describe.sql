-- Everything in schema idempotency, as sorted lines: what two installs that should be the same
-- must print alike. The one description of an install, used by
--   tests/upgrade/run.sh    every release of both editions, upgraded, against a fresh install
--   tests/portable/run.sh   the portable edition's last upgrade, as a file and as an extension
--   tests/parity/run.sh     a fresh native install against a fresh portable one and against
--                           contract/contract.json: only the kinds a caller sees (below)
-- Each line starts with its kind:
--   signature   a function as a caller sees it: arguments with defaults, result, volatility,
--               strictness, parallel safety, security definer, procedure
--   function    its whole definition, grants and comment (each edition's own code)
--   relation    a table, view, index, sequence or composite type: kind, storage options,
--               grants, comment
--   column      a column of a table, view or composite type: position, type, NOT NULL, default
--   constraint, index, view (its definition), type (with its comment), config_dump (the
--               tables whose rows pg_dump keeps, where idempotency is an extension)
-- Every line but a function's whole definition is one line of text.
--     psql -X -q -At -f tests/upgrade/describe.sql DB
\pset format unaligned
\pset tuples_only on
WITH ns AS (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = 'idempotency'),
-- The periods idem_sweep makes (keys_20261207t000000 ...) are data, not what an install made.
periods AS (SELECT c.oid FROM pg_catalog.pg_class c
             WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relname ~ '^(keys|messages)_[0-9]{8}t[0-9]{6}'),
rel AS (SELECT c.* FROM pg_catalog.pg_class c WHERE c.relnamespace = (SELECT oid FROM ns)
          AND c.oid NOT IN (SELECT oid FROM periods)
          AND NOT EXISTS (SELECT FROM pg_catalog.pg_index i WHERE i.indexrelid = c.oid AND i.indrelid IN (SELECT oid FROM periods)))
SELECT line FROM (
    SELECT 'signature ' || p.proname || '(' || pg_catalog.pg_get_function_arguments(p.oid) || ')'
           || coalesce(' returns ' || pg_catalog.pg_get_function_result(p.oid), '')
           || CASE p.provolatile WHEN 'v' THEN ' volatile' WHEN 's' THEN ' stable' ELSE ' immutable' END
           || CASE WHEN p.proisstrict THEN ' strict' ELSE '' END
           || CASE p.proparallel WHEN 's' THEN ' parallel safe' WHEN 'r' THEN ' parallel restricted'
                                 ELSE ' parallel unsafe' END
           || CASE WHEN p.prosecdef THEN ' security definer' ELSE '' END
           || CASE WHEN p.prokind = 'p' THEN ' procedure' ELSE '' END AS line
      FROM pg_catalog.pg_proc p WHERE p.pronamespace = (SELECT oid FROM ns)
    UNION ALL
    SELECT 'function ' || p.oid::pg_catalog.regprocedure::text || ' ' || pg_catalog.pg_get_functiondef(p.oid)
           || ' acl=' || coalesce(p.proacl::text, '-')
           || ' comment=' || coalesce(pg_catalog.obj_description(p.oid, 'pg_proc'), '-')
      FROM pg_catalog.pg_proc p WHERE p.pronamespace = (SELECT oid FROM ns)
    UNION ALL
    SELECT 'relation ' || c.relname || ' ' || c.relkind::text
           || ' options=' || coalesce(pg_catalog.array_to_string(c.reloptions, ','), '-')
           || ' acl=' || coalesce(c.relacl::text, '-')
           || ' comment=' || coalesce(pg_catalog.obj_description(c.oid, 'pg_class'), '-')
      FROM rel c
    UNION ALL
    SELECT 'column ' || c.relname || '.' || pg_catalog.lpad(
               (pg_catalog.row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum))::text, 2, '0')
           || ' ' || a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod)
           || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
           || coalesce(' default ' || pg_catalog.pg_get_expr(d.adbin, d.adrelid), '')
      FROM rel c
      JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
      LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
     WHERE c.relkind IN ('r', 'p', 'v', 'm', 'c')
    UNION ALL
    SELECT 'constraint ' || coalesce(k.conrelid::pg_catalog.regclass::text, '-') || '.' || k.conname || ' '
           || pg_catalog.pg_get_constraintdef(k.oid)
      FROM pg_catalog.pg_constraint k WHERE k.connamespace = (SELECT oid FROM ns)
       AND k.conrelid NOT IN (SELECT oid FROM periods)
    UNION ALL
    SELECT 'index ' || pg_catalog.pg_get_indexdef(i.indexrelid)
      FROM rel c JOIN pg_catalog.pg_index i ON i.indrelid = c.oid
    UNION ALL
    SELECT 'view ' || c.relname || ' ' || pg_catalog.regexp_replace(pg_catalog.pg_get_viewdef(c.oid), '\s+', ' ', 'g')
      FROM rel c WHERE c.relkind IN ('v', 'm')
    UNION ALL
    SELECT 'type ' || t.typname || ' ' || t.typtype::text
           || ' comment=' || coalesce(pg_catalog.obj_description(t.oid, 'pg_type'), '-')
      FROM pg_catalog.pg_type t
     WHERE t.typnamespace = (SELECT oid FROM ns) AND t.typtype IN ('c', 'd', 'e', 'r', 'm')
       AND t.typrelid NOT IN (SELECT oid FROM periods)
       AND (t.typrelid = 0 OR (SELECT c.relkind FROM pg_catalog.pg_class c WHERE c.oid = t.typrelid) = 'c')
    UNION ALL
    SELECT 'config_dump ' || coalesce((SELECT pg_catalog.string_agg(x::pg_catalog.regclass::text, ',' ORDER BY x::pg_catalog.regclass::text)
                                          FROM pg_catalog.unnest(e.extconfig) AS x), '-')
      FROM pg_catalog.pg_extension e WHERE e.extname = 'idempotency'
) AS described
ORDER BY line COLLATE "C";
