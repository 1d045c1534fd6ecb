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
