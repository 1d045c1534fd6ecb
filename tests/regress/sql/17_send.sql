-- The sending side (0.5.0, docs/sending.md): idem_send records a send in the caller's
-- transaction, idem_send_next hands due sends to a sender under a lease, idem_send_result
-- records what an attempt got. Errors show as SQLSTATE and message (fixture.cases) and
-- whether the outbound record is unchanged.
SET search_path = idempotency, public;
CREATE FUNCTION fixture.outbound_digest() RETURNS text LANGUAGE sql AS $$
    SELECT md5(concat((SELECT string_agg(o::text, ';' ORDER BY o.scope, o.operation) FROM idempotency.outbound o), '#',
                      (SELECT string_agg(b::text, ';' ORDER BY b.target, b.bucket, b.backend_pid) FROM idempotency.outbound_budget b))) $$;
CREATE FUNCTION fixture.send_cases(VARIADIC c text[]) RETURNS TABLE(case_ text, sqlstate text, message text, unchanged boolean)
LANGUAGE plpgsql AS $$
DECLARE
    i int;
    before text;
    code text;
    msg text;
BEGIN
    FOR i IN 1 .. array_length(c, 1) BY 2 LOOP
        before := fixture.outbound_digest();
        code := '00000';
        msg := '(no error)';
        BEGIN
            EXECUTE c[i + 1];
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
        END;
        case_ := c[i];
        sqlstate := code;
        message := msg;
        unchanged := fixture.outbound_digest() = before;
        RETURN NEXT;
    END LOOP;
END $$;

-- idem_send in the business transaction: a new random UUID as the key, pending, due at once.
BEGIN;
SELECT key ~ '^[0-9a-f-]{36}$' AS uuid_key, state, attempts, next_attempt_at = now() AS due_now,
       response_status, response_body, response_headers
  FROM idem_send('shop', 'order-1:charge', 'gateway', '{"order": "order-1", "amount": 500}');
