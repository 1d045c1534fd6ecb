// The demo apps and the client through Debian's PgBouncer in transaction-pooling mode (test.sh
// starts it and sets PGBOUNCER_URL): node-postgres sends unnamed statements only, so the defaults
// work there.
import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import pg from 'pg';
import { IdempotencyClient, Outcome } from '../src/index.js';
import {
  LEASE_MS, PGBOUNCER_URL, chargeCount, isProblem, newKey, newPool, newTenant, postCharge, quoted, sleep, startDemo,
} from './harness.js';

describe('through pgbouncer (pool_mode = transaction)', { skip: PGBOUNCER_URL ? false : 'PGBOUNCER_URL is not set (test.sh starts pgbouncer)' }, () => {
  const direct = newPool();
  after(() => direct.end());

  test('pgbouncer runs in transaction pooling mode (its admin console)', async () => {
    const admin = new pg.Client({ connectionString: PGBOUNCER_URL.replace(/\/[^/]*$/, '/pgbouncer') });
    await admin.connect();
    try {
      const { rows } = await admin.query('SHOW CONFIG');
      assert.equal(rows.find((r) => r.key === 'pool_mode').value, 'transaction');
    } finally {
      await admin.end();
    }
  });

  test('client: claim, checkpoint, complete, replay, seen over pooled connections', async () => {
    const pool = newPool(PGBOUNCER_URL);
    try {
      const idem = new IdempotencyClient(pool);
      const s = 'bouncer:' + newKey();
      const c = await idem.claim(s, 'k', { fingerprint: 'fp', lease: 10_000 });
      assert.equal(c.outcome, Outcome.CLAIMED);
      await idem.checkpoint(s, 'k', c.token, 'step-1', { data: { a: 1 } });
      await idem.complete(s, 'k', c.token, 201, { body: { ok: true } });
      assert.equal((await idem.claim(s, 'k', { fingerprint: 'fp' })).outcome, Outcome.REPLAY);
      assert.equal(await idem.seen(s, 'm'), true);
      assert.equal(await idem.seen(s, 'm'), false);
    } finally {
      await pool.end();
    }
  });

  for (const framework of ['express', 'fastify']) {
    test(`${framework} demo: both modes, replay, 12 concurrent requests, 409 under a slow handler`, async () => {
      const app = await startDemo(framework, { databaseUrl: PGBOUNCER_URL });
      try {
        for (const route of ['/charges', '/charges/external']) {
          const tenant = newTenant();
          const key = quoted(newKey());
          const first = await postCharge(app.port, route, { tenant, key });
          assert.equal(first.status, 201, first.body);
          const again = await postCharge(app.port, route, { tenant, key });
          assert.equal(again.headers['idempotent-replayed'], 'true');
          assert.equal(again.body, first.body);

          const t2 = newTenant();
          const k2 = quoted(newKey());
          const answers = await Promise.all(Array.from({ length: 12 }, () => postCharge(app.port, route, { tenant: t2, key: k2 })));
          assert.equal(answers.filter((r) => r.status === 201 && !r.headers['idempotent-replayed']).length, 1);
          assert.ok(answers.every((r) => r.status === 201 || isProblem(r, 409)), answers.map((r) => r.status).join(','));
          assert.equal(await chargeCount(direct, t2), 1);
        }
        const tenant = newTenant();
        const key = quoted(newKey());
        const slow = postCharge(app.port, '/charges/external', { tenant, key, headers: { 'X-Fault-Delay-Ms': String(LEASE_MS * 2) } });
        await sleep(LEASE_MS + 300);
        const busy = await postCharge(app.port, '/charges/external', { tenant, key });
        assert.ok(isProblem(busy, 409), `${busy.status} ${busy.body}`);
        assert.equal((await slow).status, 201);
        assert.equal(await chargeCount(direct, tenant), 1);
      } finally {
        await app.stop();
      }
    });
  }
});
