-- Every API function once, through every outcome and error, printing only values that do
-- not change from run to run (no tokens, no times). run.sh runs it with and without hostile
-- objects on search_path and compares the outputs line by line.
-- The scenario's own SQL qualifies everything it uses (OPERATOR(pg_catalog.=),
-- pg_catalog.count, ::pg_catalog.jsonb), so only the extension could reach evil.*.
-- psql variable :scope names the scope (run.sh passes -v scope=...).
\set ON_ERROR_STOP 0
\set VERBOSITY terse
\pset format unaligned
\pset tuples_only on

-- Claim outcomes.
SELECT 'claim fresh', outcome, token IS NOT NULL, http_status, attempts, expires_at IS NOT NULL, locked_until IS NOT NULL
  FROM idempotency.idem_claim(:'scope', 'k1', 'fp-1');
\echo claim fresh state :SQLSTATE
SELECT token AS tok1 FROM idempotency.keys
 WHERE scope OPERATOR(pg_catalog.=) :'scope' AND key OPERATOR(pg_catalog.=) 'k1' \gset
SELECT 'claim again', outcome, token IS NULL, http_status, attempts, locked_until IS NOT NULL
  FROM idempotency.idem_claim(:'scope', 'k1', 'fp-1');
SELECT 'claim other fingerprint', outcome, token IS NULL, http_status
  FROM idempotency.idem_claim(:'scope', 'k1', 'fp-2');
SELECT 'claim null fingerprint', outcome, http_status
  FROM idempotency.idem_claim(:'scope', 'k1');

-- Checkpoint and complete, fenced by the token.
SELECT 'checkpoint', idempotency.idem_checkpoint(:'scope', 'k1', :'tok1', 'step-1', '{"n": 1}'::pg_catalog.jsonb) IS NOT NULL;
SELECT 'complete', idempotency.idem_complete(:'scope', 'k1', :'tok1', 201,
       '{"id": "ch_1", "amount": 500}'::pg_catalog.jsonb, '{"Location": "/charges/ch_1"}'::pg_catalog.jsonb) IS NULL;
\echo complete state :SQLSTATE
SELECT idempotency.idem_complete(:'scope', 'k1', :'tok1', 201);
\echo complete twice state :SQLSTATE
SELECT idempotency.idem_complete(:'scope', 'k1', '00000000-0000-4000-8000-000000000000', 201);
\echo complete foreign token state :SQLSTATE
SELECT idempotency.idem_complete(:'scope', 'nope', :'tok1', 201);
\echo complete unknown key state :SQLSTATE
SELECT idempotency.idem_checkpoint(:'scope', 'k1', :'tok1', 'late');
\echo checkpoint after complete state :SQLSTATE
SELECT 'replay', outcome, token IS NULL, http_status, response_status, response_body::pg_catalog.text,
       response_headers::pg_catalog.text, attempts
  FROM idempotency.idem_claim(:'scope', 'k1', 'fp-1');

-- Lookup.
SELECT 'lookup', scope, key, fingerprint, status, attempts, response_status, recovery_point,
       recovery_data::pg_catalog.text, response_body::pg_catalog.text, locked_until IS NULL,
       completed_at IS NOT NULL
  FROM idempotency.idem_lookup(:'scope', 'k1');
SELECT 'lookup missing', pg_catalog.count(*) FROM idempotency.idem_lookup(:'scope', 'nope');

-- A lease that ends: takeover, fencing of the old token, release.
SELECT 'claim short lease', outcome FROM idempotency.idem_claim(:'scope', 'k2', NULL, NULL, '1 millisecond');
SELECT token AS tok2 FROM idempotency.keys
 WHERE scope OPERATOR(pg_catalog.=) :'scope' AND key OPERATOR(pg_catalog.=) 'k2' \gset
SELECT 'checkpoint k2', idempotency.idem_checkpoint(:'scope', 'k2', :'tok2', 'charged', '{"gw": "gw_9"}'::pg_catalog.jsonb, '1 millisecond') IS NOT NULL;
SELECT pg_catalog.pg_sleep(0.05) IS NULL AS slept \gset
SELECT 'takeover', outcome, token IS NOT NULL, attempts, recovery_point, recovery_data::pg_catalog.text
  FROM idempotency.idem_claim(:'scope', 'k2');
SELECT token AS tok2b FROM idempotency.keys
 WHERE scope OPERATOR(pg_catalog.=) :'scope' AND key OPERATOR(pg_catalog.=) 'k2' \gset
SELECT idempotency.idem_complete(:'scope', 'k2', :'tok2', 200);
\echo old owner complete state :SQLSTATE
SELECT idempotency.idem_checkpoint(:'scope', 'k2', :'tok2', 'x');
\echo old owner checkpoint state :SQLSTATE
SELECT 'old owner release', idempotency.idem_release(:'scope', 'k2', :'tok2');
SELECT 'new owner release', idempotency.idem_release(:'scope', 'k2', :'tok2b');
SELECT 'release again', idempotency.idem_release(:'scope', 'k2', :'tok2b');
SELECT 'claim after release', outcome, attempts FROM idempotency.idem_claim(:'scope', 'k2');

