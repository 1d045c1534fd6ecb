-- Retries cost a read: a claim that answers replay, in_progress or mismatch, and
-- idem_lookup, write nothing and take no transaction id. Each case runs inside
-- BEGIN ... COMMIT and then asks txid_current_if_assigned(), which stays NULL until the
-- transaction writes or locks a row (so NULL also shows that no row was locked).

-- Setup, outside the transactions under test: a completed key and an in_progress key.
SELECT token AS tok FROM idempotency.idem_claim('noxid', 'done', 'fp-1') \gset
SELECT idempotency.idem_complete('noxid', 'done', :'tok', 200, '{"n": 1}');
SELECT outcome FROM idempotency.idem_claim('noxid', 'running', 'fp-1');

-- replay: no transaction id.
BEGIN;
SELECT outcome, http_status FROM idempotency.idem_claim('noxid', 'done', 'fp-1');
SELECT txid_current_if_assigned() IS NULL AS no_xid;
COMMIT;

-- in_progress: no transaction id.
BEGIN;
SELECT outcome, http_status FROM idempotency.idem_claim('noxid', 'running', 'fp-1');
SELECT txid_current_if_assigned() IS NULL AS no_xid;
COMMIT;

-- mismatch, on a completed and on an in_progress record: no transaction id.
BEGIN;
SELECT outcome, http_status FROM idempotency.idem_claim('noxid', 'done', 'fp-2');
SELECT outcome, http_status FROM idempotency.idem_claim('noxid', 'running', 'fp-2');
SELECT txid_current_if_assigned() IS NULL AS no_xid;
COMMIT;

-- idem_lookup, of a live record and of a missing one: no transaction id.
BEGIN;
SELECT status FROM idempotency.idem_lookup('noxid', 'done');
SELECT count(*) AS records FROM idempotency.idem_lookup('noxid', 'missing');
SELECT txid_current_if_assigned() IS NULL AS no_xid;
COMMIT;

-- The record was not touched by any of these reads (updated_at is still its creation time
-- for the in_progress record).
SELECT status, attempts, updated_at = created_at AS untouched FROM idempotency.keys
 WHERE scope = 'noxid' AND key = 'running';

-- So all of these answers also work in a READ ONLY transaction ...
BEGIN READ ONLY;
SELECT outcome FROM idempotency.idem_claim('noxid', 'done', 'fp-1');
SELECT outcome FROM idempotency.idem_claim('noxid', 'running', 'fp-1');
SELECT outcome FROM idempotency.idem_claim('noxid', 'running', 'fp-2');
SELECT count(*) AS records FROM idempotency.idem_lookup('noxid', 'done');
COMMIT;

-- ... but a claim that has to write cannot run there: PostgreSQL's own error (25006).
BEGIN READ ONLY;
SELECT * FROM fixture.try($$ SELECT idempotency.idem_claim('noxid', 'new', 'fp-1') $$);
ROLLBACK;

-- A claimed answer writes the record, and so takes a transaction id.
BEGIN;
SELECT txid_current_if_assigned() IS NULL AS no_xid_before;
SELECT outcome FROM idempotency.idem_claim('noxid', 'new', 'fp-1');
SELECT txid_current_if_assigned() IS NOT NULL AS xid_assigned;
-- The claim belongs to this transaction: rolling back forgets it.
ROLLBACK;
SELECT count(*) AS records FROM idempotency.idem_lookup('noxid', 'new');
