\set s random(1, 100)
SELECT outcome FROM idempotency.idem_claim('r' || :s, 'k')
