-- Runs last in the install script, after the functions.

CREATE VIEW idempotency.stats AS
SELECT
    count(*) FILTER (WHERE status = 'in_progress' AND expires_at > now())   AS in_progress,
    count(*) FILTER (WHERE status = 'completed' AND expires_at > now())     AS completed,
    count(*) FILTER (WHERE status = 'in_progress' AND locked_until <= now()
                       AND expires_at > now())                              AS stale,
    count(*) FILTER (WHERE expires_at <= now())                             AS expired,
    now() - min(created_at) FILTER (WHERE status = 'in_progress'
                                      AND expires_at > now())               AS oldest_in_progress_age,
    (SELECT count(*) FROM idempotency.messages WHERE expires_at > now())    AS messages,
    (SELECT count(*) FROM idempotency.messages WHERE expires_at <= now())   AS expired_messages
FROM idempotency.keys;

COMMENT ON VIEW idempotency.stats IS
    'One row for monitoring: live records by status, stale claims (lease ended), expired rows '
    'awaiting idem_sweep, and the age of the oldest in_progress claim.';
