// The sender (src/sender.js) against the real extension and a real HTTP receiver (a node:http
// server here that answers from a script and logs every request's Idempotency-Key).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import http from 'node:http';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';
import pg from 'pg';
import { MAX_RETRY_AFTER_MS, Sender, keyHeader, parseRetryAfter, prepare } from '../src/index.js';
import { DATABASE_URL, newPool } from './harness.js';

const pool = newPool();
after(() => pool.end());
const DEMO = fileURLToPath(new URL('../demo/send-demo.js', import.meta.url));

before(async () => {
  // Quick retries for these tests: the database's default, which every new session reads.
  const db = (await pool.query('SELECT current_database() AS d')).rows[0].d;
  await pool.query(`ALTER DATABASE "${db}" SET idempotency.send_backoff_base = '50ms'`);
  await pool.query(`ALTER DATABASE "${db}" SET idempotency.send_backoff_cap = '200ms'`);
  await pool.query('SELECT pg_reload_conf()');
});

async function receiver(script = [[201, {}]]) {
  const log = [];
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => { body += c; });
    req.on('end', () => {
      log.push({ key: req.headers['idempotency-key'], body });
      const [status, headers] = script[Math.min(log.length, script.length) - 1];
      res.writeHead(status, { 'content-type': 'application/json', ...headers });
      res.end(JSON.stringify({ n: log.length }));
    });
  });
  // A port the kernel picks (nothing else can hold it): these receivers live in this process only.
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  return { url: `http://127.0.0.1:${port}/charges`, log, close: () => new Promise((r) => server.close(r)) };
}

/** A port where nothing listens: one the kernel picked, closed again. */
async function closedPort() {
  const server = http.createServer();
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  await new Promise((r) => server.close(r));
  return port;
}

const op = (name) => `${name}-${process.hrtime.bigint()}:charge`;
// Each test's sessions are new pool connections: they read the database's settings above.
const freshPool = () => newPool();

async function prepared(p, operation, target, request = { amount: 1 }, options = {}) {
  const client = await p.connect();
  try {
    await client.query('BEGIN');
    const r = await prepare(client, 'shop', operation, target, request, options);
    await client.query('COMMIT');
    return r;
  } catch (e) {
    await client.query('ROLLBACK'); // not back to the pool inside the failed transaction
    throw e;
  } finally {
    client.release();
  }
}

test('the key header is an sf-string; Retry-After in seconds or as an HTTP date', () => {
  assert.equal(keyHeader('k-1'), '"k-1"');
  assert.equal(keyHeader('a"b\\c'), '"a\\"b\\\\c"');
  const now = Date.parse('2026-12-03T12:00:00Z');
  assert.equal(parseRetryAfter('7', now), 7000);
  assert.equal(parseRetryAfter('Thu, 03 Dec 2026 12:00:30 GMT', now), 30000);
  assert.equal(parseRetryAfter('soon', now), null);
  assert.equal(parseRetryAfter('99999999999999999999', now), MAX_RETRY_AFTER_MS);
});

test('prepare is part of the caller\'s transaction, and the same operation keeps its key', async () => {
  const o = op('rollback');
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const p = await prepare(client, 'shop', o, 't-rollback', { amount: 1 });
    assert.match(p.key, /^[0-9a-f-]{36}$/);
    await client.query('ROLLBACK');
  } finally {
    client.release();
  }
  assert.equal((await pool.query('SELECT count(*)::int AS n FROM idempotency.outbound WHERE operation = $1', [o])).rows[0].n, 0);
  const o2 = op('twice');
  const first = await prepared(pool, o2, 't-twice');
  assert.equal((await prepared(pool, o2, 't-twice')).key, first.key);
  await assert.rejects(prepared(pool, o2, 't-twice', { amount: 2 }), (e) => e.code === 'IK004' || e.cause?.code === 'IK004');
});

test('deliver sends once with the key and returns the receiver\'s answer', async () => {
  const r = await receiver();
  const p = freshPool();
  try {
    const o = op('deliver');
    const sent = await prepared(p, o, 't-deliver', { amount: 5, currency: 'eur' });
    const sender = new Sender(p, { urls: { 't-deliver': r.url }, leaseMs: 5000, timeoutMs: 2000 });
    const result = await sender.deliver('shop', o);
    assert.equal(result.kind, 'delivered');
    assert.equal(result.status, 201);
    assert.deepEqual(JSON.parse(result.body), { n: 1 });
    assert.equal((await sender.deliver('shop', o)).status, 201, 'done: answered from the record');
    assert.deepEqual(r.log.map((x) => [x.key, JSON.parse(x.body)]), [[keyHeader(sent.key), { amount: 5, currency: 'eur' }]]);
  } finally {
    await r.close();
    await p.end();
  }
});

