// The database unavailable under the demo apps: stopped (connections refused, the pool's
// connections reset) while requests arrive and while one is in its handler, then started again.
// Every answer meanwhile is 503 service-unavailable with Retry-After; afterwards nothing was lost:
// earlier keys replay, a key refused meanwhile runs once. Every pooled connection cut under them
// (a TCP proxy in between): the next claim meets a dead connection and is sent again. Also the
// classifier on real errors of node-postgres and pg-pool (refused, reset, pool timeout), and the
// middleware's own bound on waiting for a connection.
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, test } from 'node:test';
import pg from 'pg';
import { createIdempotency, isUnavailable } from '../src/index.js';
import {
  DATABASE_URL, LEASE_MS, chargeCount, database, newKey, newPool, newTenant, postCharge, quoted, request, sleep,
  startDemo, waitInProgress,
} from './harness.js';

const skip = database.skip;
const stopDatabase = database.stop;
const startDatabase = database.start;

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
        await stopDatabase();
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
          await startDatabase();
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

/**
 * A TCP proxy in front of the database whose cut() ends every connection's server side (the
 * sessions end) and leaves the application's side open, as if alive, until the application sends
 * on one of them: then every cut connection is reset at once (what a restart or a network failure
 * does to a connection idle in a pool, which the application hears of only when it uses it).
 */
async function cuttingProxy() {
  const upstream = new URL(DATABASE_URL);
  const pairs = new Set();
  const server = net.createServer((app) => {
    const pair = { app, db: net.connect(Number(upstream.port), upstream.hostname), cut: false };
    pairs.add(pair);
    app.on('data', (data) => {
      if (!pair.cut) return void pair.db.write(data);
      for (const p of pairs) if (p.cut) p.app.resetAndDestroy();
    });
    pair.db.on('data', (data) => app.write(data));
    const close = () => {
      pairs.delete(pair);
      app.destroy();
      pair.db.destroy();
    };
    app.on('close', close);
    app.on('error', close);
    pair.db.on('close', () => pair.cut || close());
    pair.db.on('error', () => pair.cut || close());
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = new URL(DATABASE_URL);
  url.hostname = '127.0.0.1';
  url.port = String(server.address().port);
  return {
    url: url.toString(),
    cut() {
      let n = 0;
      for (const p of pairs) {
        p.cut = true;
        p.db.destroy();
        n++;
      }
      return n;
    },
    close: () => new Promise((resolve) => {
      for (const p of pairs) p.app.destroy();
      server.close(resolve);
    }),
  };
}

for (const framework of ['express', 'fastify']) {
  test(`${framework} demo: every pooled connection cut; the next claim meets a dead one and is sent again on a new one (both modes)`,
    async () => {
      const proxy = await cuttingProxy();
      const app = await startDemo(framework, { databaseUrl: proxy.url });
      const tenant = newTenant();
      try {
        for (const route of ['/charges', '/charges/external']) {
          assert.equal((await postCharge(app.port, route, { tenant, key: quoted(newKey()) })).status, 201);
        }
        for (const [route, retried] of [['/charges', /sending it once more on another connection/],
          ['/charges/external', /repeating it with the same token on another connection/]]) {
          await sleep(200); // the last replay's ROLLBACK, sent after its answer, is done: its connection is idle
          assert.ok(proxy.cut() > 0, 'the demo holds pooled connections');
          const key = newKey();
          const r = await postCharge(app.port, route, { tenant, key: quoted(key) });
          assert.equal(r.status, 201, `${route}: ${r.status} ${r.body}\n${app.log()}`);
          assert.equal(r.headers['idempotent-replayed'], undefined);
          assert.match(app.log(), retried, `${route}: the claim met a dead connection`);
          assert.equal((await postCharge(app.port, route, { tenant, key: quoted(key) })).headers['idempotent-replayed'], 'true');
        }
        assert.equal(await chargeCount(pool, tenant), 4);
        assert.equal(app.proc.exitCode, null, 'the demo is still running');
      } finally {
        await app.stop();
        await proxy.close();
      }
    });
}

const quiet = () => {
  const lines = [];
  return { lines, warn: (...a) => lines.push(a.join(' ')), error: (...a) => lines.push(a.join(' ')) };
};
const input = (key) => ({ method: 'POST', route: '/bound', keyValues: [quoted(key)], body: { n: 1 } });

test('no pool connection within connectionTimeout (the pool has no timeout of its own): 503 in both modes, well within 2 s; the late connection goes back to the pool', async () => {
  const small = new pg.Pool({ connectionString: DATABASE_URL, max: 1 });
  const logger = quiet();
  const idem = createIdempotency({ pool: small, logger, connectionTimeout: 300 });
  const held = await small.connect();
  try {
    for (const mode of ['same-transaction', 'committed-first']) {
      const started = Date.now();
      const a = await idem.execute({ mode }, () => assert.fail('the handler must not run'), {}, input(newKey()));
      const took = Date.now() - started;
      assert.equal(a.status, 503, `${mode}: ${a.body}`);
      assert.equal(JSON.parse(a.body).type, 'urn:pg-idempotency:problem:service-unavailable');
      assert.equal(a.headers['Retry-After'], '1');
      assert.ok(took >= 250 && took < 2000, `${mode}: answered after ${took} ms`);
    }
  } finally {
    held.release();
  }
  await sleep(50);
  assert.equal(small.waitingCount, 0, 'no request left waiting in the pool');
  assert.equal(small.idleCount, 1, 'the connection that came late went back to the pool');
  const ok = await idem.execute({}, () => ({ status: 201, body: { ok: true } }), {}, input(newKey()));
  assert.equal(ok.status, 201, ok.body);
  assert.match(logger.lines.join('\n'), /no database connection within 300 ms/);
  await small.end();
});

test('the pool guard: a pool without an error listener gets one; an idle connection killed by the server is logged, the process lives', async () => {
  const guarded = new pg.Pool({ connectionString: DATABASE_URL, max: 2 });
  const logger = quiet();
  createIdempotency({ pool: guarded, logger });
  assert.equal(guarded.listenerCount('error'), 1);
  const { rows: [{ pid }] } = await guarded.query('SELECT pg_backend_pid() AS pid');
  assert.equal(guarded.idleCount, 1);
  await pool.query('SELECT pg_terminate_backend($1)', [pid]);
  for (let i = 0; i < 100 && guarded.totalCount > 0; i++) await sleep(20);
  assert.equal(guarded.totalCount, 0, 'the pool dropped the dead connection');
  assert.match(logger.lines.join('\n'), /an idle database connection failed \(terminating connection due to administrator command\)/);
  assert.equal((await guarded.query('SELECT 1 AS one')).rows[0].one, 1, 'the pool opens a new one');
  await guarded.end();

  const own = new pg.Pool({ connectionString: DATABASE_URL });
  own.on('error', () => {});
  createIdempotency({ pool: own, logger });
  assert.equal(own.listenerCount('error'), 1, 'a listener of the application\'s own: none added');
  await own.end();
});
