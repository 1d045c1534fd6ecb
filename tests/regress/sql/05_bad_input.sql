-- Bad input. Every function names the bad argument in its message, with SQLSTATE 22004
-- for a NULL where a value is required and 22023 for a bad value, and writes nothing.

-- A live claim, whose token the lifecycle functions below are given.
SELECT token AS tok FROM idempotency.idem_claim('bad', 'live', 'fp') \gset

-- First, what is accepted. Keys and scopes of exactly 255 characters (multi-byte ones
-- too), any printable text, spaces and quotes included, and a ttl or lease of 1 microsecond.
SELECT outcome FROM idempotency.idem_claim('bad', repeat('k', 255));
SELECT outcome FROM idempotency.idem_claim(repeat('s', 255), repeat('é', 255));
SELECT outcome FROM idempotency.idem_claim('bad', $$order 42 "Zoë's" \x00 日本$$);
SELECT outcome FROM idempotency.idem_claim('bad', 'short-ttl', ttl => '1 microsecond', lease => '1 microsecond');

-- Statuses 100 and 599 are accepted, with any JSON body (a scalar too) and no headers.
SELECT token AS tok100 FROM idempotency.idem_claim('bad', 's100') \gset
SELECT idempotency.idem_complete('bad', 's100', :'tok100', 100, '"continue"');
SELECT token AS tok599 FROM idempotency.idem_claim('bad', 's599') \gset
SELECT idempotency.idem_complete('bad', 's599', :'tok599', 599, NULL, '{}');
SELECT key, response_status, response_body, response_headers FROM idempotency.keys
 WHERE scope = 'bad' AND key IN ('s100', 's599') ORDER BY key;

-- From here on nothing may be written: remember the tables' contents.
SELECT fixture.digest() AS before \gset
SELECT count(*) AS records_before FROM idempotency.keys WHERE scope = 'bad';

-- idem_claim: scope and key are required, 1 to 255 characters, no control characters;
-- ttl and lease, when given, are positive.
SELECT * FROM fixture.cases(
  'scope NULL',        $$ SELECT idempotency.idem_claim(NULL, 'k') $$,
  'key NULL',          $$ SELECT idempotency.idem_claim('bad', NULL) $$,
  'scope empty',       $$ SELECT idempotency.idem_claim('', 'k') $$,
  'key empty',         $$ SELECT idempotency.idem_claim('bad', '') $$,
  'key 256 chars',     $$ SELECT idempotency.idem_claim('bad', repeat('k', 256)) $$,
  'scope 256 chars',   $$ SELECT idempotency.idem_claim(repeat('s', 256), 'k') $$,
  'key with \n',       $$ SELECT idempotency.idem_claim('bad', E'a\nb') $$,
  'key with \t',       $$ SELECT idempotency.idem_claim('bad', E'a\tb') $$,
  'key with DEL',      $$ SELECT idempotency.idem_claim('bad', 'a' || chr(127)) $$,
  'key with U+0085',   $$ SELECT idempotency.idem_claim('bad', 'a' || chr(133)) $$,
  'scope with \r',     $$ SELECT idempotency.idem_claim(E'acct\r', 'k') $$,
  'ttl 0',             $$ SELECT idempotency.idem_claim('bad', 'k', ttl => '0') $$,
  'ttl -1 hour',       $$ SELECT idempotency.idem_claim('bad', 'k', ttl => '-1 hour') $$,
  'ttl 1 mon -30 days', $$ SELECT idempotency.idem_claim('bad', 'k', ttl => '1 mon -30 days') $$,
  'lease 0',           $$ SELECT idempotency.idem_claim('bad', 'k', lease => '0 s') $$,
  'lease -5 min',      $$ SELECT idempotency.idem_claim('bad', 'k', lease => '-5 min') $$);
-- idem_complete: scope, key, token and response_status are required; the status is an
-- HTTP status (100-599) and headers, when given, are a JSON object.
SELECT * FROM fixture.cases(
  'scope NULL',        format($$ SELECT idempotency.idem_complete(NULL, 'live', %L, 200) $$, :'tok'),
  'key NULL',          format($$ SELECT idempotency.idem_complete('bad', NULL, %L, 200) $$, :'tok'),
  'token NULL',        $$ SELECT idempotency.idem_complete('bad', 'live', NULL, 200) $$,
  'status NULL',       format($$ SELECT idempotency.idem_complete('bad', 'live', %L, NULL) $$, :'tok'),
  'key empty',         format($$ SELECT idempotency.idem_complete('bad', '', %L, 200) $$, :'tok'),
  'key 256 chars',     format($$ SELECT idempotency.idem_complete('bad', repeat('k', 256), %L, 200) $$, :'tok'),
  'key with \n',       format($$ SELECT idempotency.idem_complete('bad', E'a\nb', %L, 200) $$, :'tok'),
  'status 99',         format($$ SELECT idempotency.idem_complete('bad', 'live', %L, 99) $$, :'tok'),
  'status 600',        format($$ SELECT idempotency.idem_complete('bad', 'live', %L, 600) $$, :'tok'),
  'status -201',       format($$ SELECT idempotency.idem_complete('bad', 'live', %L, -201) $$, :'tok'),
  'headers an array',  format($$ SELECT idempotency.idem_complete('bad', 'live', %L, 200, NULL, '[]') $$, :'tok'),
  'headers a string',  format($$ SELECT idempotency.idem_complete('bad', 'live', %L, 200, NULL, '"x"') $$, :'tok'),
  'headers JSON null', format($$ SELECT idempotency.idem_complete('bad', 'live', %L, 200, NULL, 'null') $$, :'tok'));
