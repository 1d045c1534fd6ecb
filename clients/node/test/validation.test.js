// A request the framework rejects before the handler runs leaves the key free: Express's JSON
// body parser, Fastify's own JSON parser and a Fastify schema validation error. In-process apps
// over real HTTP, the real extension.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import express from 'express';
import Fastify from 'fastify';
import { createIdempotency } from '../src/index.js';
import { newKey, newPool, quoted, request } from './harness.js';

const pool = newPool();
after(() => pool.end());
const idem = createIdempotency({ pool, tenant: () => 'validation-test', logger: { warn() {}, error() {} } });
const record = async (scope, key) =>
  (await pool.query('SELECT status::text FROM idempotency.idem_lookup($1, $2)', [scope, key])).rows[0] ?? null;

const post = (port, path, key, body) =>
  request(port, 'POST', path, { headers: { 'Idempotency-Key': quoted(key) }, body });

/** Refused first (status 400, nothing claimed), then the corrected body runs once: 201, not a replay. */
async function refusedThenRuns(port, path, key, badBody, calls) {
  const bad = await post(port, path, key, badBody);
  assert.equal(bad.status, 400, bad.body);
  assert.equal(await record(`validation-test:POST ${path}`, key), null, 'nothing claimed');
  assert.equal(calls.n, 0, 'the handler did not run');
  const good = await post(port, path, key, { amount: 5 });
  assert.equal(good.status, 201, good.body);
  assert.equal(good.headers['idempotent-replayed'], undefined);
  assert.equal(calls.n, 1);
  const again = await post(port, path, key, { amount: 5 });
  assert.equal(again.headers['idempotent-replayed'], 'true');
  assert.equal(calls.n, 1);
}

describe('express', () => {
  const calls = { n: 0 };
  let server;
  before(async () => {
    const app = express();
    app.use(express.json());
    app.post('/orders', idem.express({}, () => ({ status: 201, body: { n: ++calls.n } })));
    server = app.listen(0, '127.0.0.1');
    await new Promise((resolve) => server.on('listening', resolve));
  });
  after(() => server.close());

  test('a body express.json() cannot parse: its 400, the key stays free', async () => {
    await refusedThenRuns(server.address().port, '/orders', newKey(), '{"amount": 5', calls);
  });
});

describe('fastify', () => {
  const calls = { parse: 0, schema: 0 };
  const counter = (name) => ({ get n() { return calls[name]; } });
  let app;
  before(async () => {
    app = Fastify({ logger: false });
    app.post('/orders', idem.fastify({}, () => ({ status: 201, body: { n: ++calls.parse } })));
    const schema = {
      body: { type: 'object', required: ['amount'], properties: { amount: { type: 'integer', minimum: 1 } } },
    };
    app.post('/checked', { schema }, idem.fastify({}, () => ({ status: 201, body: { n: ++calls.schema } })));
    await app.listen({ host: '127.0.0.1', port: 0 });
  });
  after(() => app.close());

  test('a body Fastify\'s JSON parser cannot parse: its 400, the key stays free', async () => {
    await refusedThenRuns(app.server.address().port, '/orders', newKey(), '{"amount": 5', counter('parse'));
  });

  test('a body the route schema refuses: Fastify\'s 400, the key stays free', async () => {
    await refusedThenRuns(app.server.address().port, '/checked', newKey(), { amount: 'lots' }, counter('schema'));
  });
});
