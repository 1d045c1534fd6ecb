// Demo servers killed or frozen in the middle of a committed-first handler.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { after, test } from 'node:test';
import {
  LEASE_MS, chargeCount, isProblem, newKey, newPool, newTenant, postCharge, quoted, sleep, startDemo, waitInProgress,
} from './harness.js';

const pool = newPool();
after(() => pool.end());
const route = '/charges/external';

const lookup = async (scope, key) =>
  (await pool.query('SELECT status::text, attempts FROM idempotency.idem_lookup($1, $2)', [scope, key])).rows[0] ?? null;

/** Retries like a client: after each 409 waits Retry-After seconds; gives up after `tries`. */
async function retryUntilDone(port, tenant, key, tries = 10) {
  for (let i = 0; i < tries; i++) {
    const r = await postCharge(port, route, { tenant, key: quoted(key) });
    if (r.status !== 409) return r;
    await sleep(Number(r.headers['retry-after']) * 1000);
  }
  throw new Error('still 409');
}


for (const framework of ['express', 'fastify']) {
  test(`${framework}: a server killed mid-handler; the retry on a restarted server completes once`, async () => {
    const tenant = newTenant();
    const key = newKey();
    const scope = `${tenant}:POST ${route}`;
    // A lease long enough that the restarted server is up before it ends.
    const leaseMs = 4000;
    let app = await startDemo(framework, { leaseMs });
    const lost = postCharge(app.port, route, { tenant, key: quoted(key), headers: { 'X-Fault-Delay-Ms': '60000' } })
      .then((r) => r, (e) => e);
    await waitInProgress(pool, scope, key);
    await app.stop('SIGKILL');
    assert.ok((await lost) instanceof Error, 'the killed server sent no answer');
    app = await startDemo(framework, { port: app.port, leaseMs });
    const port = app.port;
    try {
      const early = await postCharge(port, route, { tenant, key: quoted(key) });
      assert.ok(isProblem(early, 409), `the dead owner's lease still runs: ${early.status} ${early.body}`);
      const done = await retryUntilDone(port, tenant, key);
      assert.equal(done.status, 201, done.body);
      assert.equal(done.headers['idempotent-replayed'], undefined);
      assert.equal((await lookup(scope, key)).attempts, 2, 'the retry took the dead claim over');
      const replay = await postCharge(port, route, { tenant, key: quoted(key) });
      assert.equal(replay.body, done.body);
      assert.equal(await chargeCount(pool, tenant), 1);
    } finally {
      await app.stop();
    }
  });

  test(`${framework}: a server frozen past its lease loses the key; its late completion is fenced, not a success`, async () => {
    const tenant = newTenant();
    const key = newKey();
    const scope = `${tenant}:POST ${route}`;
    const frozen = await startDemo(framework);
    const other = await startDemo(framework);
    try {
      const late = postCharge(frozen.port, route, {
        tenant, key: quoted(key), headers: { 'X-Fault-Delay-Ms': String(LEASE_MS) },
      });
      await waitInProgress(pool, scope, key);
      frozen.proc.kill('SIGSTOP');
      const done = await retryUntilDone(other.port, tenant, key);
      assert.equal(done.status, 201, done.body);
      frozen.proc.kill('SIGCONT');
      const answer = await late;
      assert.ok(isProblem(answer, 409), `the late worker must not report success: ${answer.status} ${answer.body}`);
      assert.match(frozen.log(), /fenced|claim was lost/);
      assert.equal(await chargeCount(pool, tenant), 1);
      const replay = await postCharge(frozen.port, route, { tenant, key: quoted(key) });
      assert.equal(replay.body, done.body);
    } finally {
      frozen.proc.kill('SIGCONT');
      await Promise.all([frozen.stop(), other.stop()]);
    }
  });
}

test('without --allow-fault-injection the X-Fault-* headers are ignored; bad options exit 2 with a message', async () => {
  for (const framework of ['express', 'fastify']) {
    const app = await startDemo(framework, { faults: false });
    try {
      const tenant = newTenant();
      const r = await postCharge(app.port, route, { tenant, key: quoted(newKey()), headers: { 'X-Fault-Fail-Before': '1' } });
      assert.equal(r.status, 201, r.body);
      assert.equal(await chargeCount(pool, tenant), 1);
    } finally {
      await app.stop();
    }
    const bad = spawnSync(process.execPath, [new URL(`../demo/${framework}.js`, import.meta.url).pathname,
      '--database-url', 'postgresql://x@127.0.0.1:1/x', '--listen', 'nowhere'], { encoding: 'utf8' });
    assert.equal(bad.status, 2);
    assert.match(bad.stderr, /--listen: expected HOST:PORT/);
  }
});
