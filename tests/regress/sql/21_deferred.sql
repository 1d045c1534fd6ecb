-- Deferred claims (0.6.0): idem_claim(..., deferred => true) of a free key writes nothing;
-- idem_complete writes the completed record once. The answers are those of a claim without
-- deferred; what differs is what is written when. The portable edition accepts deferred and
-- writes the in_progress record at once (tests/portable/expected/21_deferred.out).
SET search_path = idempotency, public;

-- A same-transaction request: claim, work, complete, commit.
BEGIN;
SELECT outcome, http_status, attempts, token IS NOT NULL AS has_token,
       locked_until - now() AS lease, expires_at - now() AS ttl
  FROM idem_claim('deferred', 'k-1', 'fp-1', deferred => true) \gset d_
\echo :d_outcome :d_attempts :d_has_token :d_lease :d_ttl
-- Nothing is written yet, and no transaction id is taken ...
SELECT count(*) AS rows_written FROM keys WHERE scope = 'deferred';
SELECT txid_current_if_assigned() IS NULL AS no_xid;
-- ... but every function sees the claim as the record it will be.
SELECT key, status, attempts, locked_until > now() AS leased FROM idem_lookup('deferred', 'k-1');
SELECT outcome, http_status FROM idem_claim('deferred', 'k-1', 'fp-1');
SELECT outcome, http_status FROM idem_claim('deferred', 'k-1', 'fp-2');
SELECT token AS tok FROM idem_lookup('deferred', 'k-1') \gset
-- Repeated with its own token: claimed again, nothing written.
SELECT outcome, token = :'tok' AS same_token FROM idem_claim('deferred', 'k-1', 'fp-1', token => :'tok', deferred => true);
-- Another token cannot complete it; its own can, once.
SELECT * FROM fixture.try($$ SELECT idempotency.idem_complete('deferred', 'k-1', gen_random_uuid(), 201) $$);
SELECT idem_complete('deferred', 'k-1', :'tok', 201, '{"id": "ch_1"}', '{"Location": "/charges/ch_1"}');
SELECT * FROM fixture.try($$ SELECT idempotency.idem_complete('deferred', 'k-1', '$$ || :'tok' || $$', 201) $$);
-- The completed record, written once: an insert, no update.
SELECT key, status, attempts, response_status, response_body, locked_until IS NULL AS no_lease,
       completed_at = created_at AS completed_in_its_transaction
  FROM keys WHERE scope = 'deferred';
SELECT sum(n_tup_ins) AS n_tup_ins, sum(n_tup_upd) AS n_tup_upd, sum(n_tup_del) AS n_tup_del
  FROM pg_stat_xact_user_tables
 WHERE relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'idempotency.keys'::regclass);
COMMIT;
SELECT outcome, http_status, response_body FROM idem_claim('deferred', 'k-1', 'fp-1', deferred => true);

-- Committed without idem_complete (BEGIN; claim; COMMIT, or autocommit): the in_progress
-- record with its lease and token is written at COMMIT, as without deferred.
BEGIN;
SELECT token AS tok2 FROM idem_claim('deferred', 'k-2', 'fp-1', lease => '1 minute', deferred => true) \gset
COMMIT;
SELECT key, status, token = :'tok2' AS its_token, attempts, locked_until - created_at AS lease
  FROM keys WHERE scope = 'deferred' AND key = 'k-2';
SELECT outcome, http_status FROM idem_claim('deferred', 'k-2', 'fp-1', deferred => true);
SELECT outcome FROM idem_claim('deferred', 'k-3', 'fp-1', deferred => true);
SELECT key, status FROM keys WHERE scope = 'deferred' AND key = 'k-3';
-- ... and completed in a later transaction, as a committed-first claim is.
SELECT idem_complete('deferred', 'k-2', :'tok2', 200);
SELECT status, response_status FROM keys WHERE scope = 'deferred' AND key = 'k-2';

-- A checkpoint renews the lease by the claim's own length and is written at COMMIT.
BEGIN;
SELECT token AS tok4 FROM idem_claim('deferred', 'k-4', 'fp-1', lease => '2 minutes', deferred => true) \gset
SELECT idem_checkpoint('deferred', 'k-4', :'tok4', 'charged', '{"charge": "ch_4"}') - now() AS renewed_by;
SELECT recovery_point, recovery_data FROM idem_lookup('deferred', 'k-4');
COMMIT;
SELECT status, recovery_point, recovery_data, locked_until - updated_at AS lease
  FROM keys WHERE scope = 'deferred' AND key = 'k-4';

-- Released: nothing is written, and the key is free again (in the same transaction too).
BEGIN;
SELECT token AS tok5 FROM idem_claim('deferred', 'k-5', 'fp-1', deferred => true) \gset
SELECT idem_release('deferred', 'k-5', :'tok5') AS released;
SELECT count(*) AS records FROM idem_lookup('deferred', 'k-5');
SELECT outcome FROM idem_claim('deferred', 'k-5', 'fp-1', deferred => true);
ROLLBACK;
SELECT count(*) AS rows_written FROM keys WHERE scope = 'deferred' AND key = 'k-5';

-- A savepoint rolled back takes back what was done in it: the claim ...
BEGIN;
SAVEPOINT a;
SELECT outcome FROM idem_claim('deferred', 'k-6', 'fp-1', deferred => true);
ROLLBACK TO a;
SELECT count(*) AS records FROM idem_lookup('deferred', 'k-6');
COMMIT;
SELECT count(*) AS rows_written FROM keys WHERE scope = 'deferred' AND key = 'k-6';
-- ... or its complete: the claim is held again, and COMMIT writes it in_progress.
BEGIN;
SELECT token AS tok7 FROM idem_claim('deferred', 'k-7', 'fp-1', deferred => true) \gset
SAVEPOINT b;
SELECT idem_complete('deferred', 'k-7', :'tok7', 201);
ROLLBACK TO b;
SELECT status FROM idem_lookup('deferred', 'k-7');
COMMIT;
SELECT status, response_status FROM keys WHERE scope = 'deferred' AND key = 'k-7';
-- A savepoint released keeps what was done in it.
BEGIN;
SAVEPOINT c;
SELECT token AS tok8 FROM idem_claim('deferred', 'k-8', 'fp-1', deferred => true) \gset
RELEASE SAVEPOINT c;
SELECT idem_complete('deferred', 'k-8', :'tok8', 202);
COMMIT;
SELECT status, response_status FROM keys WHERE scope = 'deferred' AND key = 'k-8';

-- An expired record is replaced by the completed one.
SELECT token AS tok9 FROM idem_claim('deferred', 'k-9', 'fp-old', ttl => '1 millisecond') \gset
SELECT pg_sleep(0.01);
BEGIN;
SELECT outcome, token AS tok9b FROM idem_claim('deferred', 'k-9', 'fp-new', deferred => true) \gset
\echo :outcome
SELECT idem_complete('deferred', 'k-9', :'tok9b', 200);
COMMIT;
SELECT fingerprint, status, token = :'tok9b' AS new_token, response_status FROM keys
 WHERE scope = 'deferred' AND key = 'k-9';

-- Bad input: deferred NULL (22004), and a deferred claim cannot run in a READ ONLY
-- transaction, as no claim of a free key can (25006).
SELECT * FROM fixture.try($$ SELECT idempotency.idem_claim('deferred', 'k-10', deferred => NULL) $$);
BEGIN READ ONLY;
SELECT * FROM fixture.try($$ SELECT idempotency.idem_claim('deferred', 'k-10', deferred => true) $$);
ROLLBACK;
