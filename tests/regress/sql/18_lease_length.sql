-- Leases that keep their length (0.5.0, the contract's third round).
SET search_path = idempotency, public;

-- A NULL lease in idem_checkpoint renews the claim by the lease it was made with.
SELECT token AS t1 FROM idem_claim('acct_lease', 'k-hour', 'fp', lease => '1 hour') \gset
SELECT idem_checkpoint('acct_lease', 'k-hour', :'t1', 'step-1') - now() AS renewed_for;
-- A lease given at a checkpoint is used, and kept by the next checkpoint without one.
SELECT idem_checkpoint('acct_lease', 'k-hour', :'t1', 'step-2', lease => '10 minutes') - now() AS renewed_for;
SELECT idem_checkpoint('acct_lease', 'k-hour', :'t1', 'step-3') - now() AS renewed_for;

-- A claim repeated with its own token after its lease ended, and not taken over: reclaimed,
-- a fresh lease, attempts + 1, the same token.
SELECT outcome, attempts FROM idem_claim('acct_lease', 'k-short', 'fp', lease => '10 milliseconds',
                                         token => '33333333-3333-4333-8333-333333333333');
SELECT pg_sleep(0.05);
SELECT outcome, token, attempts, locked_until > now() AS lease_running
  FROM idem_claim('acct_lease', 'k-short', 'fp', lease => '1 minute',
                  token => '33333333-3333-4333-8333-333333333333');
-- Repeated again while that lease runs: claimed, nothing written.
SELECT outcome, attempts FROM idem_claim('acct_lease', 'k-short', 'fp', lease => '1 minute',
                                         token => '33333333-3333-4333-8333-333333333333');
RESET search_path;
