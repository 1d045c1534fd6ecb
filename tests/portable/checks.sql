-- Checks of a portable install (psql -f as the database owner), beyond the regress suite:
-- what is installed and how it is protected. Each line of output is "name|value"; run.sh
-- compares the values. Run as the owner who installed it.
\pset format unaligned
\pset tuples_only on

-- Every contract function, with the native edition's identity arguments and volatility; not
-- the portable edition's own (contract/contract.json's "editions": ["portable"]: the steps of
-- idem_send_next and idem_send_result, which the native library runs itself).
SELECT 'functions|' || string_agg(p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ') '
                                  || p.provolatile::text || CASE WHEN p.proisstrict THEN ' strict' ELSE '' END
                                  || ' ' || p.proparallel::text, '; ' ORDER BY p.proname, pg_get_function_identity_arguments(p.oid))
  FROM pg_proc p WHERE p.pronamespace = 'idempotency'::regnamespace AND p.proname !~ '^portable_'
   AND p.proname NOT IN ('send_take', 'send_hand_out', 'send_finish', 'send_count');
-- Every function pins search_path (the procedure cannot: it commits, and qualifies every name).
SELECT 'unpinned|' || coalesce(string_agg(p.oid::regprocedure::text, ', '), '')
  FROM pg_proc p WHERE p.pronamespace = 'idempotency'::regnamespace AND p.prokind = 'f'
   AND NOT coalesce(p.proconfig @> ARRAY['search_path=pg_catalog, pg_temp'], false);
-- SECURITY INVOKER everywhere: the caller's table grants decide.
SELECT 'definer|' || count(*) FROM pg_proc p WHERE p.pronamespace = 'idempotency'::regnamespace AND p.prosecdef;
-- Owned by the installing database owner, who is not a superuser.
SELECT 'owner|' || nspowner::regrole || ' superuser=' || (SELECT rolsuper FROM pg_roles WHERE oid = nspowner)
  FROM pg_namespace WHERE nspname = 'idempotency';
-- The defaults in columns, the claim_result columns, the view's columns.
SELECT 'claim_result|' || string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
  FROM pg_attribute a WHERE a.attrelid = 'idempotency.claim_result'::regclass AND a.attnum > 0;
SELECT 'keys|' || string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END, ', ' ORDER BY a.attnum)
  FROM pg_attribute a WHERE a.attrelid = 'idempotency.keys'::regclass AND a.attnum > 0 AND NOT a.attisdropped;
-- Storage settings: the tables' own (since 0.6.0 keys and messages are partitioned and keep
-- theirs on their partitions).
SELECT 'storage|' || string_agg(c.relname || ' ' || array_to_string(c.reloptions, ','), '; ' ORDER BY c.relname)
  FROM pg_class c WHERE c.relnamespace = 'idempotency'::regnamespace AND c.reloptions IS NOT NULL;
SELECT 'stats|' || string_agg(a.attname, ', ' ORDER BY a.attnum)
  FROM pg_attribute a WHERE a.attrelid = 'idempotency.stats'::regclass AND a.attnum > 0;
SELECT 'defaults|' || string_agg(p.proname || ': ' || coalesce(pg_get_expr(p.proargdefaults, 0), '-'), '; ' ORDER BY p.proname, pg_get_function_identity_arguments(p.oid))
  FROM pg_proc p WHERE p.pronamespace = 'idempotency'::regnamespace AND p.proname ~ '^idem_';
-- The indexes (besides the primary keys' names, which follow the constraints).
SELECT 'indexes|' || string_agg(pg_get_indexdef(i.indexrelid), '; ' ORDER BY c.relname)
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
 WHERE c.relnamespace = 'idempotency'::regnamespace;
