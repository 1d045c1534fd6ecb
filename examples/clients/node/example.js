// The idempotency extension from Node.js (pg).
//
//   npm ci && DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres node example.js
//
// Runs, and checks, one claim / business write / complete / replay / mismatch cycle and a
// message consumer's idem_seen. The database needs `CREATE EXTENSION idempotency`. The last
// line is "node: N passed, M failed".
'use strict';
const crypto = require('node:crypto');
const { isDeepStrictEqual } = require('node:util');
const { Client } = require('pg');

const SCOPE = 'acct_42:POST /orders';
let passed = 0;
let failed = 0;
function check(name, ok, detail = '') {
  if (ok) passed++; else failed++;
  console.log((ok ? 'ok   ' : 'FAIL ') + name + (ok ? '' : `: ${detail}`));
}

// The usual way: claim, business write and stored response in one transaction.
// Resolves to { outcome, status, body }. (pg sends objects as JSON and parses jsonb back.)
async function createOrder(db, key, body) {
  await db.query('BEGIN');
  try {
    const { rows: [c] } = await db.query(
      `SELECT outcome, token, http_status, response_body
         FROM idempotency.idem_claim($1, $2, idempotency.idem_fingerprint($3::jsonb))`,
      [SCOPE, key, body]);
    if (c.outcome !== 'claimed' && c.outcome !== 'reclaimed') {
      await db.query('ROLLBACK'); // replay: stored 201 + body; in_progress: 409; mismatch: 422
      return { outcome: c.outcome, status: c.http_status, body: c.response_body };
    }
    const { rows: [order] } = await db.query(
      'INSERT INTO example_orders (item, qty) VALUES ($1, $2) RETURNING id', [body.item, body.qty]);
    const response = { order_id: Number(order.id), item: body.item, qty: body.qty };
    await db.query('SELECT idempotency.idem_complete($1, $2, $3, 201, $4::jsonb, $5::jsonb)',
      [SCOPE, key, c.token, response, { Location: `/orders/${order.id}` }]);
    await db.query('COMMIT');
    return { outcome: c.outcome, status: 201, body: response };
  } catch (e) {
    await db.query('ROLLBACK');
    throw e;
  }
}

// An at-least-once consumer: the de-duplication and the work commit together.
async function consume(db, messageId, body) {
  await db.query('BEGIN');
  try {
    const { rows: [{ first }] } = await db.query(
      "SELECT idempotency.idem_seen('orders-consumer', $1) AS first", [messageId]);
    if (first) {
      await db.query('INSERT INTO example_orders (item, qty) VALUES ($1, $2)', [body.item, body.qty]);
    }
    await db.query('COMMIT');
    return first;
  } catch (e) {
    await db.query('ROLLBACK');
    throw e;
  }
}

async function main() {
  if (!process.env.DATABASE_URL) {
    console.error('set DATABASE_URL, e.g. postgresql://postgres@127.0.0.1:5432/postgres');
    process.exit(2);
  }
  const db = new Client({ connectionString: process.env.DATABASE_URL });
  await db.connect();
  try {
    await db.query('CREATE TABLE IF NOT EXISTS example_orders (id bigserial PRIMARY KEY, item text, qty int)');
    const key = `node-${crypto.randomUUID()}`; // made once per business operation, outside any retry loop
    const body = { item: 'book', qty: 2 };

    const first = await createOrder(db, key, body);
    check('claim: claimed, the order is written, 201', first.outcome === 'claimed' && first.status === 201,
      JSON.stringify(first));

    const again = await createOrder(db, key, body);
    check('same key again: replay of the stored 201 and body',
      again.outcome === 'replay' && again.status === 201 && isDeepStrictEqual(again.body, first.body),
      JSON.stringify(again));

    const other = await createOrder(db, key, { item: 'book', qty: 3 });
    check('same key, another body: mismatch, 422', other.outcome === 'mismatch' && other.status === 422,
      JSON.stringify(other));

    const { rows: [{ n }] } = await db.query(
      'SELECT count(*)::int AS n FROM example_orders WHERE id = $1', [first.body.order_id]);
    check('one order written', n === 1, String(n));

    const messageId = `msg-${crypto.randomUUID()}`;
    check('idem_seen, first delivery: true', (await consume(db, messageId, body)) === true);
    check('idem_seen, redelivery: false', (await consume(db, messageId, body)) === false);
  } finally {
    await db.end();
  }
  console.log(`node: ${passed} passed, ${failed} failed`);
  process.exitCode = failed ? 1 : 0;
}

main().catch((e) => {
  console.error(e);
  console.log(`node: ${passed} passed, ${failed + 1} failed`);
  process.exit(1);
});
