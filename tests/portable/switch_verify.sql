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
-- 0.4.0: with tombstones on, the expired completed record answers expired (410) with its status.
SET idempotency.tombstone_ttl = '1 hour';
SELECT outcome || ' ' || http_status || ' ' || response_status FROM idempotency.idem_claim('sw', 'tomb', 'fp');
RESET idempotency.tombstone_ttl;
-- The claim made with a caller's token: the same call again answers claimed, with that token.
SELECT outcome || ' ' || token FROM idempotency.idem_claim('sw', 'mytoken', 'fp', token => '55555555-5555-4555-8555-555555555555');
-- idem_seen_many shares the log: the live id is a duplicate.
SELECT idempotency.idem_seen_many('sw', ARRAY['m-live', 'm-batch'])::text;
-- Row-level security: the other tenant's record is invisible.
SELECT count(*) FROM idempotency.idem_lookup('other', 'hidden');
-- EXECUTE on idem_reclaim_stale stays revoked.
\o /dev/null
SELECT * FROM idempotency.idem_reclaim_stale();
\o
\echo :SQLSTATE
