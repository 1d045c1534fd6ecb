\set s random(1, 1000)
\set k random(1, 2000000000)
SELECT token FROM idempotency.idem_claim('t' || :s, 'k' || :k) \gset
SELECT idempotency.idem_complete('t' || :s, 'k' || :k, :token, 201, '{"ok": true}')
