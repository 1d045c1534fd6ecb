SELECT count(*) FROM (SELECT idempotency.idem_complete('r' || i, 'k', (idempotency.idem_claim('r' || i, 'k')).token, 200, '{"ok": true}') FROM generate_series(1, 100) i) s;