test('the worker retries 503 with the same key; a 422 is final', async () => {
  const r = await receiver([[503, {}], [503, {}], [201, {}]]);
  const r422 = await receiver([[422, {}]]);
  const p = freshPool();
  try {
    const o = op('retry');
    const sent = await prepared(p, o, 't-503');
    const sender = new Sender(p, { urls: { 't-503': r.url, 't-422': r422.url }, leaseMs: 5000, timeoutMs: 2000 });
    await sender.run('t-503', { untilIdle: true });
    assert.equal(r.log.length, 3);
    assert.deepEqual([...new Set(r.log.map((x) => x.key))], [keyHeader(sent.key)]);
    const o422 = op('declined');
    await prepared(p, o422, 't-422');
    const declined = await sender.deliver('shop', o422);
    assert.equal(declined.kind, 'delivered');
    assert.equal(declined.status, 422);
    assert.equal(await sender.runOnce('t-422'), 0);
    assert.equal(r422.log.length, 1);
  } finally {
    await r.close();
    await r422.close();
    await p.end();
  }
});

test('429 with Retry-After is not retried before it; a receiver that is down is no answer', async () => {
  const r = await receiver([[429, { 'retry-after': '2' }], [201, {}]]);
  const p = freshPool();
  try {
    const o = op('slow-down');
    await prepared(p, o, 't-429');
    const downPort = await closedPort();
    const sender = new Sender(p, { urls: { 't-429': r.url, 't-down': `http://127.0.0.1:${downPort}/charges` },
      leaseMs: 5000, timeoutMs: 2000 });
    const before = Date.now();
    const result = await sender.deliver('shop', o);
    assert.equal(result.kind, 'not_yet');
    assert.equal(result.lastStatus, 429);
    assert.ok(result.nextAttemptAt.getTime() >= before + 2000 - 5, 'not before Retry-After');
    const od = op('down');
    await prepared(p, od, 't-down');
    const down = await sender.deliver('shop', od);
    assert.equal(down.kind, 'not_yet');
    assert.equal(down.lastStatus, null);
    assert.match(down.lastError, /^connection failed/);
  } finally {
    await r.close();
    await p.end();
  }
});

test('no final answer before give_up_after is unknown', async () => {
  const r = await receiver([[503, {}]]);
  const p = freshPool();
  try {
    const o = op('give-up');
    await prepared(p, o, 't-give-up', { amount: 1 }, { giveUpAfter: 300 });
    const sender = new Sender(p, { urls: { 't-give-up': r.url }, leaseMs: 5000, timeoutMs: 2000, pollIntervalMs: 100 });
    await sender.run('t-give-up', { untilIdle: true });
    const final = await sender.status('shop', o);
    assert.equal(final.kind, 'unknown');
    assert.equal(final.lastStatus, 503);
  } finally {
    await r.close();
    await p.end();
  }
});

test('the worker wakes on NOTIFY, not on its poll', async () => {
  const r = await receiver();
  const p = freshPool();
  const stop = new AbortController();
  try {
    const sender = new Sender(p, { urls: { 't-notify': r.url }, leaseMs: 5000, timeoutMs: 2000, pollIntervalMs: 60000 });
    const worker = sender.run('t-notify', { signal: stop.signal });
    await new Promise((res) => setTimeout(res, 500)); // the worker has found nothing and waits
    await prepared(p, op('notify'), 't-notify');
    for (let i = 0; i < 200 && r.log.length === 0; i++) await new Promise((res) => setTimeout(res, 100));
    assert.equal(r.log.length, 1, 'the worker did not wake up on the NOTIFY');
    stop.abort();
    await worker;
  } finally {
    stop.abort();
    await r.close();
    await p.end();
  }
});