SELECT key AS key1 FROM outbound WHERE operation = 'order-1:charge' \gset
-- The same call again (a retry of the business transaction's code): the same row, nothing written.
SELECT fixture.outbound_digest() AS before \gset
SELECT key = :'key1' AS same_key, state FROM idem_send('shop', 'order-1:charge', 'gateway', '{"amount": 500, "order": "order-1"}');
SELECT fixture.outbound_digest() = :'before' AS nothing_written;
COMMIT;
SELECT give_up_at - created_at AS give_up_after, request_fingerprint = idem_fingerprint('{"order": "order-1", "amount": 500}'::jsonb) AS fingerprinted
  FROM outbound WHERE operation = 'order-1:charge';

-- A rollback forgets the send and its key, with the business write.
BEGIN;
SELECT state FROM idem_send('shop', 'order-rolled-back:charge', 'gateway', '{"amount": 1}');
ROLLBACK;
SELECT count(*) AS rolled_back_rows FROM outbound WHERE operation = 'order-rolled-back:charge';

-- A key and give_up_after of the caller's own; no request.
SELECT key, state FROM idem_send('shop', 'order-2:charge', 'gateway', key => 'k-order-2', give_up_after => '2 hours');
SELECT give_up_at - created_at AS give_up_after FROM outbound WHERE operation = 'order-2:charge';

-- Another request, target or key for a recorded operation: IK004, nothing written.
SELECT * FROM fixture.send_cases(
    'other request', $$SELECT idem_send('shop', 'order-1:charge', 'gateway', '{"order": "order-1", "amount": 999}')$$,
    'other target',  $$SELECT idem_send('shop', 'order-1:charge', 'other-gateway', '{"order": "order-1", "amount": 500}')$$,
    'other key',     $$SELECT idem_send('shop', 'order-2:charge', 'gateway', key => 'k-other')$$,
    'no key given',  $$SELECT idem_send('shop', 'order-2:charge', 'gateway')$$);

-- Bad input: 22004 for a NULL, 22023 for a bad value, nothing written.
SELECT * FROM fixture.send_cases(
    'null scope',        $$SELECT idem_send(NULL, 'op', 'gateway')$$,
    'null operation',    $$SELECT idem_send('shop', NULL, 'gateway')$$,
    'null target',       $$SELECT idem_send('shop', 'op', NULL)$$,
    'empty operation',   $$SELECT idem_send('shop', '', 'gateway')$$,
    'long target',       $$SELECT idem_send('shop', 'op', repeat('t', 256))$$,
    'control key',       $$SELECT idem_send('shop', 'op', 'gateway', key => E'k\n1')$$,
    'zero give_up',      $$SELECT idem_send('shop', 'op', 'gateway', give_up_after => '0 s')$$,
    'negative give_up',  $$SELECT idem_send('shop', 'op', 'gateway', give_up_after => '-1 hour')$$,
    'null max_rows',     $$SELECT idem_send_next('gateway', NULL)$$,
    'zero max_rows',     $$SELECT idem_send_next('gateway', 0)$$,
    'huge max_rows',     $$SELECT idem_send_next('gateway', 10001)$$,
    'negative lease',    $$SELECT idem_send_next('gateway', 1, '-5 s')$$,
    'scope, no op',      $$SELECT idem_send_next(scope => 'shop')$$,
    'empty target',      $$SELECT idem_send_next('')$$,
    'result null token', $$SELECT idem_send_result('shop', 'order-1:charge', NULL, 201)$$,
    'result status 99',  $$SELECT idem_send_result('shop', 'order-1:charge', gen_random_uuid(), 99)$$,
    'result status 600', $$SELECT idem_send_result('shop', 'order-1:charge', gen_random_uuid(), 600)$$,
    'result headers []', $$SELECT idem_send_result('shop', 'order-1:charge', gen_random_uuid(), 201, response_headers => '[]')$$,
    'retry_after < 0',   $$SELECT idem_send_result('shop', 'order-1:charge', gen_random_uuid(), 503, retry_after => '-1 s')$$,
    'unknown operation', $$SELECT idem_send_result('shop', 'order-404:charge', gen_random_uuid(), 201)$$,
    'not handed out',    $$SELECT idem_send_result('shop', 'order-1:charge', gen_random_uuid(), 201)$$);

-- A sender takes the due sends: first attempts, due-first, each under a lease with a fresh token.
SELECT scope, operation, target, key = :'key1' OR key = 'k-order-2' AS its_key, request, attempt,
       token IS NOT NULL AS has_token, locked_until - now() AS lease, give_up_at > now() AS before_give_up
  FROM idem_send_next('gateway', 10, '30 seconds');
SELECT operation, state, attempts, next_attempt_at = locked_until AS due_when_lease_ends
  FROM outbound ORDER BY operation;
-- Held rows are not handed out again.
SELECT count(*) AS handed_out_again FROM idem_send_next('gateway', 10);

-- The receiver answers 503 with Retry-After: back to pending, not before retry_after.
SELECT token AS token1 FROM outbound WHERE operation = 'order-1:charge' \gset
SELECT state, attempts, next_attempt_at >= now() + interval '20 seconds' AS not_before_retry_after
  FROM idem_send_result('shop', 'order-1:charge', :'token1', 503, retry_after => '20 seconds', error => 'busy');
SELECT last_status, last_error, token IS NULL AS lease_dropped FROM outbound WHERE operation = 'order-1:charge';
-- The old token is done with it: IK002.
SELECT * FROM fixture.send_cases(
    'stale token', format($$SELECT idem_send_result('shop', 'order-1:charge', %L, 201)$$, :'token1'));

-- A final answer (4xx included): done, the response stored; again with the same token: IK003.
SELECT token AS token2 FROM outbound WHERE operation = 'order-2:charge' \gset
SELECT state, attempts FROM idem_send_result('shop', 'order-2:charge', :'token2', 422,
                                             '{"error": "card declined"}', '{"content-type": "application/json"}');
SELECT state, response_status, response_body, response_headers, finished_at IS NOT NULL AS finished,
       expires_at - finished_at AS kept_for
  FROM outbound WHERE operation = 'order-2:charge';
SELECT * FROM fixture.send_cases(
    'done twice', format($$SELECT idem_send_result('shop', 'order-2:charge', %L, 201)$$, :'token2'));
-- idem_send for a done operation answers with its stored response.
SELECT key, state, attempts, response_status, response_body FROM idem_send('shop', 'order-2:charge', 'gateway', key => 'k-order-2');

-- Which statuses are retried: no answer, 408, 409, 425, 429, 500, 502, 503, 504.
INSERT INTO outbound (scope, operation, key, target, state, attempts, next_attempt_at, give_up_at, created_at, token, locked_until)
SELECT 'codes', s::text, 'k-' || s, 'codes', 'sending', 1, now(), now() + interval '1 day', now(),
       '00000000-0000-4000-8000-000000000001', now() + interval '1 minute'
  FROM unnest(ARRAY[200, 201, 204, 301, 400, 404, 408, 409, 410, 422, 425, 429, 500, 501, 502, 503, 504, 599]) AS s;
SELECT s AS http_status, r.state
  FROM unnest(ARRAY[200, 201, 204, 301, 400, 404, 408, 409, 410, 422, 425, 429, 500, 501, 502, 503, 504, 599]) AS s,
       idem_send_result('codes', s::text, '00000000-0000-4000-8000-000000000001', s) AS r;
INSERT INTO outbound (scope, operation, key, target, state, attempts, next_attempt_at, give_up_at, created_at, token, locked_until)
VALUES ('codes', 'no answer', 'k-none', 'codes', 'sending', 1, now(), now() + interval '1 day', now(),
        '00000000-0000-4000-8000-000000000001', now() + interval '1 minute');
SELECT r.state, o.last_status, o.last_error FROM idem_send_result('codes', 'no answer', '00000000-0000-4000-8000-000000000001',
                                                             error => 'connection refused') AS r,
       outbound AS o WHERE o.scope = 'codes' AND o.operation = 'no answer';

-- A retry whose backoff would end past give_up_at: gave_up, the outcome unknown.
INSERT INTO outbound (scope, operation, key, target, state, attempts, next_attempt_at, give_up_at, created_at, token, locked_until)
VALUES ('late', 'op', 'k-late', 'late', 'sending', 1, now(), now() + interval '1 second', now(),
        '00000000-0000-4000-8000-000000000002', now() + interval '1 minute');
SELECT state FROM idem_send_result('late', 'op', '00000000-0000-4000-8000-000000000002', 503, retry_after => '1 minute');
-- A due row past give_up_at is not handed out: it becomes gave_up.
INSERT INTO outbound (scope, operation, key, target, state, attempts, next_attempt_at, give_up_at, created_at)
VALUES ('late', 'due-after-give-up', 'k-late-2', 'late', 'pending', 2, now() - interval '1 minute', now() - interval '1 second', now());
SELECT count(*) AS handed_out FROM idem_send_next('late', 10);
SELECT operation, state, finished_at IS NOT NULL AS finished FROM outbound WHERE scope = 'late' ORDER BY operation;

-- A lease that ended without a result (the sender died): handed out again, attempt + 1, a
-- new token; the old token is refused.
SELECT state FROM idem_send('shop', 'order-3:charge', 'lease-test', '{"amount": 3}');
SELECT attempt, token AS old_token FROM idem_send_next('lease-test', 1, '10 milliseconds') \gset
SELECT pg_sleep(0.05);
SELECT attempt, token <> :'old_token' AS new_token FROM idem_send_next('lease-test', 1, '1 minute');
SELECT last_error FROM outbound WHERE operation = 'order-3:charge';
SELECT * FROM fixture.send_cases(
    'old owner', format($$SELECT idem_send_result('shop', 'order-3:charge', %L, 201)$$, :'old_token'));

-- The inline path: scope and operation name the one send (due and not held), else nothing.
SELECT state FROM idem_send('shop', 'order-4:charge', 'inline', '{"amount": 4}');
SELECT state FROM idem_send('shop', 'order-5:charge', 'inline', '{"amount": 5}');
SELECT operation, attempt FROM idem_send_next(scope => 'shop', operation => 'order-5:charge');
SELECT count(*) AS held FROM idem_send_next(scope => 'shop', operation => 'order-5:charge');
SELECT count(*) AS unknown FROM idem_send_next(scope => 'shop', operation => 'order-404:charge');
SELECT operation, state FROM outbound WHERE target = 'inline' ORDER BY operation;

-- The retry budget: first attempts always; retries while the receiver fails within
-- ratio * first attempts + 10 over the window (a minute), a sixth of that over its last sixth,
-- per target (23_send_budget: its arithmetic, and what final answers earn).
SET idempotency.send_retry_budget = 0.5;
INSERT INTO outbound (scope, operation, key, target, state, attempts, next_attempt_at, give_up_at, created_at)
SELECT 'budget', 'first-' || i, 'kf-' || i, 'budget', 'pending', 0, now() - interval '1 second', now() + interval '1 day', now()
  FROM generate_series(1, 20) AS i;
INSERT INTO outbound (scope, operation, key, target, state, attempts, next_attempt_at, give_up_at, created_at)
SELECT 'budget', 'retry-' || i, 'kr-' || i, 'budget', 'pending', 1, now() - interval '2 seconds', now() + interval '1 day', now()
  FROM generate_series(1, 40) AS i;
-- 20 first attempts (handed out first although the retries are due earlier), then
-- floor(floor(0.5 * 20 + 10) / 6) = 3 retries; the other 37 retries wait.
SELECT count(*) FILTER (WHERE attempt = 1) AS first_attempts, count(*) FILTER (WHERE attempt > 1) AS retries
  FROM idem_send_next('budget', 100);
SELECT sum(first_attempts) AS counted_first, sum(retries) AS counted_retries FROM outbound_budget WHERE target = 'budget';
SELECT count(*) AS still_due FROM outbound WHERE target = 'budget' AND state = 'pending';
-- Budget 0: no retry at all, first attempts still.
SET idempotency.send_retry_budget = 0;
INSERT INTO outbound (scope, operation, key, target, state, attempts, next_attempt_at, give_up_at, created_at)
VALUES ('budget', 'first-21', 'kf-21', 'budget', 'pending', 0, now(), now() + interval '1 day', now());
SELECT count(*) FILTER (WHERE attempt = 1) AS first_attempts, count(*) FILTER (WHERE attempt > 1) AS retries
  FROM idem_send_next('budget', 100);
RESET idempotency.send_retry_budget;

-- The settings: bad values are refused (when SET once the library is loaded; the portable
-- edition where they are used), 22023 either way (the messages differ between the editions).
SELECT case_, sqlstate, unchanged FROM fixture.send_cases(
    'budget -1',       $$SET LOCAL idempotency.send_retry_budget = -1; SELECT idem_send_next('budget')$$,
    'base 0',          $$SET LOCAL idempotency.send_backoff_base = '0'; SELECT idem_send_result('shop', 'order-1:charge', gen_random_uuid(), 503)$$,
    'cap not interval', $$SET LOCAL idempotency.send_backoff_cap = 'soon'; SELECT idem_send_result('shop', 'order-1:charge', gen_random_uuid(), 503)$$,
    'give_up -1h',     $$SET LOCAL idempotency.send_give_up_after = '-1 hour'; SELECT idem_send('shop', 'op-bad-setting', 'gateway')$$);

-- stats counts the sends by state; idem_sweep deletes finished ones past expires_at.
SELECT outbound_pending, outbound_sending, outbound_done, outbound_gave_up FROM stats;
UPDATE outbound SET expires_at = now() - interval '1 second' WHERE state IN ('done', 'gave_up') AND scope = 'codes';
SELECT idem_sweep() AS swept;
SELECT count(*) AS codes_left FROM outbound WHERE scope = 'codes';
RESET search_path;
