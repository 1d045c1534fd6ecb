// The demo apps (Express and Fastify) over real HTTP against the real extension.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import {
  LEASE_MS, chargeCount, isProblem, keyCount, newKey, newPool, newTenant, postCharge, quoted,
  rawRequest, request, sleep, startDemo, waitInProgress,
} from './harness.js';

const pool = newPool();
after(() => pool.end());

const lookup = async (scope, key) =>
  (await pool.query(`SELECT status::text, attempts, locked_until, clock_timestamp() AS now
                     FROM idempotency.idem_lookup($1, $2)`, [scope, key])).rows[0] ?? null;

for (const framework of ['express', 'fastify']) {
  describe(`${framework} demo`, () => {
    let app;
    before(async () => (app = await startDemo(framework)));
    after(() => app.stop());

    test('GET /healthz answers ok', async () => {
      const r = await request(app.port, 'GET', '/healthz');
      assert.equal(r.status, 200);
      assert.equal(r.body, 'ok\n');
    });

    for (const route of ['/charges', '/charges/external']) {
      test(`${route}: first answer 201, replay sends status, Location, Content-Type and body byte for byte`, async () => {
        const tenant = newTenant();
        const key = quoted(newKey());
        const first = await postCharge(app.port, route, { tenant, key });
        assert.equal(first.status, 201, first.body);
        assert.equal(first.headers['idempotent-replayed'], undefined);
        const charge = JSON.parse(first.body);
        assert.match(charge.id, /^ch_/);
        assert.equal(charge.amount, 500);
        assert.equal(charge.currency, 'eur');
        assert.equal(first.headers.location, `/charges/${charge.id}`);
        assert.equal(first.headers['content-type'], 'application/json');

        const again = await postCharge(app.port, route, { tenant, key, body: { currency: 'eur', amount: 500.0 } });
        assert.equal(again.status, 201);
        assert.equal(again.headers['idempotent-replayed'], 'true');
        assert.equal(again.body, first.body);
        assert.equal(again.headers.location, first.headers.location);
        assert.equal(again.headers['content-type'], first.headers['content-type']);
        assert.equal(await chargeCount(pool, tenant), 1);

        const got = await request(app.port, 'GET', `/charges/${charge.id}`, { headers: { 'X-Api-Key': tenant } });
        assert.equal(got.status, 200);
        assert.equal(JSON.parse(got.body).id, charge.id);
        const other = await request(app.port, 'GET', `/charges/${charge.id}`, { headers: { 'X-Api-Key': tenant + 'x' } });
        assert.ok(isProblem(other, 404), other.body);
      });

      test(`${route}: the same key with another body is 422 problem+json and charges nothing`, async () => {
        const tenant = newTenant();
        const key = quoted(newKey());
        assert.equal((await postCharge(app.port, route, { tenant, key })).status, 201);
        const other = await postCharge(app.port, route, { tenant, key, body: { amount: 501, currency: 'eur' } });
        assert.ok(isProblem(other, 422), `${other.status} ${other.body}`);
        assert.equal(await chargeCount(pool, tenant), 1);
        // The key is scoped by tenant: the same key elsewhere is a new request.
        const elsewhere = await postCharge(app.port, route, { tenant: tenant + '_b', key, body: { amount: 501, currency: 'eur' } });
        assert.equal(elsewhere.status, 201);
      });

      test(`${route}: 12 concurrent identical requests make one charge`, async () => {
        const tenant = newTenant();
        const key = quoted(newKey());
        const answers = await Promise.all(Array.from({ length: 12 }, () => postCharge(app.port, route, { tenant, key })));
        const fresh = answers.filter((r) => r.status === 201 && r.headers['idempotent-replayed'] === undefined);
        const replays = answers.filter((r) => r.status === 201 && r.headers['idempotent-replayed'] === 'true');
        const busy = answers.filter((r) => isProblem(r, 409) && Number(r.headers['retry-after']) >= 1);
        assert.equal(fresh.length, 1, answers.map((r) => r.status).join(','));
        assert.equal(fresh.length + replays.length + busy.length, 12, answers.map((r) => `${r.status} ${r.body}`).join('\n'));
        for (const r of replays) assert.equal(r.body, fresh[0].body);
        if (route === '/charges') assert.equal(busy.length, 0, 'same-transaction duplicates wait and replay');
        assert.equal(await chargeCount(pool, tenant), 1);
      });

      test(`${route}: a body that is not a charge is 400 and leaves the key free`, async () => {
        const tenant = newTenant();
        const key = quoted(newKey());
        const bad = await postCharge(app.port, route, { tenant, key, body: { amount: -5, currency: 'eur' } });
        assert.ok(isProblem(bad, 400), `${bad.status} ${bad.body}`);
        const notJson = await postCharge(app.port, route, { tenant, key, body: '{"amount": "lots"' });
        assert.ok(isProblem(notJson, 400), `${notJson.status} ${notJson.body}`);
        assert.equal(await keyCount(pool, tenant), 0);
        const good = await postCharge(app.port, route, { tenant, key });
        assert.equal(good.status, 201);
        assert.equal(good.headers['idempotent-replayed'], undefined);
      });
    }

    test('missing, malformed or duplicated Idempotency-Key: 400 problem+json (control characters but the tab: Node\'s own bare 400) before anything is claimed', async () => {
      const tenant = newTenant();
      const cases = [
        ['missing', undefined],
        ['a bare value with a space', 'a b'],
        ['a bare value with a comma', 'a,b'],
        ['empty string', '""'],
        ['256 characters', quoted('k'.repeat(256))],
        ['no closing quote', '"abc'],
        ['parameters', '"abc";p=1'],
        ['a list of two strings', '"a", "b"'],
        ['duplicated field line', ['"k-a"', '"k-b"']],
      ];
      for (const route of ['/charges', '/charges/external']) {
        for (const [name, key] of cases) {
          const r = await postCharge(app.port, route, { tenant, key });
          assert.ok(isProblem(r, 400), `${route} ${name}: ${r.status} ${r.body}`);
        }
        const body = JSON.stringify({ amount: 500, currency: 'eur' });
        const raw = (value) => rawRequest(app.port, [`POST ${route} HTTP/1.1`, 'Host: x', `X-Api-Key: ${tenant}`,
          'Content-Type: application/json', `Idempotency-Key: ${value}`], body);
        // What the README says: a tab or a non-ASCII byte reaches the middleware (its 400 problem);
        // any other control character is refused by Node's HTTP parser first, with the server's
        // own 400 (Node's bare one; Fastify's clientErrorHandler answers it as JSON).
        for (const value of ['"a\tb"', 'a\tb', '"caf\xe9"', 'caf\xe9']) {
          const r = await raw(value);
          assert.match(r.text, /^HTTP\/1\.1 400 [^]*\r\ncontent-type: application\/problem\+json\r\n/i, `${route} ${JSON.stringify(value)}: ${r.text}`);
        }
        const ownBadRequest = framework === 'express' ? 'HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n'
          : 'HTTP/1.1 400 Bad Request\r\nContent-Length: 65\r\nContent-Type: application/json\r\n\r\n' +
            '{"error":"Bad Request","message":"Client Error","statusCode":400}';
        for (const c of [0x00, 0x01, 0x08, 0x0b, 0x1f, 0x7f]) {
          const r = await raw(`"a${String.fromCharCode(c)}b"`);
          assert.equal(r.text, ownBadRequest, `${route} U+${c.toString(16)}`);
        }
      }
      assert.equal(await keyCount(pool, tenant), 0);
      assert.equal(await chargeCount(pool, tenant), 0);
      const long = await postCharge(app.port, '/charges', { tenant, key: quoted('k'.repeat(255)) });
      assert.equal(long.status, 201, '255 characters are accepted');
      const escaped = await postCharge(app.port, '/charges', { tenant, key: '"a\\"b\\\\c"' });
      assert.equal(escaped.status, 201);
      assert.ok(await lookup(`${tenant}:POST /charges`, 'a"b\\c'), 'the escapes are undone before the claim');
      const bare = newKey();
      const unquoted = await postCharge(app.port, '/charges', { tenant, key: bare });
      assert.equal(unquoted.status, 201, `a bare key of token characters is accepted: ${unquoted.body}`);
      const sameKeyQuoted = await postCharge(app.port, '/charges', { tenant, key: quoted(bare) });
      assert.equal(sameKeyQuoted.headers['idempotent-replayed'], 'true', 'bare and quoted are the same key');
    });

    test('missing tenant: 401 problem+json, nothing claimed', async () => {
      for (const route of ['/charges', '/charges/external']) {
        const r = await postCharge(app.port, route, { tenant: null, key: quoted(newKey()) });
        assert.ok(isProblem(r, 401), `${r.status} ${r.body}`);
      }
    });

    test('a slow committed-first handler: 409 with Retry-After from the real lease, renewed while it runs', async () => {
      const tenant = newTenant();
      const key = newKey();
      const slow = postCharge(app.port, '/charges/external', {
        tenant, key: quoted(key), headers: { 'X-Fault-Delay-Ms': String(LEASE_MS * 3) },
      });
      await waitInProgress(pool, `${tenant}:POST /charges/external`, key);
      const busy = await postCharge(app.port, '/charges/external', { tenant, key: quoted(key) });
      const row = await lookup(`${tenant}:POST /charges/external`, key);
      assert.ok(isProblem(busy, 409), `${busy.status} ${busy.body}`);
      const retryAfter = Number(busy.headers['retry-after']);
      const leaseLeft = Math.ceil((row.locked_until - row.now) / 1000);
      assert.ok(Number.isInteger(retryAfter) && retryAfter >= 1, busy.headers['retry-after']);
      assert.ok(Math.abs(retryAfter - leaseLeft) <= 1, `Retry-After ${retryAfter}, lease ends in ${leaseLeft} s`);
      assert.ok(retryAfter <= Math.ceil(LEASE_MS / 1000), `Retry-After ${retryAfter} is not longer than the lease`);
      await sleep(LEASE_MS + 200); // past the first lease: still 409, because the lease was renewed
      const still = await postCharge(app.port, '/charges/external', { tenant, key: quoted(key) });
      assert.ok(isProblem(still, 409), `after the first lease: ${still.status} ${still.body}`);
      const first = await slow;
      assert.equal(first.status, 201);
      const replay = await postCharge(app.port, '/charges/external', { tenant, key: quoted(key) });
      assert.equal(replay.headers['idempotent-replayed'], 'true');
      assert.equal(replay.body, first.body);
      assert.equal(await chargeCount(pool, tenant), 1);
    });

    test('a committed-first handler failing before its side effect: 500, the key is released and runs anew', async () => {
      const tenant = newTenant();
      const key = newKey();
      const failed = await postCharge(app.port, '/charges/external', {
        tenant, key: quoted(key), headers: { 'X-Fault-Fail-Before': '1' },
      });
      assert.ok(isProblem(failed, 500), `${failed.status} ${failed.body}`);
      assert.equal(await lookup(`${tenant}:POST /charges/external`, key), null);
      const retry = await postCharge(app.port, '/charges/external', { tenant, key: quoted(key) });
      assert.equal(retry.status, 201);
      assert.equal(retry.headers['idempotent-replayed'], undefined);
      assert.equal(await chargeCount(pool, tenant), 1);
    });
  });
}
