-- What the owner of a claim does with it: idem_complete, idem_checkpoint, idem_release;
-- and idem_lookup, which reads the live record.

-- A token that never owned anything.
\set stranger '00000000-0000-4000-8000-000000000000'

-- idem_lookup of a key never claimed: no row.
SELECT count(*) AS records FROM idempotency.idem_lookup('life', 'k1');

-- idem_complete raises IK001 when the key has no live record: never claimed ...
SELECT * FROM fixture.try(format($$ SELECT idempotency.idem_complete('life', 'k1', %L, 200) $$, :'stranger'));
-- ... and so does idem_checkpoint.
SELECT * FROM fixture.try(format($$ SELECT idempotency.idem_checkpoint('life', 'k1', %L, 'step-1') $$, :'stranger'));

-- Claim k1. idem_lookup now returns the live record, a row of idempotency.keys.
SELECT outcome AS outcome, token AS tok FROM idempotency.idem_claim('life', 'k1', 'fp-1') \gset
SELECT :'outcome' AS outcome;
SELECT scope, key, fingerprint, status, token = :'tok' AS same_token, attempts,
       locked_until - created_at = interval '5 minutes' AS lease_5min, recovery_point, response_status,
       created_at = updated_at AS untouched, completed_at, expires_at > now() AS live
  FROM idempotency.idem_lookup('life', 'k1');

-- A wrong token cannot complete, checkpoint or release the claim: IK002, or false.
SELECT * FROM fixture.try(format($$ SELECT idempotency.idem_complete('life', 'k1', %L, 200) $$, :'stranger'));
SELECT * FROM fixture.try(format($$ SELECT idempotency.idem_checkpoint('life', 'k1', %L, 'step-1') $$, :'stranger'));
SELECT idempotency.idem_release('life', 'k1', :'stranger') AS released;
-- With default verbosity psql shows the error's DETAIL and HINT as well:
SELECT idempotency.idem_complete('life', 'k1', :'stranger', 200);

-- idem_checkpoint records progress and renews the lease: it returns the new locked_until,
-- now() + the default lease (5 minutes), or now() + the lease given.
SELECT idempotency.idem_checkpoint('life', 'k1', :'tok', 'step-1', '{"reserved": 3}')
       = now() + interval '5 minutes' AS locked_until_in_5min;
SELECT idempotency.idem_checkpoint('life', 'k1', :'tok', 'step-2', '{"reserved": 3, "charged": true}', lease => '1 hour')
       AS locked_until \gset
SELECT :'locked_until'::timestamptz - now() BETWEEN interval '59 minutes' AND interval '1 hour' AS about_an_hour;
SELECT recovery_point, recovery_data, locked_until = :'locked_until' AS renewed, status, attempts
  FROM idempotency.idem_lookup('life', 'k1');

-- That is the heartbeat that keeps a long operation from being taken over: a claim made
-- with a 10 ms lease and renewed at once for an hour is still in_progress 0.1 s later.
BEGIN;
SELECT token AS tok5 FROM idempotency.idem_claim('life', 'k5', lease => '10 ms') \gset
SELECT idempotency.idem_checkpoint('life', 'k5', :'tok5', 'started', lease => '1 hour') = now() + interval '1 hour' AS renewed;
COMMIT;
SELECT pg_sleep(0.1);
SELECT outcome, http_status, attempts FROM idempotency.idem_claim('life', 'k5');

-- idem_complete stores the response and ends the lease.
SELECT idempotency.idem_complete('life', 'k1', :'tok', 201, '{"ok": true}', '{"Content-Type": "application/json"}');
SELECT status, locked_until, response_status, response_headers, response_body, recovery_point,
       completed_at IS NOT NULL AS has_completed_at
  FROM idempotency.idem_lookup('life', 'k1');

-- Completing twice is IK003; a checkpoint after completion is IK003 too.
SELECT * FROM fixture.try(format($$ SELECT idempotency.idem_complete('life', 'k1', %L, 201) $$, :'tok'));
SELECT * FROM fixture.try(format($$ SELECT idempotency.idem_checkpoint('life', 'k1', %L, 'step-3') $$, :'tok'));
-- A completed record cannot be released: false, and it is still there.
SELECT idempotency.idem_release('life', 'k1', :'tok') AS released;
SELECT status FROM idempotency.idem_lookup('life', 'k1');

-- idem_release drops the caller's in_progress claim (the operation was not carried out):
-- true the first time, false after, and the record is gone.
SELECT token AS tok2 FROM idempotency.idem_claim('life', 'k2', 'fp-2') \gset
SELECT idempotency.idem_release('life', 'k2', :'tok2') AS released;
SELECT idempotency.idem_release('life', 'k2', :'tok2') AS released_again;
SELECT count(*) AS records FROM idempotency.idem_lookup('life', 'k2');
-- The released token can no longer complete: there is no live record (IK001).
SELECT * FROM fixture.try(format($$ SELECT idempotency.idem_complete('life', 'k2', %L, 200) $$, :'tok2'));
-- The next request with the key runs as new, even with another fingerprint: claimed, attempts 1.
SELECT outcome, attempts, token <> :'tok2' AS new_token FROM idempotency.idem_claim('life', 'k2', 'fp-other');
-- The old token does not own the new claim: IK002.
SELECT * FROM fixture.try(format($$ SELECT idempotency.idem_complete('life', 'k2', %L, 200) $$, :'tok2'));

-- An owner whose lease ended can still complete, as long as nobody took the claim over.
BEGIN;
SELECT token AS tok3 FROM idempotency.idem_claim('life', 'k3', lease => '10 ms') \gset
COMMIT;
SELECT pg_sleep(0.1);
SELECT status, locked_until <= now() AS lease_ended FROM idempotency.idem_lookup('life', 'k3');
SELECT idempotency.idem_complete('life', 'k3', :'tok3', 204);
SELECT status, response_status FROM idempotency.idem_lookup('life', 'k3');

-- An expired record is no live record: idem_lookup returns no row, even though the
-- row is still in the table until idem_sweep deletes it ...
BEGIN;
SELECT token AS tok4 FROM idempotency.idem_claim('life', 'k4', ttl => '10 ms') \gset
COMMIT;
SELECT pg_sleep(0.1);
SELECT count(*) AS records FROM idempotency.idem_lookup('life', 'k4');
SELECT count(*) AS rows_in_table FROM idempotency.keys WHERE scope = 'life' AND key = 'k4';
-- ... its token can neither complete nor checkpoint it (IK001), nor release it (false).
SELECT * FROM fixture.try(format($$ SELECT idempotency.idem_complete('life', 'k4', %L, 200) $$, :'tok4'));
SELECT * FROM fixture.try(format($$ SELECT idempotency.idem_checkpoint('life', 'k4', %L, 'step-1') $$, :'tok4'));
SELECT idempotency.idem_release('life', 'k4', :'tok4') AS released;
