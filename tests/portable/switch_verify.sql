-- After a switch, as the role idem_app: what switch_fixture.sql made behaves as before.
-- One line per answer (expected/switch_verify.txt).
\set ON_ERROR_STOP 0
-- The completed record replays, with its headers.
SELECT outcome || ' ' || http_status || ' ' || response_headers::text FROM idempotency.idem_claim('sw', 'done', 'fp');
-- The claim in flight kept its token: its owner completes it.
SELECT count(*) FROM (SELECT idempotency.idem_complete('sw', 'inflight', (SELECT token FROM public.switch_tokens WHERE key = 'inflight'), 200)) AS c;
SELECT outcome || ' ' || http_status FROM idempotency.idem_claim('sw', 'inflight', 'fp');
-- The stale claim is taken over from its checkpoint (none) with attempts 2; its old token is fenced off.
SELECT outcome || ' ' || attempts FROM idempotency.idem_claim('sw', 'stale', 'fp');
\o /dev/null
SELECT idempotency.idem_complete('sw', 'stale', (SELECT token FROM public.switch_tokens WHERE key = 'stale'), 200);
\o
\echo :SQLSTATE
-- The expired record is as good as absent.
SELECT outcome || ' ' || attempts FROM idempotency.idem_claim('sw', 'expired', 'fp');
-- Message ids: a live one is a duplicate, an expired one is new.
SELECT idempotency.idem_seen('sw', 'm-live') || ' ' || idempotency.idem_seen('sw', 'm-old');
-- Row-level security: the other tenant's record is invisible.
SELECT count(*) FROM idempotency.idem_lookup('other', 'hidden');
-- EXECUTE on idem_reclaim_stale stays revoked.
\o /dev/null
SELECT * FROM idempotency.idem_reclaim_stale();
\o
\echo :SQLSTATE