-- idem_checkpoint: scope, key, token and recovery_point are required; lease is positive.
SELECT * FROM fixture.cases(
  'scope NULL',        format($$ SELECT idempotency.idem_checkpoint(NULL, 'live', %L, 'p') $$, :'tok'),
  'key NULL',          format($$ SELECT idempotency.idem_checkpoint('bad', NULL, %L, 'p') $$, :'tok'),
  'token NULL',        $$ SELECT idempotency.idem_checkpoint('bad', 'live', NULL, 'p') $$,
  'recovery_point NULL', format($$ SELECT idempotency.idem_checkpoint('bad', 'live', %L, NULL) $$, :'tok'),
  'scope empty',       format($$ SELECT idempotency.idem_checkpoint('', 'live', %L, 'p') $$, :'tok'),
  'key with \t',       format($$ SELECT idempotency.idem_checkpoint('bad', E'a\tb', %L, 'p') $$, :'tok'),
  'lease 0',           format($$ SELECT idempotency.idem_checkpoint('bad', 'live', %L, 'p', NULL, '0') $$, :'tok'),
  'lease -1 s',        format($$ SELECT idempotency.idem_checkpoint('bad', 'live', %L, 'p', NULL, '-1 s') $$, :'tok'));

-- idem_release: scope, key and token are required.
SELECT * FROM fixture.cases(
  'scope NULL',        format($$ SELECT idempotency.idem_release(NULL, 'live', %L) $$, :'tok'),
  'key NULL',          format($$ SELECT idempotency.idem_release('bad', NULL, %L) $$, :'tok'),
  'token NULL',        $$ SELECT idempotency.idem_release('bad', 'live', NULL) $$,
  'key empty',         format($$ SELECT idempotency.idem_release('bad', '', %L) $$, :'tok'),
  'key 256 chars',     format($$ SELECT idempotency.idem_release('bad', repeat('k', 256), %L) $$, :'tok'));

-- idem_lookup: scope and key are required and checked like idem_claim's.
SELECT * FROM fixture.cases(
  'scope NULL',        $$ SELECT * FROM idempotency.idem_lookup(NULL, 'live') $$,
  'key NULL',          $$ SELECT * FROM idempotency.idem_lookup('bad', NULL) $$,
  'key empty',         $$ SELECT * FROM idempotency.idem_lookup('bad', '') $$,
  'key 256 chars',     $$ SELECT * FROM idempotency.idem_lookup('bad', repeat('k', 256)) $$,
  'key with \n',       $$ SELECT * FROM idempotency.idem_lookup('bad', E'a\nb') $$);

-- idem_seen: scope and message_id are required and checked like keys; ttl is positive.
SELECT * FROM fixture.cases(
  'scope NULL',        $$ SELECT idempotency.idem_seen(NULL, 'm') $$,
  'message_id NULL',   $$ SELECT idempotency.idem_seen('bad', NULL) $$,
  'message_id empty',  $$ SELECT idempotency.idem_seen('bad', '') $$,
  'message_id 256',    $$ SELECT idempotency.idem_seen('bad', repeat('m', 256)) $$,
  'message_id with \n', $$ SELECT idempotency.idem_seen('bad', E'm\n') $$,
  'ttl 0',             $$ SELECT idempotency.idem_seen('bad', 'm', '0') $$,
  'ttl -1 day',        $$ SELECT idempotency.idem_seen('bad', 'm', '-1 day') $$);

-- idem_sweep and idem_reclaim_stale: max_rows is required and positive; release is
-- required; the takeover lease is positive.
SELECT * FROM fixture.cases(
  'sweep NULL',        $$ SELECT idempotency.idem_sweep(NULL) $$,
  'sweep 0',           $$ SELECT idempotency.idem_sweep(0) $$,
  'sweep -1',          $$ SELECT idempotency.idem_sweep(-1) $$,
  'reclaim NULL rows', $$ SELECT * FROM idempotency.idem_reclaim_stale(NULL) $$,
  'reclaim 0 rows',    $$ SELECT * FROM idempotency.idem_reclaim_stale(0) $$,
  'reclaim NULL release', $$ SELECT * FROM idempotency.idem_reclaim_stale(10, NULL) $$,
  'reclaim lease 0',   $$ SELECT * FROM idempotency.idem_reclaim_stale(10, false, '0') $$);

-- None of these errors wrote anything: both tables are exactly as they were.
SELECT fixture.digest() = :'before' AS tables_unchanged;
SELECT count(*) AS records_after FROM idempotency.keys WHERE scope = 'bad';
SELECT status FROM idempotency.idem_lookup('bad', 'live');
