// How many round trips to PostgreSQL a protected request costs, seen on the wire: the demo servers
// (real HTTP) talk to the database through a TCP proxy that records what the application sends in
// each of its turns (a turn: the bytes it sends before the server answers). Also that the
// same-transaction claim is deferred (extension 0.6.0) and the committed-first one is not: on the
// wire, and from another session while the handler runs.
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, describe, test } from 'node:test';
import { DATABASE_URL, newKey, newPool, newTenant, postCharge, quoted, sleep, startDemo, waitInProgress } from './harness.js';

/**
 * Records each client turn once a connection's startup is over (after the server's first
 * ReadyForQuery). While `holdRollback` is set, a turn holding ROLLBACK is kept back until
 * `release()`.
 */
async function turnRecorder(upstream) {
  const recorder = { turns: [], holdRollback: false, holding: null, release: () => {} };
  let sawHold;
  recorder.holding = new Promise((resolve) => (sawHold = resolve));
  const server = net.createServer((client) => {
    const db = net.connect(upstream.port, upstream.host);
    let ready = false;
    let turn = null;
    let pending = Buffer.alloc(0);
    client.on('data', (data) => {
      if (ready) {
        if (turn === null) recorder.turns.push((turn = []));
        turn.push(data);
      }
      if (recorder.holdRollback && data.includes('ROLLBACK')) {
        client.pause();
        sawHold();
        recorder.release = () => {
          db.write(data);
          client.resume();
        };
        return;
      }
      db.write(data);
    });
    db.on('data', (data) => {
      turn = null;
      pending = Buffer.concat([pending, data]);
      while (pending.length >= 5 && pending.length >= 1 + pending.readUInt32BE(1)) {
        if (pending[0] === 0x5a) ready = true; // 'Z': ReadyForQuery
        pending = pending.subarray(1 + pending.readUInt32BE(1));
      }
      client.write(data);
    });
    client.on('close', () => db.destroy());
    db.on('close', () => client.destroy());
    client.on('error', () => db.destroy());
    db.on('error', () => client.destroy());
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  recorder.url = (() => {
    const u = new URL(DATABASE_URL);
    u.hostname = '127.0.0.1';
    u.port = String(server.address().port);
    return u.toString();
  })();
  recorder.close = () => new Promise((resolve) => server.close(resolve));
  return recorder;
}

const WORDS = ['BEGIN', 'idem_claim', 'INSERT INTO charges', 'idem_complete', 'COMMIT', 'ROLLBACK'];

/** Each turn since `mark` as the statements it carries. */
function shape(recorder, mark) {
  return recorder.turns.slice(mark).map((chunks) => {
    const text = Buffer.concat(chunks).toString('utf8');
    const found = WORDS.filter((w) => text.includes(w));
    return found.length ? found.join(' + ') : 'other';
  });
}

/** The text of the first turn since `mark` that holds a claim. */
function claimTurn(recorder, mark) {
  return recorder.turns.slice(mark).map((chunks) => Buffer.concat(chunks).toString('utf8')).find((t) => t.includes('idem_claim'));
}

const pool = newPool();
after(() => pool.end());

/** The sessions holding a key lock (pg_locks: advisory, objsubid 7649), once there is one. */
async function keyLockHolders() {
  for (let i = 0; i < 250; i++) {
    const { rows } = await pool.query(`
      SELECT a.pid, a.backend_xid IS NULL AS no_transaction_id, a.state
      FROM pg_locks l JOIN pg_stat_activity a USING (pid)
      WHERE l.locktype = 'advisory' AND l.objsubid = 7649 AND l.granted`);
    if (rows.length > 0) return rows;
    await sleep(20);
  }
  throw new Error('no session took a key lock');
}

async function keyRows(scope, key) {
  const { rows } = await pool.query('SELECT status::text FROM idempotency.keys WHERE scope = $1 AND key = $2', [scope, key]);
  return rows.map((r) => r.status);
}

async function settle(recorder, mark, want) {
  for (let i = 0; i < 500 && shape(recorder, mark).length < want; i++) await sleep(20);
  await sleep(200); // a ROLLBACK sent after the answer comes after it
  return shape(recorder, mark);
}

const upstream = new URL(DATABASE_URL);

for (const framework of ['express', 'fastify']) {
  describe(`round trips (${framework})`, async () => {
    const recorder = await turnRecorder({ host: upstream.hostname, port: Number(upstream.port) });
    const demo = await startDemo(framework, { databaseUrl: recorder.url });
    after(async () => {
      recorder.release();
      await demo.stop();
      await recorder.close();
    });
    const tenant = newTenant();
    const key = quoted(newKey());

    test('a fresh key: BEGIN with the claim, the insert, idem_complete with COMMIT', async () => {
      assert.equal((await postCharge(demo.port, '/charges', { tenant, key: quoted(newKey()) })).status, 201);
      const mark = recorder.turns.length;
      assert.equal((await postCharge(demo.port, '/charges', { tenant, key })).status, 201);
      assert.deepEqual(await settle(recorder, mark, 3),
        ['BEGIN + idem_claim', 'INSERT INTO charges', 'idem_complete + COMMIT']);
    });

    test('a replay: one round trip, then ROLLBACK', async () => {
      const mark = recorder.turns.length;
      const r = await postCharge(demo.port, '/charges', { tenant, key });
      assert.equal(r.headers['idempotent-replayed'], 'true');
      assert.deepEqual(await settle(recorder, mark, 2), ['BEGIN + idem_claim', 'ROLLBACK']);
    });

    test('the same-transaction claim is deferred: while the handler runs, no row and no transaction id, the key lock held', async () => {
      const fresh = newKey();
      const mark = recorder.turns.length;
      const slow = postCharge(demo.port, '/charges', { tenant, key: quoted(fresh), headers: { 'X-Fault-Delay-Ms': '1000' } });
      const holders = await keyLockHolders();
      assert.deepEqual(holders.map(({ no_transaction_id, state }) => ({ no_transaction_id, state })),
        [{ no_transaction_id: true, state: 'idle in transaction' }], 'the claim wrote nothing');
      assert.deepEqual(await keyRows(`${tenant}:POST /charges`, fresh), []);
      assert.equal((await slow).status, 201);
      assert.deepEqual(await keyRows(`${tenant}:POST /charges`, fresh), ['completed']);
      assert.match(claimTurn(recorder, mark), /, deferred => true\)/);
    });

    test('the committed-first claim is not deferred: its in_progress record is there while the handler runs', async () => {
      const fresh = newKey();
      const mark = recorder.turns.length;
      const slow = postCharge(demo.port, '/charges/external', { tenant, key: quoted(fresh), headers: { 'X-Fault-Delay-Ms': '500' } });
      await waitInProgress(pool, `${tenant}:POST /charges/external`, fresh);
      assert.equal((await slow).status, 201);
      const text = claimTurn(recorder, mark);
      assert.ok(text, 'the claim went through the recorder');
      assert.doesNotMatch(text, /deferred/);
    });

    test('a replay is answered while its ROLLBACK is still held back', async () => {
      recorder.holdRollback = true;
      try {
        const r = await postCharge(demo.port, '/charges', { tenant, key });
        assert.equal(r.status, 201);
        assert.equal(r.headers['idempotent-replayed'], 'true');
        await recorder.holding;
      } finally {
        recorder.holdRollback = false;
        recorder.release();
      }
      const again = await postCharge(demo.port, '/charges', { tenant, key });
      assert.equal(again.headers['idempotent-replayed'], 'true');
    });
  });
}
