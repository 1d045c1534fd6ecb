-- The limit: the bare prepared primary-key read of the stored record ('r-<n>', as in
-- replay.ext.sql) that idem_claim answers this retry from, and nothing else. Autocommit.
\set n random(1, :nkeys)
SELECT status, fingerprint, token, attempts, locked_until, expires_at, response_status, response_headers, response_body FROM idempotency.keys WHERE scope = 'acct_42 POST /charges' AND key = 'r-' || :n::text;
