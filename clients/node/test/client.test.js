// The client against the real extension: each outcome, each error class, seen / seenMany, the
// fingerprint equal to idem_fingerprint.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import pg from 'pg';
import {
  AlreadyCompletedError, ClaimTakenOverError, IdempotencyClient, InvalidArgumentError, LockTimeoutError,
  NoLiveRecordError, NullArgumentError, Outcome, PermissionDeniedError, ReadOnlyError, ResponseTooLargeError,
  SerializationError, UnsupportedFeatureError, fingerprint,
} from '../src/index.js';
import { DATABASE_URL, newKey, newPool, sleep } from './harness.js';

const pool = newPool();
const idem = new IdempotencyClient(pool);
after(() => pool.end());
const scope = () => 'client-test:' + newKey();

async function withClient(fn) {
  const db = new pg.Client({ connectionString: DATABASE_URL });
  await db.connect();
  try {
    return await fn(db);
  } finally {
    await db.end();
  }
}

test('claimed, then replay of the stored response', async () => {
  const s = scope();
  const c = await idem.claim(s, 'k', { fingerprint: 'fp-1' });
  assert.equal(c.outcome, Outcome.CLAIMED);
  assert.match(c.token, /^[0-9a-f-]{36}$/);
  assert.equal(c.attempts, 1);
  assert.ok(c.expiresAt instanceof Date);
  const stored = await idem.complete(s, 'k', c.token, 201, { body: { id: 'x', n: 1 }, headers: { Location: '/x' } });
  assert.equal(stored, '{"n": 1, "id": "x"}', 'jsonb prints keys by length, then bytes');
  const r = await idem.claim(s, 'k', { fingerprint: 'fp-1' });
  assert.equal(r.outcome, Outcome.REPLAY);
  assert.equal(r.httpStatus, 201);
  assert.equal(r.responseStatus, 201);
  assert.deepEqual(r.responseBody, { id: 'x', n: 1 });
  assert.equal(r.responseBodyText, stored);
  assert.deepEqual(r.responseHeaders, { Location: '/x' });
  assert.equal(r.token, null);
});

test('in_progress with the lease end, mismatch, and reclaimed after the lease ends with the checkpoint', async () => {
  const s = scope();
  const c = await idem.claim(s, 'k', { fingerprint: 'fp', lease: 400 });
  await idem.checkpoint(s, 'k', c.token, 'step-1', { data: { done: 1 }, lease: 400 });
  const busy = await idem.claim(s, 'k', { fingerprint: 'fp' });
  assert.equal(busy.outcome, Outcome.IN_PROGRESS);
  assert.equal(busy.httpStatus, 409);
  assert.equal(busy.retryAfterSeconds, 1);
  assert.ok(busy.lockedUntil instanceof Date);
  const other = await idem.claim(s, 'k', { fingerprint: 'other' });
  assert.equal(other.outcome, Outcome.MISMATCH);
  assert.equal(other.httpStatus, 422);
  await sleep(500);
  const again = await idem.claim(s, 'k', { fingerprint: 'fp', lease: 5000 });
  assert.equal(again.outcome, Outcome.RECLAIMED);
  assert.equal(again.attempts, 2);
  assert.notEqual(again.token, c.token);
  assert.equal(again.recoveryPoint, 'step-1');
  assert.deepEqual(again.recoveryData, { done: 1 });
  // The old owner is fenced.
  await assert.rejects(idem.complete(s, 'k', c.token, 200), ClaimTakenOverError);
  await assert.rejects(idem.checkpoint(s, 'k', c.token, 'step-2'), (e) => e instanceof ClaimTakenOverError && e.code === 'IK002');
  assert.equal(await idem.release(s, 'k', c.token), false);
  assert.equal(await idem.release(s, 'k', again.token), true);
  assert.equal(await idem.lookup(s, 'k'), null);
});

test('lookup returns the live record', async () => {
  const s = scope();
  const c = await idem.claim(s, 'k', { fingerprint: 'fp', ttl: '1 hour' });
  const rec = await idem.lookup(s, 'k');
  assert.equal(rec.status, 'in_progress');
  assert.equal(rec.token, c.token);
  assert.equal(rec.fingerprint, 'fp');
  await idem.complete(s, 'k', c.token, 200, { bodyJson: '"text"' });
  const done = await idem.lookup(s, 'k');
  assert.equal(done.status, 'completed');
  assert.equal(done.responseBody, 'text');
});

test('expired (tombstones): needs release 0.4.0', async (t) => {
  const { rows } = await pool.query(`SELECT current_setting('idempotency.tombstone_ttl', true) AS v`);
  if (rows[0].v === null) return t.skip('the installed extension has no tombstones (idempotency.tombstone_ttl, release 0.4.0)');
  await withClient(async (db) => {
    const c = new IdempotencyClient(db);
    await db.query(`SET idempotency.tombstone_ttl = '1 hour'`);
    const s = scope();
    const first = await c.claim(s, 'k', { ttl: 300 });
    await c.complete(s, 'k', first.token, 201, { body: {} });
    await sleep(400);
    const r = await c.claim(s, 'k');
    assert.equal(r.outcome, Outcome.EXPIRED);
    assert.equal(r.httpStatus, 410);
  });
});