-- A ttl that ends: the record is absent, a claim replaces it.
SELECT 'claim short ttl', outcome FROM idempotency.idem_claim(:'scope', 'k3', 'fp-3', '1 millisecond');
SELECT pg_catalog.pg_sleep(0.05) IS NULL AS slept \gset
SELECT 'lookup expired', pg_catalog.count(*) FROM idempotency.idem_lookup(:'scope', 'k3');
SELECT 'claim over expired', outcome, attempts FROM idempotency.idem_claim(:'scope', 'k3', 'fp-other');

-- Stale claims: taken over, then released.
SELECT 'claim stale a', outcome FROM idempotency.idem_claim(:'scope', 'k4', NULL, NULL, '1 millisecond');
SELECT 'claim stale b', outcome FROM idempotency.idem_claim(:'scope', 'k5', NULL, NULL, '1 millisecond');
SELECT pg_catalog.pg_sleep(0.05) IS NULL AS slept \gset
SELECT 'reclaim take over', scope, key, token IS NOT NULL, attempts, recovery_point
  FROM idempotency.idem_reclaim_stale(10, false) ORDER BY key;
SELECT 'claim stale c', outcome FROM idempotency.idem_claim(:'scope', 'k6', NULL, NULL, '1 millisecond');
SELECT pg_catalog.pg_sleep(0.05) IS NULL AS slept \gset
SELECT 'reclaim release', scope, key, attempts FROM idempotency.idem_reclaim_stale() ORDER BY key;
SELECT 'lookup released', pg_catalog.count(*) FROM idempotency.idem_lookup(:'scope', 'k6');

-- Messages.
SELECT 'seen first', idempotency.idem_seen(:'scope', 'm1');
SELECT 'seen again', idempotency.idem_seen(:'scope', 'm1');
SELECT 'seen other', idempotency.idem_seen(:'scope', 'm2');

-- Sweep: one expired record, one expired message.
SELECT 'claim to expire', outcome FROM idempotency.idem_claim(:'scope', 'k7', NULL, '1 millisecond');
SELECT 'seen to expire', idempotency.idem_seen(:'scope', 'm-exp', '1 millisecond');
SELECT pg_catalog.pg_sleep(0.05) IS NULL AS slept \gset
SELECT 'sweep', idempotency.idem_sweep();
SELECT 'sweep again', idempotency.idem_sweep();
SELECT 'seen after sweep', idempotency.idem_seen(:'scope', 'm-exp');
CALL idempotency.idem_sweep_all(10);
\echo sweep_all state :SQLSTATE

-- Fingerprints (no table).
SELECT 'fingerprint jsonb', idempotency.idem_fingerprint('{"b": 1, "a": [1.0, "x", {"d": null, "c": true}]}'::pg_catalog.jsonb);
SELECT 'fingerprint ignore', idempotency.idem_fingerprint('{"b": 1, "ts": 2}'::pg_catalog.jsonb, '{ts}');
SELECT 'fingerprint bytea', idempotency.idem_fingerprint('\xdeadbeef'::pg_catalog.bytea);
SELECT 'fingerprint null', idempotency.idem_fingerprint(NULL::pg_catalog.jsonb) IS NULL;

-- The stats view, sweep_all and schedule_maintenance (no pg_cron in this database).
SELECT 'stats', in_progress, completed, stale, expired, messages, expired_messages,
       oldest_in_progress_age IS NOT NULL
  FROM idempotency.stats;
SELECT * FROM idempotency.schedule_maintenance();
\echo schedule_maintenance state :SQLSTATE

-- Bad input.
SELECT idempotency.idem_claim(NULL, 'k');
\echo null scope state :SQLSTATE
SELECT idempotency.idem_claim(:'scope', '');
\echo empty key state :SQLSTATE
SELECT idempotency.idem_claim(:'scope', 'k8', NULL, '-1 second');
\echo negative ttl state :SQLSTATE
SELECT idempotency.idem_complete(:'scope', 'k2', :'tok2b', 600);
\echo bad status state :SQLSTATE
SELECT idempotency.idem_sweep(0);
\echo bad max_rows state :SQLSTATE
SELECT idempotency.idem_fingerprint('[1e400]'::pg_catalog.jsonb);
\echo unrepresentable number state :SQLSTATE

-- What is left.
SELECT 'row', scope, key, status, attempts, fingerprint, response_status, recovery_point,
       locked_until IS NULL
  FROM idempotency.keys ORDER BY scope COLLATE pg_catalog."C", key COLLATE pg_catalog."C";
SELECT 'message', scope, message_id FROM idempotency.messages ORDER BY scope COLLATE pg_catalog."C", message_id COLLATE pg_catalog."C";