test('the send demo program', async () => {
  const r = await receiver();
  try {
    const env = { ...process.env, DATABASE_URL, RECEIVER_URL: r.url, TARGET: 't-demo', SEND_LEASE_MS: '5000', SEND_TIMEOUT_MS: '2000' };
    const prefix = `demo${process.hrtime.bigint()}`;
    // Not spawnSync: the receiver answers from this process's event loop.
    const run = (...args) => promisify(execFile)(process.execPath, [DEMO, ...args], { env, timeout: 120000 })
      .then(({ stdout, stderr }) => ({ status: 0, stdout, stderr }),
        (e) => ({ status: e.code ?? e.signal, stdout: e.stdout ?? '', stderr: e.stderr ?? String(e) }));
    let out = await run('prepare', '3', prefix);
    assert.equal(out.status, 0, out.stderr);
    assert.equal(out.stdout.trim(), 'prepared 3');
    out = await run('work', '--until-idle');
    assert.equal(out.status, 0, out.stderr);
    assert.deepEqual(out.stdout.split('\n').filter((l) => l.startsWith('finished')).sort(),
      [1, 2, 3].map((i) => `finished ${prefix}-${i}:charge done 201`));
    out = await run('inline', '2', prefix + 'i');
    assert.equal(out.status, 0, out.stderr);
    assert.deepEqual(out.stdout.split('\n').filter((l) => l.startsWith('delivered')),
      [1, 2].map((i) => `delivered ${prefix}i-${i}:charge done 201`));
    assert.equal(new Set(r.log.map((x) => x.key)).size, 5);
  } finally {
    await r.close();
  }
});

