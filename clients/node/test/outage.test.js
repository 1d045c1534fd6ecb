// The database unavailable under the demo apps: stopped (connections refused, the pool's
// connections reset) while requests arrive and while one is in its handler, then started again.
// Every answer meanwhile is 503 service-unavailable with Retry-After; afterwards nothing was lost:
// earlier keys replay, a key refused meanwhile runs once. Also the classifier on real errors of
// node-postgres and pg-pool (refused, reset, pool timeout).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { after, test } from 'node:test';
import pg from 'pg';
import { isUnavailable } from '../src/index.js';
import {
  DATABASE_URL, LEASE_MS, chargeCount, newKey, newPool, newTenant, postCharge, quoted, request, sleep, startDemo,
  waitInProgress,
} from './harness.js';

const { PG_DATA_DIR, PG_BIN } = process.env;
const skip = PG_DATA_DIR && PG_BIN ? false : 'PG_DATA_DIR and PG_BIN are not set (test.sh sets them)';
const pgCtl = (...args) => execFileSync('runuser', ['-u', 'postgres', '--', `${PG_BIN}/pg_ctl`, '-D', PG_DATA_DIR, ...args],
  { cwd: '/', stdio: ['ignore', 'ignore', 'inherit'] });
const stopDatabase = () => pgCtl('-m', 'fast', '-w', 'stop');
const startDatabase = () => pgCtl('-l', `${PG_DATA_DIR}/../server.log`, '-w', '-t', '60', 'start');

const pool = newPool();
after(() => pool.end());

function assertUnavailable(r, what) {
  assert.equal(r.status, 503, `${what}: ${r.status} ${r.body}`);
  assert.equal(r.headers['content-type'], 'application/problem+json', what);
  assert.equal(JSON.parse(r.body).type, 'urn:pg-idempotency:problem:service-unavailable', what);
  assert.ok(Number(r.headers['retry-after']) >= 1, `${what}: Retry-After ${r.headers['retry-after']}`);
}

for (const framework of ['express', 'fastify']) {
  test(`${framework} demo: 503 with Retry-After while the database is down; afterwards earlier keys replay and new ones run once`,
    { skip }, async () => {
      const app = await startDemo(framework);
      const tenant = newTenant();
      const keys = { earlier: newKey(), meanwhile: newKey(), inFlight: newKey() };
      const earlier = {};
      try {
        for (const route of ['/charges', '/charges/external']) {
          earlier[route] = await postCharge(app.port, route, { tenant, key: quoted(keys.earlier) });
          assert.equal(earlier[route].status, 201, earlier[route].body);
        }
        // In their handlers when the database goes away: committed first (the claim committed),
        // and same transaction (the claim's transaction open; its connection is dropped while idle).
        const slow = postCharge(app.port, '/charges/external', {
          tenant, key: quoted(keys.inFlight), headers: { 'X-Fault-Delay-Ms': '1500' },
        });
        const slowSame = postCharge(app.port, '/charges', {
          tenant, key: quoted(keys.inFlight), headers: { 'X-Fault-Delay-Ms': '1500' },
        });
        await waitInProgress(pool, `${tenant}:POST /charges/external`, keys.inFlight);
        await sleep(200);
        stopDatabase();
        try {
          for (const route of ['/charges', '/charges/external']) {
            for (const k of ['earlier', 'meanwhile']) {
              assertUnavailable(await postCharge(app.port, route, { tenant, key: quoted(keys[k]) }), `${route} ${k} key`);
            }
          }
          assertUnavailable(await slow, 'the committed-first request in its handler');
          assertUnavailable(await slowSame, 'the same-transaction request in its handler');
          assert.equal(app.proc.exitCode, null, 'the demo is still running');
          assertUnavailable(await request(app.port, 'GET', '/charges/ch_x', { headers: { 'X-Api-Key': tenant } }), 'GET');
        } finally {
          startDatabase();
        }
        for (const route of ['/charges', '/charges/external']) {
          const again = await postCharge(app.port, route, { tenant, key: quoted(keys.earlier) });
          assert.equal(again.headers['idempotent-replayed'], 'true', `${route}: ${again.status} ${again.body}`);
          assert.equal(again.body, earlier[route].body);
          const first = await postCharge(app.port, route, { tenant, key: quoted(keys.meanwhile) });
          assert.equal(first.status, 201, `${route}: ${first.body}`);
          assert.equal(first.headers['idempotent-replayed'], undefined);
          const replay = await postCharge(app.port, route, { tenant, key: quoted(keys.meanwhile) });
          assert.equal(replay.headers['idempotent-replayed'], 'true');
        }
        // The same-transaction claim was rolled back with its connection: the key runs at once.
        const sameRetry = await postCharge(app.port, '/charges', { tenant, key: quoted(keys.inFlight) });
        assert.equal(sameRetry.status, 201, sameRetry.body);
        assert.equal(sameRetry.headers['idempotent-replayed'], undefined);
        // The committed-first claim could not be released (the database was down): its key is
        // busy until its lease ends, then runs once.
        let retried;
        for (let i = 0; i < 100; i++) {
          retried = await postCharge(app.port, '/charges/external', { tenant, key: quoted(keys.inFlight) });
          if (retried.status !== 409) break;
          await sleep(Math.min(LEASE_MS / 5, 500));
        }
        assert.equal(retried.status, 201, retried.body);
        assert.equal(retried.headers['idempotent-replayed'], undefined);
        assert.equal(await chargeCount(pool, tenant), 6);
      } finally {
        await app.stop();
      }
    });
}

test('isUnavailable: a refused connection, a connection reset under a query, a pool timeout; not an SQL error', { skip }, async () => {
  const refused = new pg.Client({ connectionString: DATABASE_URL.replace(/:\d+\//, ':1/') });
  const refusal = await refused.connect().then(() => null, (e) => e);
  assert.ok(refusal && isUnavailable(refusal), String(refusal));

  const client = new pg.Client({ connectionString: DATABASE_URL });
  client.on('error', () => {});
  await client.connect();
  const { rows: [{ pid }] } = await client.query('SELECT pg_backend_pid() AS pid');
  const reset = client.query('SELECT pg_sleep(30)').then(() => null, (e) => e);
  await sleep(100);
  await pool.query('SELECT pg_terminate_backend($1)', [pid]);
  const resetError = await reset;
  assert.ok(resetError && isUnavailable(resetError), String(resetError));
  await client.end().catch(() => {});

  const small = new pg.Pool({ connectionString: DATABASE_URL, max: 1, connectionTimeoutMillis: 200 });
  const held = await small.connect();
  const timeout = await small.connect().then(() => null, (e) => e);
  assert.ok(timeout && isUnavailable(timeout), String(timeout));
  held.release();
  await small.end();

  const sqlError = await pool.query('SELECT 1/0').then(() => null, (e) => e);
  assert.equal(isUnavailable(sqlError), false);
});
