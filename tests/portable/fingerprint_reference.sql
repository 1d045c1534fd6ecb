-- idem_fingerprint of the portable edition against reference(n, fp): rfc8785_ref.py's
-- answers for the documents of corpus(n, doc, ignore) ('ERROR' where a number is beyond
-- the double range, which must be 22023). Prints the first differences, then one line
-- "SAME of TOTAL documents agree".
CREATE FUNCTION pg_temp.fp(doc text, ign text[]) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    code text;
    msg text;
BEGIN
    RETURN idempotency.idem_fingerprint(doc::jsonb, ign);
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
    RETURN CASE WHEN code = '22023' AND msg LIKE 'invalid argument "payload": number out of range for RFC 8785: %'
                THEN 'ERROR' ELSE 'ERROR ' || code || ' ' || msg END;
END $$;
CREATE TEMP TABLE compared AS
SELECT c.n, c.doc, c.ignore, r.fp AS expected, pg_temp.fp(c.doc, c.ignore) AS portable
  FROM corpus AS c JOIN reference AS r USING (n);
SELECT n || ': ' || left(doc, 120) || ' ignore=' || coalesce(ignore::text, '-') || ' expected ' || expected || ', got ' || portable
  FROM compared WHERE expected IS DISTINCT FROM portable ORDER BY n LIMIT 5;
SELECT count(*) FILTER (WHERE expected = portable) || ' of ' || count(*) || ' documents agree' FROM compared;
