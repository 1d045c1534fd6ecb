-- Records of every kind, grants and row-level security, for the switch between editions
-- (run.sh section switch), made through the contract functions, so it runs on either
-- edition. Run as a superuser; switch_verify.sql checks them as the role idem_app.
SET client_min_messages = warning;
GRANT USAGE ON SCHEMA idempotency TO idem_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency.keys, idempotency.messages TO idem_app;
GRANT SELECT ON idempotency.stats TO idem_app;
-- Housekeeping is not for the application role.
REVOKE EXECUTE ON FUNCTION idempotency.idem_reclaim_stale(int, boolean, interval) FROM PUBLIC;
-- The application sees the scopes starting with "sw" only.
ALTER TABLE idempotency.keys ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS app_scopes ON idempotency.keys;
CREATE POLICY app_scopes ON idempotency.keys TO idem_app USING (scope LIKE 'sw%');

CREATE TABLE IF NOT EXISTS public.switch_tokens (key text PRIMARY KEY, token uuid);
GRANT SELECT ON public.switch_tokens TO idem_app;
TRUNCATE public.switch_tokens;

-- Live and completed; in progress under a long lease (its owner still works on it); in
-- progress with an ended lease; expired; another tenant's; message ids live and expired.
SELECT token AS tok FROM idempotency.idem_claim('sw', 'done', 'fp') \gset
SELECT idempotency.idem_complete('sw', 'done', :'tok', 201, '{"id": 7}', '{"Location": "/things/7"}');
INSERT INTO public.switch_tokens SELECT 'inflight', token FROM idempotency.idem_claim('sw', 'inflight', 'fp', lease => '1 hour');
SELECT idempotency.idem_checkpoint('sw', 'inflight', (SELECT token FROM public.switch_tokens WHERE key = 'inflight'), 'step-1', '{"n": 1}', '1 hour');
INSERT INTO public.switch_tokens SELECT 'stale', token FROM idempotency.idem_claim('sw', 'stale', 'fp', lease => '1 millisecond');
SELECT idempotency.idem_claim('sw', 'expired', 'fp', ttl => '1 millisecond');
SELECT idempotency.idem_claim('other', 'hidden');
-- 0.4.0: a completed record that expired (a tombstone once idempotency.tombstone_ttl is
-- on), and a claim made with the caller's token.
SELECT token AS tok FROM idempotency.idem_claim('sw', 'tomb', 'fp') \gset
SELECT idempotency.idem_complete('sw', 'tomb', :'tok', 201, '{"id": 8}');
UPDATE idempotency.keys SET expires_at = now() - interval '1 second' WHERE scope = 'sw' AND key = 'tomb';
SELECT idempotency.idem_claim('sw', 'mytoken', 'fp', lease => '1 hour', token => '55555555-5555-4555-8555-555555555555');
SELECT idempotency.idem_seen('sw', 'm-live'), idempotency.idem_seen('sw', 'm-old', ttl => '1 millisecond');
SELECT pg_sleep(0.05);
