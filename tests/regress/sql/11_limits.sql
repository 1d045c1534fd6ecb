-- Size limits and unusual input. A stored response (body plus headers) or checkpoint data
-- may be at most idempotency.max_response_size (default 1MB); past it idem_complete and
-- idem_checkpoint refuse with SQLSTATE 54000 and store nothing.
\set SHOW_CONTEXT never

SELECT count(*) FROM idempotency.idem_lookup('limits', 'none');  -- loads the library
SHOW idempotency.max_response_size;

-- A 10 MB body (a JSON string of 10485760 'x').
SELECT token AS tok FROM idempotency.idem_claim('limits', 'big') \gset
SELECT idempotency.idem_complete('limits', 'big', :'tok', 200, to_jsonb(repeat('x', 10 * 1024 * 1024)));
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT status FROM idempotency.keys WHERE scope = 'limits' AND key = 'big';

-- Checkpoint data has the same limit.
SELECT idempotency.idem_checkpoint('limits', 'big', :'tok', 'step', to_jsonb(repeat('x', 2 * 1024 * 1024)));
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;

-- Raised for this session, the 10 MB body is stored and replayed whole.
SET idempotency.max_response_size = '16MB';
SELECT idempotency.idem_complete('limits', 'big', :'tok', 200, to_jsonb(repeat('x', 10 * 1024 * 1024)));
SELECT outcome, http_status, length(response_body #>> '{}') AS body_length
  FROM idempotency.idem_claim('limits', 'big');
RESET idempotency.max_response_size;

-- The limit itself must be between 1kB and 1GB.
-- (The message's tail, the range, is spelled differently by each major: left out.)
SELECT sqlstate, split_part(message, ' (', 1) AS message
  FROM fixture.try($$ SET idempotency.max_response_size = 0 $$);
SELECT sqlstate, split_part(message, ' (', 1) AS message
  FROM fixture.try($$ SET idempotency.max_response_size = '2GB' $$);

-- Deeply nested documents: 1000 levels fingerprint, 1001 are refused with 22023.
SELECT idempotency.idem_fingerprint((repeat('[', 1000) || repeat(']', 1000))::jsonb) LIKE 'sha256:%' AS depth_1000;
SELECT idempotency.idem_fingerprint((repeat('[', 1001) || repeat(']', 1001))::jsonb);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;

-- Scopes and keys are plain text: quotes, backslashes and escape-looking text are kept as they are.
SELECT outcome FROM idempotency.idem_claim(E'acct ''42'' "x" \\x00 \\u0000 %s', E'key\\0; DROP TABLE x; --');
SELECT scope, key FROM idempotency.keys WHERE scope LIKE 'acct %';
-- A real NUL cannot even reach the extension: PostgreSQL text has no NUL.
SELECT idempotency.idem_claim('acct', E'nul\u0000');

-- Invalid UTF-8 in a bytea payload is just bytes to the bytea fingerprint.
SELECT idempotency.idem_fingerprint('\xc328ffa0a1'::bytea) = 'sha256:' || encode(sha256('\xc328ffa0a1'::bytea), 'hex') AS same;
