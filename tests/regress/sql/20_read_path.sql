-- The read path (docs/operations.md#read-paths): idem_claim and idem_seen start with a look-up
-- by primary key, read directly from the index and the heap where that answers exactly as the
-- statement through SPI would, and through SPI otherwise. A DEBUG1 line says which, and why.
-- Every case answers the same on both paths; each change to the table is rolled back.
SET idempotency.direct_read = on;
SELECT outcome FROM idempotency.idem_claim('read-path', 'rp-1', 'fp');
SELECT token AS tok FROM idempotency.keys WHERE scope = 'read-path' AND key = 'rp-1' \gset
SELECT idempotency.idem_complete('read-path', 'rp-1', :'tok', 201, '{"id": "rp-1"}') AS completed;
SELECT idempotency.idem_seen('read-path', 'm-1') AS first_delivery;

SET client_min_messages = debug1;
-- The default: a replay, a mismatch, a new key and a duplicate message, each read directly.
SELECT outcome, response_body FROM idempotency.idem_claim('read-path', 'rp-1', 'fp');
SELECT outcome FROM idempotency.idem_claim('read-path', 'rp-1', 'other');
SELECT outcome FROM idempotency.idem_claim('read-path', 'rp-2', 'fp');
SELECT idempotency.idem_seen('read-path', 'm-1') AS duplicate;

-- The setting forces SPI; the answers are the same.
SET idempotency.direct_read = off;
SELECT outcome, response_body FROM idempotency.idem_claim('read-path', 'rp-1', 'fp');
SELECT idempotency.idem_seen('read-path', 'm-1') AS duplicate;
RESET idempotency.direct_read;
SET idempotency.direct_read = on;

-- Row-level security enabled on the table: SPI, which applies the policies (the owner, here,
-- bypasses them).
BEGIN;
SET LOCAL client_min_messages = warning;
ALTER TABLE idempotency.keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE idempotency.messages ENABLE ROW LEVEL SECURITY;
SET LOCAL client_min_messages = debug1;
SELECT outcome FROM idempotency.idem_claim('read-path', 'rp-1', 'fp');
SELECT idempotency.idem_seen('read-path', 'm-1') AS duplicate;
ROLLBACK;

-- A rule on the table: SPI.
BEGIN;
SET LOCAL client_min_messages = warning;
CREATE RULE keys_noop AS ON UPDATE TO idempotency.keys WHERE false DO ALSO NOTHING;
SET LOCAL client_min_messages = debug1;
SELECT outcome FROM idempotency.idem_claim('read-path', 'rp-1', 'fp');
ROLLBACK;

-- A partition whose primary key is not (scope, key): SPI.
BEGIN;
SET LOCAL client_min_messages = warning;
ALTER TABLE idempotency.keys_far DROP CONSTRAINT keys_far_pkey;
CREATE UNIQUE INDEX keys_scope_key ON idempotency.keys_far (scope, key);
SET LOCAL client_min_messages = debug1;
SELECT outcome FROM idempotency.idem_claim('read-path', 'rp-1', 'fp');
ROLLBACK;

-- The table replaced behind the functions' back: the new one is read (directly: it is a plain
-- table with the primary key), and the old one's records are gone from the answers.
BEGIN;
SET LOCAL client_min_messages = warning;
ALTER TABLE idempotency.keys RENAME TO keys_before;
CREATE TABLE idempotency.keys (LIKE idempotency.keys_before INCLUDING ALL, PRIMARY KEY (scope, key));
SET LOCAL client_min_messages = debug1;
SELECT outcome FROM idempotency.idem_claim('read-path', 'rp-1', 'fp');
ROLLBACK;

RESET client_min_messages;
-- After every rollback, the direct read again, and nothing changed.
SELECT outcome FROM idempotency.idem_claim('read-path', 'rp-1', 'fp');
SELECT count(*) AS records FROM idempotency.keys WHERE scope = 'read-path';
RESET idempotency.direct_read;