test('error classes: 22004, 22023, IK001, IK003, 54000', async () => {
  const s = scope();
  await assert.rejects(idem.claim(s, null), (e) => e instanceof NullArgumentError && e.code === '22004');
  await assert.rejects(idem.claim(s, ''), (e) => e instanceof InvalidArgumentError && e.code === '22023');
  await assert.rejects(idem.claim(s, 'k'.repeat(256)), InvalidArgumentError);
  await assert.rejects(idem.claim(s, 'k', { lease: -1 }), InvalidArgumentError);
  await assert.rejects(idem.complete(s, 'never', '00000000-0000-0000-0000-000000000000', 200), (e) => e instanceof NoLiveRecordError && e.code === 'IK001');
  const c = await idem.claim(s, 'k');
  await assert.rejects(idem.complete(s, 'k', c.token, 99), InvalidArgumentError);
  await idem.complete(s, 'k', c.token, 200);
  await assert.rejects(idem.complete(s, 'k', c.token, 200), (e) => e instanceof AlreadyCompletedError && e.code === 'IK003');
  await withClient(async (db) => {
    await db.query(`SET idempotency.max_response_size = '1kB'`);
    const c2 = new IdempotencyClient(db);
    const own = await c2.claim(s, 'big');
    await assert.rejects(c2.complete(s, 'big', own.token, 200, { body: 'x'.repeat(4096) }), (e) => e instanceof ResponseTooLargeError && e.code === '54000');
  });
});

test('error classes: 25006 read-only, 55P03 lock_timeout, 40001 serialization, 42501 permission', async () => {
  const s = scope();
  await withClient(async (db) => {
    await db.query('BEGIN READ ONLY');
    await assert.rejects(new IdempotencyClient(db).claim(s, 'k'), (e) => e instanceof ReadOnlyError && e.code === '25006');
    await db.query('ROLLBACK');
  });
  await withClient((a) => withClient(async (b) => {
    await a.query('BEGIN');
    await new IdempotencyClient(a).claim(s, 'locked');
    await b.query('BEGIN');
    await b.query(`SET LOCAL lock_timeout = '100ms'`);
    await assert.rejects(new IdempotencyClient(b).claim(s, 'locked'), (e) => e instanceof LockTimeoutError && e.code === '55P03');
    await b.query('ROLLBACK');
    await a.query('ROLLBACK');
    // REPEATABLE READ: a claim that meets a row its snapshot cannot see.
    await a.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
    await a.query('SELECT 1');
    await idem.claim(s, 'rr');
    await assert.rejects(new IdempotencyClient(a).claim(s, 'rr'), (e) => e instanceof SerializationError && e.code === '40001');
    await a.query('ROLLBACK');
  }));
  await pool.query(`DO $$ BEGIN CREATE ROLE idem_node_nobody NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$`);
  await withClient(async (db) => {
    await db.query('SET ROLE idem_node_nobody');
    await assert.rejects(new IdempotencyClient(db).claim(s, 'k'), (e) => e instanceof PermissionDeniedError && e.code === '42501');
  });
});

test('seen: true the first time, false for a redelivery', async () => {
  const s = scope();
  assert.equal(await idem.seen(s, 'm-1'), true);
  assert.equal(await idem.seen(s, 'm-1'), false);
  assert.equal(await idem.seen(s, 'm-2', { ttl: '1 hour' }), true);
  await assert.rejects(idem.seen(s, null), NullArgumentError);
});

test('seenMany where the extension has it (release 0.4.0), UnsupportedFeatureError otherwise', async (t) => {
  const s = scope();
  if (!(await idem.features()).seenMany) {
    await assert.rejects(idem.seenMany(s, ['m-1']), UnsupportedFeatureError);
    return t.skip('the installed extension has no idem_seen_many (release 0.4.0)');
  }
  assert.equal(await idem.seen(s, 'm-1'), true);
  assert.deepEqual(await idem.seenMany(s, ['m-1', 'm-2', 'm-2']), [false, true, false]);
  assert.deepEqual(await idem.seenMany(s, []), []);
});

test('fingerprint(): RFC 8785 in JavaScript equals idem_fingerprint in the database', async () => {
  const payloads = [
    { amount: 500, currency: 'eur' },
    { b: 1, a: 2 },
    { a: 2, b: 1.0 },
    { nested: { z: [1, 2.5, -0, 1e21, 1e-7, 123456789012345680000], y: null, x: true }, s: 'é\u2028\n"\\', emoji: '😀' },
    [3, 'x', { '\u00e9': 1, e: 2, '\ud83d\ude00': 3 }],
    'just a string',
    42.125,
  ];
  for (const p of payloads) assert.equal(fingerprint(p), await idem.fingerprint(p), JSON.stringify(p));
  const withNote = { amount: 500, currency: 'eur', note: 'ignored', trace: 1 };
  assert.equal(fingerprint(withNote, ['note', 'trace']), await idem.fingerprint(withNote, ['note', 'trace']));
  assert.equal(fingerprint(withNote, ['note', 'trace']), fingerprint({ currency: 'eur', amount: 500 }));
});

test('features are looked up once per client and shared by on(db)', async () => {
  const c = new IdempotencyClient(pool);
  const f = await c.features();
  assert.equal(typeof f.wait, 'boolean');
  assert.equal(c.on({ query: () => assert.fail('not asked again') }).shared.features, c.shared.features);
});
