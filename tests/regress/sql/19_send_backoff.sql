-- Backoff (0.5.0, docs/sending.md#backoff): after a retryable answer at attempt k, the send is
-- due again after a delay within full jitter's bounds, [0, least(cap, base * 2^(k-1))], and
-- spread across them (not all at the cap, not all at zero). 300 sends, attempts 1 to 6, base
-- 1 s, cap 10 s; the budget set out of the way (the budget's own arithmetic: 17_send).
SET search_path = idempotency, public;
BEGIN;
SET LOCAL idempotency.send_backoff_base = '1 second';
SET LOCAL idempotency.send_backoff_cap = '10 seconds';
SET LOCAL idempotency.send_retry_budget = 1000;
SELECT count(*) AS prepared
  FROM generate_series(1, 300) AS i, LATERAL idem_send('backoff', 'op-' || i, 'backoff-target') AS s;
CREATE TEMP TABLE delays (attempt int, delay float8);
DO $$
DECLARE
    k int;
    r record;
BEGIN
    FOR k IN 1 .. 6 LOOP
        FOR r IN SELECT * FROM idempotency.idem_send_next('backoff-target', 300, '1 minute') LOOP
            INSERT INTO delays
            SELECT r.attempt, extract(epoch FROM s.next_attempt_at - now())::float8
              FROM idempotency.idem_send_result('backoff', r.operation, r.token, 503) AS s;
        END LOOP;
        -- Due again at once (within this transaction's now()), for the next attempt.
        UPDATE idempotency.outbound SET next_attempt_at = now() WHERE scope = 'backoff';
    END LOOP;
END
$$;
SELECT attempt, count(*) AS sends, least(10, 2 ^ (attempt - 1))::int AS bound_s,
       bool_and(delay >= 0 AND delay <= least(10, 2 ^ (attempt - 1))) AS within_bounds,
       min(delay) < 0.25 * least(10, 2 ^ (attempt - 1)) AS some_in_the_lowest_quarter,
       max(delay) > 0.75 * least(10, 2 ^ (attempt - 1)) AS some_in_the_highest_quarter,
       count(DISTINCT delay) > 250 AS spread
  FROM delays GROUP BY attempt ORDER BY attempt;
-- A Retry-After longer than the backoff is kept as the delay.
SELECT scope AS s, operation AS o, token AS t FROM idem_send_next('backoff-target', 1, '1 minute') \gset
SELECT next_attempt_at - now() AS delay
  FROM idem_send_result(:'s', :'o', :'t', 429, retry_after => '1 hour');
ROLLBACK;
