-- Settings: idempotency.default_ttl (24h) and idempotency.default_lease (5min), used when
-- idem_claim, idem_checkpoint, idem_seen or idem_reclaim_stale get no ttl or lease.

-- The settings belong to the extension's library, which a session loads on its first
-- idem_* call (nothing needs shared_preload_libraries). Before that, SHOW does not know them.
SELECT * FROM fixture.try('SHOW idempotency.default_ttl');
LOAD 'idempotency';

-- The defaults.
SHOW idempotency.default_ttl;
SHOW idempotency.default_lease;
SELECT expires_at = now() + interval '24 hours' AS ttl_24h, locked_until = now() + interval '5 minutes' AS lease_5min
  FROM idempotency.idem_claim('settings', 'k1');

-- SET for the session: any spelling that interval accepts.
SET idempotency.default_ttl = '1 hour';
SET idempotency.default_lease = 'PT30S';
SHOW idempotency.default_ttl;
SHOW idempotency.default_lease;
SELECT expires_at = now() + interval '1 hour' AS ttl_1h, locked_until = now() + interval '30 seconds' AS lease_30s
  FROM idempotency.idem_claim('settings', 'k2');
-- idem_checkpoint without a lease renews by the setting too.
SELECT token AS tok FROM idempotency.keys WHERE scope = 'settings' AND key = 'k2' \gset
SELECT idempotency.idem_checkpoint('settings', 'k2', :'tok', 'step-1') = now() + interval '30 seconds' AS renewed_30s;
-- idem_seen records the message id for default_ttl.
SELECT idempotency.idem_seen('settings', 'msg-1') AS first_time;
SELECT expires_at = seen_at + interval '1 hour' AS ttl_1h FROM idempotency.messages
 WHERE scope = 'settings' AND message_id = 'msg-1';
-- An explicit ttl or lease argument wins over the setting.
SELECT expires_at = now() + interval '7 days' AS ttl_7d, locked_until = now() + interval '1 minute' AS lease_1min
  FROM idempotency.idem_claim('settings', 'k3', ttl => '7 days', lease => '1 minute');

-- A value that is not a positive interval is refused (22023) and the setting keeps its value.
SELECT * FROM fixture.try($$ SET idempotency.default_ttl = 'garbage' $$);
SELECT * FROM fixture.try($$ SET idempotency.default_ttl = '0' $$);
SELECT * FROM fixture.try($$ SET idempotency.default_ttl = '-1 hour' $$);
SELECT * FROM fixture.try($$ SET idempotency.default_lease = '' $$);
SELECT * FROM fixture.try($$ SET idempotency.default_lease = '1 mon -30 days' $$);
SHOW idempotency.default_ttl;
SHOW idempotency.default_lease;
-- Names under idempotency. other than these two are refused too.
SELECT * FROM fixture.try($$ SET idempotency.default_tll = '1h' $$);

-- SET LOCAL lasts until the end of the transaction.
BEGIN;
SET LOCAL idempotency.default_ttl = '5 minutes';
SHOW idempotency.default_ttl;
SELECT expires_at = now() + interval '5 minutes' AS ttl_5min FROM idempotency.idem_claim('settings', 'k4');
COMMIT;
SHOW idempotency.default_ttl;
SELECT expires_at = now() + interval '1 hour' AS ttl_1h FROM idempotency.idem_claim('settings', 'k5');

-- RESET goes back to the default.
RESET idempotency.default_ttl;
RESET idempotency.default_lease;
SHOW idempotency.default_ttl;
SHOW idempotency.default_lease;

-- Per database (or per role): ALTER DATABASE ... SET applies to new sessions.
DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET idempotency.default_ttl = %L', current_database(), '2 hours'); END $$;
\c
SHOW idempotency.default_ttl;
SELECT expires_at = now() + interval '2 hours' AS ttl_2h FROM idempotency.idem_claim('settings', 'k6');
DO $$ BEGIN EXECUTE format('ALTER DATABASE %I RESET idempotency.default_ttl', current_database()); END $$;
