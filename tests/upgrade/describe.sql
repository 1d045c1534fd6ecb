-- One line per object of the idempotency extension, sorted: what an upgrade must reproduce
-- exactly. Functions with their full definition, the tables' columns, constraints and
-- indexes, types, views, and the table storage options.
WITH members AS (
    SELECT d.classid, d.objid
      FROM pg_catalog.pg_depend AS d
      JOIN pg_catalog.pg_extension AS e ON e.oid = d.refobjid
     WHERE d.refclassid = 'pg_catalog.pg_extension'::regclass
       AND d.deptype = 'e' AND e.extname = 'idempotency'
)
SELECT line FROM (
    SELECT 'function ' || pg_catalog.pg_get_functiondef(m.objid) AS line
      FROM members m WHERE m.classid = 'pg_catalog.pg_proc'::regclass
    UNION ALL
    SELECT 'relation ' || c.relname || ' ' || c.relkind::text || ' ' || coalesce(array_to_string(c.reloptions, ','), '')
      FROM members m JOIN pg_catalog.pg_class c ON c.oid = m.objid
     WHERE m.classid = 'pg_catalog.pg_class'::regclass
    UNION ALL
    SELECT 'column ' || c.relname || '.' || a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod)
           || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
           || coalesce(' default ' || pg_catalog.pg_get_expr(ad.adbin, ad.adrelid), '')
      FROM members m JOIN pg_catalog.pg_class c ON c.oid = m.objid
      JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
      LEFT JOIN pg_catalog.pg_attrdef ad ON ad.adrelid = c.oid AND ad.adnum = a.attnum
     WHERE m.classid = 'pg_catalog.pg_class'::regclass
    UNION ALL
    SELECT 'constraint ' || c.relname || '.' || k.conname || ' ' || pg_catalog.pg_get_constraintdef(k.oid)
      FROM members m JOIN pg_catalog.pg_class c ON c.oid = m.objid
      JOIN pg_catalog.pg_constraint k ON k.conrelid = c.oid
     WHERE m.classid = 'pg_catalog.pg_class'::regclass
    UNION ALL
    SELECT 'index ' || pg_catalog.pg_get_indexdef(i.indexrelid)
      FROM members m JOIN pg_catalog.pg_index i ON i.indrelid = m.objid
     WHERE m.classid = 'pg_catalog.pg_class'::regclass
    UNION ALL
    SELECT 'view ' || c.relname || ' ' || pg_catalog.pg_get_viewdef(c.oid)
      FROM members m JOIN pg_catalog.pg_class c ON c.oid = m.objid
     WHERE m.classid = 'pg_catalog.pg_class'::regclass AND c.relkind = 'v'
    UNION ALL
    SELECT 'type ' || pg_catalog.format_type(m.objid, NULL)
      FROM members m WHERE m.classid = 'pg_catalog.pg_type'::regclass
    UNION ALL
    SELECT 'comment ' || pg_catalog.obj_description(m.objid, 'pg_class')
      FROM members m WHERE m.classid = 'pg_catalog.pg_class'::regclass
                       AND pg_catalog.obj_description(m.objid, 'pg_class') IS NOT NULL
    UNION ALL
    SELECT 'config_dump ' || (SELECT array_to_string(array_agg(c::regclass::text ORDER BY c::regclass::text), ',')
                                FROM pg_catalog.pg_extension e, unnest(e.extconfig) AS c
                               WHERE e.extname = 'idempotency')
) AS described
ORDER BY line;
