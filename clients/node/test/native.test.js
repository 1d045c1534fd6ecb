// The framework-native forms over real HTTP and the real extension: Express middleware before
// ordinary handlers (res.status().json(), next(err)), and the Fastify plugin's hooks before
// ordinary handlers (return a value, reply.code(), throw). The business write runs on
// req.idempotency.db, in the claim's transaction.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import express from 'express';
import Fastify from 'fastify';
import { Refused, createIdempotency, expressProblemHandler } from '../src/index.js';
import { newKey, newPool, quoted, request } from './harness.js';

const pool = newPool();
const idem = createIdempotency({ pool, tenant: () => 'native-test', logger: { warn() {}, error() {} } });
const ORDERS = `CREATE TABLE IF NOT EXISTS native_orders (id bigserial PRIMARY KEY, key text NOT NULL)`;
before(() => pool.query(ORDERS));
after(() => pool.end());

const post = (port, path, key, body = { amount: 5 }) =>
  request(port, 'POST', path, { headers: key === undefined ? {} : { 'Idempotency-Key': quoted(key) }, body });
const orders = async (key) => (await pool.query('SELECT count(*)::int AS n FROM native_orders WHERE key = $1', [key])).rows[0].n;
const record = async (scope, key) =>
  (await pool.query('SELECT status::text FROM idempotency.idem_lookup($1, $2)', [scope, key])).rows[0] ?? null;

/** The shared checks: first 201 written by an ordinary handler, replay byte for byte, 422, one order row. */
async function ordinaryHandlerChecks(port, path) {
  const key = newKey();
  const first = await post(port, path, key);
  assert.equal(first.status, 201, first.body);
  assert.equal(first.headers.location, `/orders/${JSON.parse(first.body).id}`);
  assert.match(first.headers['content-type'], /^application\/json/);
  const again = await post(port, path, key);
  assert.equal(again.status, 201);
  assert.equal(again.headers['idempotent-replayed'], 'true');
  assert.equal(again.body, first.body);
  assert.equal(again.headers.location, first.headers.location);
  assert.equal((await post(port, path, key, { amount: 6 })).status, 422);
  assert.equal(await orders(key), 1);
}

describe('express: app.use(idem.middleware()) before ordinary handlers', () => {
  let server;
  let port;
  const calls = { failing: 0 };
  before(async () => {
    const app = express();
    app.use(express.json());
    app.use(idem.middleware());
    app.post('/orders', async (req, res) => {
      const { rows: [o] } = await req.idempotency.db.query(
        'INSERT INTO native_orders (key) VALUES ($1) RETURNING id', [req.idempotency.key]);
      res.status(201).location(`/orders/${o.id}`).json({ id: o.id, amount: req.body.amount });
    });
    app.post('/failing', async (req, res, next) => {
      calls.failing++;
      await req.idempotency.db.query('INSERT INTO native_orders (key) VALUES ($1)', [req.idempotency.key]);
      next(new Error('the handler failed after its write'));
    });
    app.post('/refused', (req, res, next) => next(new Refused({ status: 403, detail: 'not yours' })));
    app.get('/orders', (req, res) => res.json({ idempotency: req.idempotency ?? null }));
    app.use(expressProblemHandler());
    app.use((err, req, res, _next) => res.status(500).json({ error: 'failed' }));
    server = app.listen(0, '127.0.0.1');
    await new Promise((resolve) => server.on('listening', resolve));
    port = server.address().port;
  });
  after(() => server.close());

  test('res.status(201).location().json(): stored and replayed byte for byte; 422 for another body; one row', () =>
    ordinaryHandlerChecks(port, '/orders'));

  test('next(err): the answer of the error handler is sent, the write rolled back, the key free', async () => {
    const key = newKey();
    const failed = await post(port, '/failing', key);
    assert.equal(failed.status, 500);
    assert.deepEqual(JSON.parse(failed.body), { error: 'failed' });
    assert.equal(await orders(key), 0, 'the write was rolled back');
    assert.equal(await record('native-test:POST /failing', key), null);
    assert.equal((await post(port, '/failing', key)).status, 500);
    assert.equal(calls.failing, 2, 'the retry ran again');
  });

  test('next(new Refused(...)) with expressProblemHandler(): problem+json, not stored', async () => {
    const key = newKey();
    const r = await post(port, '/refused', key);
    assert.equal(r.status, 403);
    assert.equal(r.headers['content-type'], 'application/problem+json');
    assert.deepEqual(JSON.parse(r.body), { type: 'about:blank', title: 'Forbidden', status: 403, detail: 'not yours' });
    assert.equal(await record('native-test:POST /refused', key), null, 'a refusal is not stored');
  });

  test('a GET passes through: no key needed, no claim', async () => {
    const r = await request(port, 'GET', '/orders');
    assert.equal(r.status, 200);
    assert.deepEqual(JSON.parse(r.body), { idempotency: null });
  });

  test('a POST without a key: 400 problem+json, the handler does not run', async () => {
    const r = await post(port, '/orders', undefined);
    assert.equal(r.status, 400);
    assert.equal(JSON.parse(r.body).type, 'urn:pg-idempotency:problem:idempotency-key-missing');
  });
});