/** A receiver that sends its headers at once, then a body of `size` bytes one every `everyMs` ms. */
async function trickler(everyMs = 100, size = 60) {
  const log = [];
  const server = http.createServer((req, res) => {
    const entry = { began: performance.now(), closedAt: null, complete: false };
    log.push(entry);
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/plain', 'content-length': size });
      let sent = 0;
      const timer = setInterval(() => {
        if (sent < size) {
          res.write('x');
          sent += 1;
        } else {
          clearInterval(timer);
          res.end();
        }
      }, everyMs);
      res.on('close', () => {
        clearInterval(timer);
        entry.closedAt = performance.now();
        entry.complete = sent === size;
      });
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  return { url: `http://127.0.0.1:${port}/charges`, log, close: () => new Promise((r) => { server.closeAllConnections(); server.close(r); }) };
}

test('timeoutMs bounds an attempt in total: a trickled answer is cut off and its connection closed', async () => {
  const r = await trickler(100, 60); // 6 s of body, no read waiting more than 0.1 s
  const p = freshPool();
  try {
    const o = op('trickle');
    await prepared(p, o, 't-trickle');
    const sender = new Sender(p, { urls: { 't-trickle': r.url }, leaseMs: 2000, timeoutMs: 500 });
    const began = performance.now();
    const result = await sender.deliver('shop', o);
    const took = performance.now() - began;
    assert.equal(result.kind, 'not_yet');
    assert.equal(result.lastError, 'timed out');
    assert.ok(took < 500 + 750, `the attempt took ${took} ms`);
    for (let i = 0; i < 50 && r.log[0]?.closedAt === null; i++) await new Promise((res) => setTimeout(res, 20));
    const [entry] = r.log;
    assert.equal(entry.complete, false);
    assert.ok(entry.closedAt !== null && entry.closedAt - entry.began < 500 + 750,
      `the receiver saw the connection closed after ${entry.closedAt - entry.began} ms`);
    sender.close();
  } finally {
    await r.close();
    await p.end();
  }
});

test('timeoutMs bounds your own send too: its signal aborts and the attempt is no answer', async () => {
  const p = freshPool();
  try {
    const o = op('own-send');
    await prepared(p, o, 't-own');
    let aborted = null;
    const sender = new Sender(p, {
      leaseMs: 2000, timeoutMs: 300,
      send: (_attempt, signal) => new Promise(() => signal.addEventListener('abort', () => { aborted = signal.reason; })),
    });
    const result = await sender.deliver('shop', o);
    assert.equal(result.kind, 'not_yet');
    assert.equal(result.lastError, 'timed out');
    assert.equal(aborted?.message, 'timed out');
  } finally {
    await p.end();
  }
});

test('per-sender settings: budget and backoff in the sender\'s own transactions, give-up in its prepare', async () => {
  const r = await receiver([[503, {}]]);
  const p = new pg.Pool({ connectionString: DATABASE_URL, max: 1 }); // one session: a leak of SET LOCAL would show
  p.on('error', () => {});
  try {
    const setting = async (name) => (await p.query('SELECT current_setting($1, true) AS v', [name])).rows[0].v;
    const strict = new Sender(p, { urls: { 't-own-settings': r.url }, leaseMs: 5000, timeoutMs: 2000,
      retryBudget: 0, backoffCapMs: 20, giveUpAfterMs: 1500 });
    const o = op('settings');
    const client = await p.connect();
    try {
      await client.query('BEGIN');
      await strict.prepare(client, 'shop', o, 't-own-settings', { amount: 1 });
      await client.query('COMMIT');
    } finally {
      client.release();
    }
    const { rows: [row] } = await p.query(
      'SELECT extract(epoch FROM give_up_at - created_at)::float8 AS s FROM idempotency.outbound WHERE operation = $1', [o]);
    assert.equal(row.s, 1.5, 'giveUpAfterMs given to idem_send');
    const answeredAt = Date.now();
    const first = await strict.deliver('shop', o);
    assert.equal(first.kind, 'not_yet');
    assert.ok(first.nextAttemptAt.getTime() - answeredAt <= 20 + 500, `due ${first.nextAttemptAt.getTime() - answeredAt} ms later: backoffCapMs 20`);
    // The session's own values after the sender's transactions: the database's (cap 200ms), the budget not 0.
    assert.equal(await setting('idempotency.send_backoff_cap'), '200ms', 'backoffCapMs was local to the sender\'s transactions');
    assert.notEqual(await setting('idempotency.send_retry_budget'), '0', 'retryBudget was local to the sender\'s transactions');
    await new Promise((res) => setTimeout(res, 100));
    assert.equal(await strict.runOnce('t-own-settings'), 0, 'retryBudget 0: no retry handed out');
    const loose = new Sender(p, { urls: { 't-own-settings': r.url }, leaseMs: 5000, timeoutMs: 2000, retryBudget: 1000000 });
    assert.equal(await loose.runOnce('t-own-settings'), 1, 'another sender with its own budget retries it');
    assert.equal(r.log.length, 2);
  } finally {
    await r.close();
    await p.end();
  }
});

test('the worker outlives its backends terminated: db errors logged, reconnected, sends go on', async () => {
  const r = await receiver();
  const app = `sender-test-${process.hrtime.bigint()}`;
  const p = new pg.Pool({ connectionString: DATABASE_URL, max: 4, application_name: app });
  const events = [];
  const warnings = [];
  const stop = new AbortController();
  let worker = null;
  try {
    const sender = new Sender(p, { urls: { 't-survive': r.url }, leaseMs: 5000, timeoutMs: 2000, pollIntervalMs: 200,
      reconnectBaseMs: 20, reconnectCapMs: 200,
      logger: { info: () => {}, warn: (m) => warnings.push(m) },
      onDbError: (_e, { code }) => events.push(`db-error ${code}`), onDbReconnected: () => events.push('db-reconnected') });
    worker = sender.run('t-survive', { signal: stop.signal });
    await prepared(pool, op('survive-1'), 't-survive');
    for (let i = 0; i < 100 && r.log.length < 1; i++) await new Promise((res) => setTimeout(res, 50));
    assert.equal(r.log.length, 1);
    const { rows: [{ n }] } = await pool.query(
      'SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity WHERE application_name = $1', [app]);
    assert.ok(n >= 1, 'the worker\'s LISTEN session was there to terminate');
    for (let i = 0; i < 100 && !events.includes('db-reconnected'); i++) await new Promise((res) => setTimeout(res, 50));
    assert.ok(events.includes('db-error 57P01') || events.some((e) => e.startsWith('db-error ')), events.join(', '));
    assert.ok(events.includes('db-reconnected'), events.join(', '));
    assert.match(warnings.find((m) => m.includes('sender: database error')) ?? '', /^pg-idempotency: sender: database error \(.+\): .+; reconnecting in \d+\.\d\d s$/);
    await prepared(pool, op('survive-2'), 't-survive');
    for (let i = 0; i < 100 && r.log.length < 2; i++) await new Promise((res) => setTimeout(res, 50));
    assert.equal(r.log.length, 2, 'sent after the reconnection');
    stop.abort();
    await worker; // ended by its signal, not by the errors
    sender.close();
  } finally {
    stop.abort();
    await worker?.catch(() => {}); // a failure above: the worker ends before its pool does
    await r.close();
    await p.end();
  }
});
