-- Compares idem_fingerprint of the native edition (schema idempotency) with the portable
-- edition installed under schema idem_portable, on the documents of table corpus(doc text,
-- ignore text[]). Errors are compared too (SQLSTATE and message). Prints the differences
-- (none expected) and one line "fingerprint: SAME of TOTAL documents agree".
\set ON_ERROR_STOP 1
CREATE FUNCTION pg_temp.fp(edition text, doc text, ign text[]) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    result text;
    code text;
    msg text;
BEGIN
    EXECUTE format('SELECT %I.idem_fingerprint($1::jsonb, $2)', edition) INTO result USING doc, ign;
    RETURN result;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
    RETURN 'ERROR ' || code || ' ' || msg;
END $$;
CREATE TEMP TABLE compared AS
SELECT n, doc, ignore, pg_temp.fp('idempotency', doc, ignore) AS native,
       pg_temp.fp('idem_portable', doc, ignore) AS portable
  FROM corpus;
SELECT n, left(doc, 200) AS doc, ignore, native, portable FROM compared
 WHERE native IS DISTINCT FROM portable ORDER BY n LIMIT 20;
SELECT count(*) FILTER (WHERE native LIKE 'ERROR%') AS errors_in_both
  FROM compared WHERE native IS NOT DISTINCT FROM portable;
SELECT format('fingerprint: %s of %s documents agree', count(*) FILTER (WHERE native IS NOT DISTINCT FROM portable), count(*)) AS summary
  FROM compared;
