// The middleware's options on an in-process Express app over real HTTP and the real extension:
// ignored fields, text bodies, 5xx released or stored, optional keys, a scope function, the
// replayed header allow-list, a failure after a side effect.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import express from 'express';
import { createIdempotency, HttpProblem, Mode } from '../src/index.js';
import { newKey, newPool, quoted, request } from './harness.js';

const pool = newPool();
const idem = createIdempotency({ pool, tenant: () => 'mw-test', logger: { warn() {}, error() {} } });
const calls = {};
const count = (name) => (calls[name] = (calls[name] ?? 0) + 1);
let server;
let port;

before(async () => {
  const app = express();
  app.use(express.json());
  app.post('/ignore', idem.express({ ignore: ['note'] }, () => ({ status: 201, body: { n: count('ignore') } })));
  app.post('/text', idem.express({}, () => ({
    status: 200, headers: { 'Content-Type': 'text/plain; charset=utf-8' }, body: `plain text ✓ ${count('text')}\n`,
  })));
  app.post('/released', idem.express({}, () => ({ status: 503, body: { n: count('released') } })));
  app.post('/stored', idem.express({ storeServerErrors: true }, () => ({ status: 503, body: { n: count('stored') } })));
  app.post('/refusal', idem.express({}, () => ({ status: 400, body: { n: count('refusal') } })));
  app.post('/refusal-stored', idem.express({ refusedStatuses: [] }, () => ({ status: 400, body: { n: count('refusal-stored') } })));
  app.post('/optional', idem.express({ required: false }, () => ({ body: { n: count('optional') } })));
  app.post('/scoped', idem.express({ scope: ({ method }) => `custom:${method}` }, () => ({ body: { n: count('scoped') } })));
  app.post('/headers', idem.express({ replayHeaders: ['X-Tag'] }, () => ({
    status: 201, headers: { 'X-Tag': 'a', Location: '/x' }, body: { n: count('headers') },
  })));
  app.post('/after-effect', idem.express({ mode: Mode.COMMITTED_FIRST }, (req, ctx) => {
    count('after-effect');
    ctx.sideEffectStarted();
    throw new Error('failed after its side effect');
  }));
  app.post('/problem', idem.express({ mode: Mode.COMMITTED_FIRST }, () => {
    count('problem');
    throw new HttpProblem(402, 'Payment required', { detail: 'declined' });
  }));
  server = app.listen(0, '127.0.0.1');
  await new Promise((resolve) => server.on('listening', resolve));
  port = server.address().port;
});
after(async () => {
  server.close();
  await pool.end();
});

const post = (path, key, body = { amount: 1 }) =>
  request(port, 'POST', path, { headers: key === undefined ? {} : { 'Idempotency-Key': quoted(key) }, body });
const record = async (scope, key) =>
  (await pool.query('SELECT status::text FROM idempotency.idem_lookup($1, $2)', [scope, key])).rows[0] ?? null;

test('ignored top-level fields do not change the fingerprint', async () => {
  const key = newKey();
  const first = await post('/ignore', key, { amount: 1, note: 'a' });
  assert.equal(first.status, 201);
  const again = await post('/ignore', key, { note: 'b', amount: 1 });
  assert.equal(again.headers['idempotent-replayed'], 'true');
  assert.equal(again.body, first.body);
  assert.equal((await post('/ignore', key, { amount: 2, note: 'a' })).status, 422);
  assert.equal(calls.ignore, 1);
});

test('a text body is replayed byte for byte with its Content-Type', async () => {
  const key = newKey();
  const first = await post('/text', key);
  const again = await post('/text', key);
  assert.equal(first.body, 'plain text ✓ 1\n');
  assert.equal(again.body, first.body);
  assert.equal(again.headers['content-type'], 'text/plain; charset=utf-8');
  assert.equal(again.headers['idempotent-replayed'], 'true');
});

test('a returned 5xx releases the key by default, and is stored with storeServerErrors', async () => {
  const key = newKey();
  assert.equal((await post('/released', key)).status, 503);
  assert.equal(await record('mw-test:POST /released', key), null);
  assert.equal((await post('/released', key)).status, 503);
  assert.equal(calls.released, 2, 'the retry ran the handler again');
  const first = await post('/stored', key);
  const again = await post('/stored', key);
  assert.equal(again.status, 503);
  assert.equal(again.headers['idempotent-replayed'], 'true');
  assert.equal(again.body, first.body);
  assert.equal(calls.stored, 1);
});

test('a returned refusal (400, one of refusedStatuses) is released, not stored; refusedStatuses: [] stores it', async () => {
  const key = newKey();
  assert.equal((await post('/refusal', key)).status, 400);
  assert.equal(await record('mw-test:POST /refusal', key), null);
  assert.equal((await post('/refusal', key)).status, 400);
  assert.equal(calls.refusal, 2, 'the retry ran the handler again');
  await post('/refusal-stored', key);
  assert.equal((await post('/refusal-stored', key)).headers['idempotent-replayed'], 'true');
  assert.equal(calls['refusal-stored'], 1);
});

test('required: false runs a request without a key unprotected; a bad key is still 400', async () => {
  assert.equal((await post('/optional')).status, 200);
  assert.equal((await post('/optional')).status, 200);
  assert.equal(calls.optional, 2);
  const bad = await request(port, 'POST', '/optional', { headers: { 'Idempotency-Key': 'a b' }, body: {} });
  assert.equal(bad.status, 400);
});

test('a scope function decides where the key lives', async () => {
  const key = newKey();
  assert.equal((await post('/scoped', key)).status, 200);
  assert.equal((await record('custom:POST', key)).status, 'completed');
});

test('replayHeaders: only the listed headers (and Content-Type) are stored and replayed', async () => {
  const key = newKey();
  const first = await post('/headers', key);
  assert.equal(first.headers.location, '/x', 'the first answer has every header');
  const again = await post('/headers', key);
  assert.equal(again.headers['x-tag'], 'a');
  assert.equal(again.headers.location, undefined);
  assert.equal(again.headers['content-type'], 'application/json');
});

test('committed first: a failure after a side effect is stored; a thrown HttpProblem before one is sent, not stored', async () => {
  const key = newKey();
  const first = await post('/after-effect', key);
  assert.equal(first.status, 500);
  const again = await post('/after-effect', key);
  assert.equal(again.status, 500);
  assert.equal(again.headers['idempotent-replayed'], 'true');
  assert.equal(calls['after-effect'], 1);
  const declined = await post('/problem', key);
  assert.equal(declined.status, 402);
  assert.equal(JSON.parse(declined.body).detail, 'declined');
  assert.equal(await record('mw-test:POST /problem', key), null);
  await post('/problem', key);
  assert.equal(calls.problem, 2);
});
