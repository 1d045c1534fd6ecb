// sqlLiteral, the escaping of the simple-protocol strings the same-transaction path sends (BEGIN
// with the claim, idem_complete with COMMIT): hostile text read back unchanged by the server,
// whatever standard_conforming_strings says, and as the claim's scope and key.
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { IdempotencyClient, sqlLiteral } from '../src/client.js';
import { newPool } from './harness.js';

const pool = newPool();
after(() => pool.end());

const HOSTILE = [
  "'", "''", "\\", "\\\\'", "\\'; DROP TABLE idempotency.keys; --", "E'x'", "$$", "$1", "a'b\\c\"d",
  "'); COMMIT; SELECT ('", 'é€𝄞 ключ キー', '\\x41\\u0041\\101', "\\'\\'", ' ',
  '\u2028\u2029\uFEFF', `${'\\'.repeat(7)}${"'".repeat(7)}`,
];

for (const scs of ['on', 'off']) {
  test(`hostile text comes back unchanged (standard_conforming_strings = ${scs})`, async () => {
    const db = await pool.connect();
    try {
      await db.query(`SET standard_conforming_strings = ${scs}`);
      await db.query('SET escape_string_warning = off');
      for (const text of HOSTILE) {
        const r = await db.query(`SELECT ${sqlLiteral(text)}::text AS t; SELECT 1 AS one`);
        assert.equal(r[0].rows[0].t, text);
        assert.equal(r[1].rows[0].one, 1);
      }
    } finally {
      await db.query('RESET standard_conforming_strings; RESET escape_string_warning');
      db.release();
    }
  });
}

test('NULL for null and undefined; NUL refused before anything is sent', () => {
  assert.equal(sqlLiteral(null), 'NULL');
  assert.equal(sqlLiteral(undefined), 'NULL');
  assert.throws(() => sqlLiteral('a\u0000b'), /NUL/);
});

test('hostile scopes and keys claimed and completed through BEGIN + claim, complete + COMMIT', async () => {
  const db = await pool.connect();
  try {
    const idem = new IdempotencyClient(db);
    for (const text of HOSTILE) {
      const scope = `lit ${text}`;
      const key = `k ${text} ${Math.random()}`;
      const c = await idem.beginAndClaim(scope, key, { fingerprint: `fp ${text}` });
      assert.equal(c.outcome, 'claimed');
      const body = await idem.completeAndCommit(scope, key, c.token, 201,
        { bodyJson: JSON.stringify({ text }), headers: { Location: text } });
      assert.deepEqual(JSON.parse(body), { text });
      const stored = await idem.lookup(scope, key);
      assert.equal(stored.status, 'completed');
      assert.equal(stored.fingerprint, `fp ${text}`);
      assert.deepEqual(stored.responseHeaders, { Location: text });
      assert.deepEqual(stored.responseBody, { text });
    }
  } finally {
    db.release();
  }
});

test('a failed idem_complete skips COMMIT and leaves the transaction to roll back', async () => {
  const db = await pool.connect();
  try {
    const idem = new IdempotencyClient(db);
    const key = `k-${Math.random()}`;
    const c = await idem.beginAndClaim('lit-fail', key);
    await assert.rejects(idem.completeAndCommit('lit-fail', key, '00000000-0000-0000-0000-000000000000', 201,
      { bodyJson: '{}' }), (e) => e.code === 'IK002');
    await assert.rejects(db.query('SELECT 1'), (e) => e.code === '25P02'); // still in the aborted transaction
    await db.query('ROLLBACK');
    assert.equal(await idem.lookup('lit-fail', key), null);
    assert.ok(c.token);
  } finally {
    db.release();
  }
});