describe('express: per-route idem.middleware() with the route template in the scope', () => {
  let server;
  let port;
  before(async () => {
    const app = express();
    app.use(express.json());
    app.post('/orders/:group', idem.middleware({ ignore: ['note'] }), async (req, res) => {
      const { rows: [o] } = await req.idempotency.db.query(
        'INSERT INTO native_orders (key) VALUES ($1) RETURNING id', [req.idempotency.key]);
      res.status(201).location(`/orders/${o.id}`).json({ id: o.id, group: req.params.group });
    });
    server = app.listen(0, '127.0.0.1');
    await new Promise((resolve) => server.on('listening', resolve));
    port = server.address().port;
  });
  after(() => server.close());

  test('stored under the route template', async () => {
    await ordinaryHandlerChecks(port, '/orders/a');
    const key = newKey();
    assert.equal((await post(port, '/orders/b', key)).status, 201);
    assert.equal((await record('native-test:POST /orders/:group', key)).status, 'completed');
  });
});

describe('fastify: app.register(idem.fastifyPlugin) before ordinary handlers', () => {
  let app;
  let port;
  const calls = { failing: 0, nested: 0 };
  before(async () => {
    app = Fastify({ logger: false });
    await app.register(idem.fastifyPlugin);
    const schema = { body: { type: 'object', required: ['amount'], properties: { amount: { type: 'integer' } } } };
    app.post('/orders', { schema }, async (request, reply) => {
      const { rows: [o] } = await request.idempotency.db.query(
        'INSERT INTO native_orders (key) VALUES ($1) RETURNING id', [request.idempotency.key]);
      reply.code(201).header('Location', `/orders/${o.id}`);
      return { id: o.id, amount: request.body.amount };
    });
    app.post('/failing', async (request) => {
      calls.failing++;
      await request.idempotency.db.query('INSERT INTO native_orders (key) VALUES ($1)', [request.idempotency.key]);
      throw new Error('the handler failed after its write');
    });
    app.post('/unprotected', { config: { idempotency: false } }, async (request) => ({ idempotency: request.idempotency }));
    // Routes of an encapsulated child plugin get the hooks too (the plugin skips encapsulation).
    await app.register(async (child) => {
      child.post('/nested', async (request, reply) => {
        reply.code(201);
        return { key: request.idempotency.key, n: ++calls.nested };
      });
    });
    await app.listen({ host: '127.0.0.1', port: 0 });
    port = app.server.address().port;
  });
  after(() => app.close());

  test('reply.code(201) and a returned object: stored and replayed byte for byte; 422 for another body; one row', () =>
    ordinaryHandlerChecks(port, '/orders'));

  test('a thrown error: Fastify\'s 500 is sent, the write rolled back, the key free', async () => {
    const key = newKey();
    assert.equal((await post(port, '/failing', key)).status, 500);
    assert.equal(await orders(key), 0);
    assert.equal(await record('native-test:POST /failing', key), null);
    assert.equal((await post(port, '/failing', key)).status, 500);
    assert.equal(calls.failing, 2);
  });

  test('a body the schema refuses, or one that is not JSON: Fastify\'s 400, nothing claimed, the key free', async () => {
    const key = newKey();
    assert.equal((await post(port, '/orders', key, { amount: 'lots' })).status, 400);
    assert.equal((await post(port, '/orders', key, '{"amount": 5')).status, 400);
    assert.equal(await record('native-test:POST /orders', key), null);
    const good = await post(port, '/orders', key);
    assert.equal(good.status, 201);
    assert.equal(good.headers['idempotent-replayed'], undefined);
  });

  test('a route of a child plugin is protected as well', async () => {
    const key = newKey();
    const first = await post(port, '/nested', key);
    assert.equal(first.status, 201);
    assert.deepEqual(JSON.parse(first.body), { key, n: 1 });
    const again = await post(port, '/nested', key);
    assert.equal(again.headers['idempotent-replayed'], 'true');
    assert.equal(calls.nested, 1);
  });

  test('config: { idempotency: false } leaves a route out', async () => {
    const r = await post(port, '/unprotected', undefined);
    assert.equal(r.status, 200);
    assert.deepEqual(JSON.parse(r.body), { idempotency: null });
  });
});
