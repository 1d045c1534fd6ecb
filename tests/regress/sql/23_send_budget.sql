-- The retry budget (0.6.0, docs/sending.md#the-retry-budget): its arithmetic, the one function
-- send_retries_allowed, case by case; the counts it is given, read from
-- idempotency.outbound_budget over the window; then senders and a receiver simulated in real
-- time (a short window) to show both halves: while the receiver fails, retries stay within
-- send_retry_budget x first attempts + 10 over the window; once it answers, a backlog of N sends
-- is sent within max(window / 2, 2 x N / its rate), rising in steps.
SET search_path = idempotency, public;

-- send_retries_allowed(ratio, first_attempts, retries, recent_retries,
-- final_answers_since_failure): bound = floor(ratio * first_attempts + 10); retries + now <=
-- bound + earned over the window and recent_retries + now <= floor(bound / 6) + earned over its
-- last sixth, earned = 2 x final answers since the latest retryable one.
SELECT c.case_, c.ratio, c.firsts, c.retries, c.recent, c.earned,
       send_retries_allowed(c.ratio, c.firsts, c.retries, c.recent, c.earned) AS allowed
  FROM (VALUES
    ('a quiet target: a sixth of the 10, 1',         0.1,   0,   0, 0,   0),
    ('200 first attempts: bound 30, a sixth 5',      0.1, 200,   0, 0,   0),
    ('  10 retries, none recent',                    0.1, 200,  10, 0,   0),
    ('  10 retries, 2 recent',                       0.1, 200,  10, 2,   0),
    ('  the sixth spent',                            0.1, 200,  10, 5,   0),
    ('  the window spent',                           0.1, 200,  30, 0,   0),
    ('  over it (counted before a SET)',             0.1, 200,  45, 0,   0),
    ('  the window spent, 1 final answer since',     0.1, 200,  30, 5,   1),
    ('  the window spent, 4 final answers since',    0.1, 200,  30, 5,   4),
    ('  1000 final answers since',                   0.1, 200,  30, 5, 1000),
    ('budget 0: no retry, whatever was earned',      0.0, 200,   0, 0, 1000),
    ('budget 0.5: bound 110, a sixth 18',            0.5, 200,   0, 0,   0),
    ('a huge budget (1000000)',                  1000000,  40,   0, 0,   0),
    ('counts past any real use stay finite',     1000000, 9000000000000000000, 0, 0, 4000000000000000000)
  ) AS c(case_, ratio, firsts, retries, recent, earned);

-- While nothing is earned, a retry allowed keeps the bound, over the window and over its sixth,
-- whatever the counts (every combination of 0..60 first attempts, retries and recent retries, budgets 0,
-- 0.1, 0.5, 2).
SELECT bool_and(a = 0 OR (r + a <= floor(ratio * f + 10) AND rr + a <= floor(floor(ratio * f + 10) / 6))) AS bound_holds,
       bool_and(a >= 0) AS never_negative
  FROM unnest(ARRAY[0, 0.1, 0.5, 2]::float8[]) AS ratio, generate_series(0, 60, 3) AS f,
       generate_series(0, 60, 3) AS r, generate_series(0, 60, 3) AS rr,
       LATERAL (SELECT send_retries_allowed(ratio, f, r, least(rr, r), 0) AS a) AS x
 WHERE rr <= r;

-- Slow start: after an outage that spent the window (10 retries, 1 in the last sixth) on a
-- quiet target, the probe's answer came back final. Each round hands out what is allowed and
-- every answer is final: 2, 4, 8, 16 ... (the window's old retries not yet expired).
WITH RECURSIVE rounds(round, retries, recent, earned, allowed) AS (
    SELECT 1, 10::bigint, 1::bigint, 1::bigint, send_retries_allowed(0.1, 0, 10, 1, 1)
    UNION ALL
    SELECT round + 1, retries + allowed, recent + allowed, earned + allowed,
           send_retries_allowed(0.1, 0, retries + allowed, recent + allowed, earned + allowed)
      FROM rounds WHERE round < 8
)
SELECT round, allowed FROM rounds;

-- The counts, from idempotency.outbound_budget (one row per backend and bucket of a sixtieth
-- of the window: 1 second by default), through send_retry_allowance(target). A row here is a
-- bucket that starts seconds_ago.
CREATE FUNCTION fixture.budget_row(target text, seconds_ago float8, first_attempts int DEFAULT 0, retries int DEFAULT 0,
                                   final_answers int DEFAULT 0, retryable_answers int DEFAULT 0, backend_pid int DEFAULT 1)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO idempotency.outbound_budget
    VALUES (target, now() - seconds_ago * interval '1 second', backend_pid, first_attempts, retries,
            final_answers, retryable_answers) $$;
BEGIN;
-- 200 first attempts 30 s ago, 12 retries 50 s ago by another backend: bound 30, a sixth 5.
SELECT fixture.budget_row('r', 30, first_attempts => 200), fixture.budget_row('r', 50, retries => 12, backend_pid => 2);
SELECT send_retry_allowance('r') AS allowed;
-- 3 retries 4 s ago (inside the last sixth, 10 s): 2 more.
SELECT fixture.budget_row('r', 4, retries => 3);
SELECT send_retry_allowance('r') AS allowed;
-- Final answers: 40 before a retryable answer earn nothing; 3 after it earn 6; 1 more after a
-- later retryable answer, in a later bucket, earns 2 (the older ones no longer count).
SELECT fixture.budget_row('r', 25, final_answers => 40), fixture.budget_row('r', 20, retryable_answers => 1),
       fixture.budget_row('r', 15, final_answers => 3, backend_pid => 2);
SELECT send_retry_allowance('r') AS allowed;
SELECT fixture.budget_row('r', 12, retryable_answers => 5), fixture.budget_row('r', 2, final_answers => 1, backend_pid => 2);
SELECT send_retry_allowance('r') AS allowed;
-- First attempts count only in buckets inside the window, retries in every bucket that
-- touches it: 100 first attempts and 9 retries 60.5 s ago leave a bound of 10 with 9 spent.
SELECT fixture.budget_row('edge', 60.5, first_attempts => 100, retries => 9);
SELECT send_retry_allowance('edge') AS allowed;
-- With no retryable answer in the window every final answer in it counts.
SELECT fixture.budget_row('q', 30, first_attempts => 50, retries => 14), fixture.budget_row('q', 10, final_answers => 5);
SELECT send_retry_allowance('q') AS allowed;
-- Budget 0: none; a window of 20 s (rows older than 20 s drop out): bound 10, a sixth 1.
SET LOCAL idempotency.send_retry_budget = 0;
SELECT send_retry_allowance('r') AS allowed;
RESET idempotency.send_retry_budget;
SET LOCAL idempotency.send_retry_window = '20 s';
SELECT send_retry_allowance('r') AS allowed;
ROLLBACK;

-- The setting's range: 1 second to 1 day, 22023 otherwise (when SET with the native
-- library loaded, where it is used in the portable edition), nothing written. The first call
-- of idem_send_next loads the native library (a value SET before a session loads it is
-- checked as it loads: a WARNING, and the default).
SELECT count(*) AS taken FROM idem_send_next('nothing-due');
SELECT case_, sqlstate, unchanged FROM fixture.send_cases(
    'window 0.5 s', $$SET LOCAL idempotency.send_retry_window = '0.5 s'; SELECT idem_send_next('budget')$$,
    'window 2 days', $$SET LOCAL idempotency.send_retry_window = '2 days'; SELECT idem_send_next('budget')$$,
    'window -1 min', $$SET LOCAL idempotency.send_retry_window = '-1 min'; SELECT idem_send_next('budget')$$,
    'window soon', $$SET LOCAL idempotency.send_retry_window = 'soon'; SELECT idem_send_next('budget')$$);

-- Senders and a receiver in real time, in this session: one transaction per step, so that
-- now() moves. The window is 3 seconds (buckets of 50 ms, its sixth 0.5 s), the backoff 20 ms
-- to 200 ms. Each tick: `arrivals` new sends; the senders take what is due up to what the
-- receiver can answer by then (`rate` a second, at most a tenth of a second's worth at once:
-- what it did not answer is not saved up); the receiver answers each 201 when up, 503 when
-- down. Every hand-out is logged with its transaction's now(), as the budget counts it.
SET idempotency.send_retry_window = '3 s';
SET idempotency.send_backoff_base = '20 ms';
SET idempotency.send_backoff_cap = '200 ms';
CREATE TABLE fixture.sim_log (at timestamptz, operation text, attempt int, up boolean);
CREATE TABLE fixture.sim_phase (up boolean, started timestamptz, ended timestamptz, backlog bigint, rate int);
CREATE SEQUENCE fixture.sim_seq;
CREATE PROCEDURE fixture.simulate(up boolean, seconds float8, arrivals int, rate int)
LANGUAGE plpgsql AS $$
DECLARE
    v_started timestamptz := clock_timestamp();
    v_last timestamptz := v_started;
    credit float8 := 0;
    r record;
BEGIN
    INSERT INTO fixture.sim_phase
    SELECT up, v_started, NULL, count(*), rate FROM idempotency.outbound WHERE target = 'sim' AND state IN ('pending', 'sending');
    COMMIT;
    WHILE clock_timestamp() < v_started + seconds * interval '1 second' LOOP
        PERFORM idempotency.idem_send('sim', 'op-' || nextval('fixture.sim_seq'), 'sim') FROM generate_series(1, arrivals);
        COMMIT;
        credit := least(credit + rate * extract(epoch FROM clock_timestamp() - v_last), rate / 10.0);
        v_last := clock_timestamp();
        IF credit >= 1 THEN
            INSERT INTO fixture.sim_log
            SELECT now(), t.operation, t.attempt, simulate.up
              FROM idempotency.idem_send_next('sim', least(floor(credit), 10000)::int, '1 minute') AS t;
            COMMIT;
            FOR r IN SELECT o.operation, o.token FROM idempotency.outbound AS o
                      WHERE o.target = 'sim' AND o.state = 'sending' LOOP
                PERFORM idempotency.idem_send_result('sim', r.operation, r.token, CASE WHEN up THEN 201 ELSE 503 END);
                credit := credit - 1;
            END LOOP;
            COMMIT;
        END IF;
        EXIT WHEN up AND arrivals = 0 AND NOT EXISTS (
            SELECT FROM idempotency.outbound WHERE target = 'sim' AND state IN ('pending', 'sending'));
        PERFORM pg_sleep(0.02);
    END LOOP;
    UPDATE fixture.sim_phase AS p SET ended = clock_timestamp() WHERE p.started = v_started;
    COMMIT;
END $$;
-- The receiver down for 4 seconds (more than the window) while about 80 sends a second arrive.
CALL fixture.simulate(false, 4, 2, 100000);
-- Then up, answering 200 a second, no new sends, until the backlog is sent (at most 12 s).
CALL fixture.simulate(true, 12, 0, 200);

-- While it was down: every first attempt was made at once, some retries went out, and at every
-- retry the retries over the 3 s before it (itself included) were within floor(0.1 x the first
-- attempts over them + 10).
SELECT count(*) FILTER (WHERE attempt = 1) = (SELECT count(*) FROM outbound WHERE target = 'sim') AS every_first_attempt,
       count(*) FILTER (WHERE attempt > 1) > 0 AS some_retries
  FROM fixture.sim_log WHERE NOT up;
SELECT bool_and(w.retries <= floor(0.1 * w.firsts + 10)) AS bound_held_while_down
  FROM fixture.sim_log AS l,
       LATERAL (SELECT count(*) FILTER (WHERE x.attempt > 1) AS retries, count(*) FILTER (WHERE x.attempt = 1) AS firsts
                  FROM fixture.sim_log AS x WHERE x.at > l.at - interval '3 s' AND x.at <= l.at) AS w
 WHERE NOT l.up AND l.attempt > 1;
-- Once it answered: every send done, within max(3 s / 2, 2 x backlog / 200) with a margin of 2
-- (the bound the contract gives, docs/sending.md), the retries rising in steps: the first
-- tick that sent any sent few, and it took several ticks.
SELECT bool_and(state = 'done') AS all_done FROM outbound WHERE target = 'sim';
SELECT p.backlog > 100 AS backlog_over_100,
       max(l.at) - p.started <= 2 * greatest(interval '1.5 s', 2 * p.backlog / p.rate::float8 * interval '1 second') AS sent_within_bound,
       (SELECT count(*) FROM fixture.sim_log AS f WHERE f.up AND f.at = min(l.at)) <= 10 AS first_step_small,
       count(DISTINCT l.at) >= 4 AS in_steps
  FROM fixture.sim_phase AS p JOIN fixture.sim_log AS l ON l.up
 WHERE p.up
 GROUP BY p.started, p.backlog, p.rate;
RESET idempotency.send_retry_window;
RESET idempotency.send_backoff_base;
RESET idempotency.send_backoff_cap;
RESET search_path;
