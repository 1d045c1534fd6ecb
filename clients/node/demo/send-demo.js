#!/usr/bin/env node
// The sender demo (tests/sending/README.md's protocol): orders whose charge is sent to a receiver
// with an Idempotency-Key made once, in the order's transaction.
//   node demo/send-demo.js prepare COUNT PREFIX | work [--until-idle] [--concurrency N] | inline COUNT PREFIX
// Environment: DATABASE_URL, RECEIVER_URL, TARGET (receiver), SEND_LEASE_MS (30000),
// SEND_TIMEOUT_MS (10000), RECEIVER_API_KEY (sent as X-Api-Key; send-demo), and the sender's own
// settings when set: SEND_RETRY_BUDGET, SEND_BACKOFF_BASE_MS, SEND_BACKOFF_CAP_MS, SEND_GIVE_UP_AFTER_MS.
//
// A sender the package refuses (SEND_TIMEOUT_MS >= SEND_LEASE_MS, a bad setting) prints
// `refused MESSAGE` and exits 2. The worker prints `db-error CLASS_OR_SQLSTATE MESSAGE` for each
// database error its loop meets and `db-reconnected` when it works again (the Sender's onDbError
// and onDbReconnected); its log lines go to stderr.
import pg from 'pg';
import { Sender } from '../src/index.js';

const SCOPE = 'send-demo';
const SCHEMA = `CREATE TABLE IF NOT EXISTS send_demo_orders (id text PRIMARY KEY, amount int NOT NULL,
  payment_key text NOT NULL)`;
const USAGE = 'usage: send-demo.js prepare COUNT PREFIX | work [--until-idle] [--concurrency N] | inline COUNT PREFIX\n';
const env = process.env;
const target = env.TARGET || 'receiver';
const say = (line) => process.stdout.write(line + '\n');
const stderrLogger = { info: (m) => process.stderr.write(m + '\n'), warn: (m) => process.stderr.write(m + '\n') };

function describe(r) {
  if (r.kind === 'delivered') return ['done', String(r.status)];
  if (r.kind === 'unknown') return ['gave_up', 'unknown'];
  if (r.kind === 'not_yet') return [r.state, 'unknown'];
  return ['lost', 'unknown'];
}

/** An optional number from the environment: undefined when not set (the database's setting holds). */
function envNumber(name) {
  const v = env[name];
  return v === undefined || v === '' ? undefined : Number(v);
}

async function prepareOrders(pool, sender, count, prefix, afterCommit) {
  await pool.query(SCHEMA);
  const client = await pool.connect();
  try {
    for (let i = 1; i <= count; i++) {
      const order = `${prefix}-${i}`;
      const operation = `${order}:charge`;
      await client.query('BEGIN');
      try {
        const sent = await sender.prepare(client, SCOPE, operation, target, { amount: i, currency: 'eur' });
        await client.query('INSERT INTO send_demo_orders VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING',
          [order, i, sent.key]);
        await client.query('COMMIT');
      } catch (e) {
        await client.query('ROLLBACK');
        throw e;
      }
      if (afterCommit) await afterCommit(operation);
    }
  } finally {
    client.release();
  }
}

const [command, ...rest] = process.argv.slice(2);
if (!['prepare', 'work', 'inline'].includes(command)) {
  process.stderr.write(USAGE);
  process.exit(2);
}
const pool = new pg.Pool({ connectionString: env.DATABASE_URL, max: 8 });
pool.on('error', (e) => process.stderr.write(`an idle database connection failed: ${e.message}\n`));
let sender;
try {
  sender = new Sender(pool, {
    urls: { [target]: env.RECEIVER_URL },
    headers: { [target]: { 'X-Api-Key': env.RECEIVER_API_KEY || 'send-demo' } },
    leaseMs: Number(env.SEND_LEASE_MS || 30000), timeoutMs: Number(env.SEND_TIMEOUT_MS || 10000),
    retryBudget: envNumber('SEND_RETRY_BUDGET'), backoffBaseMs: envNumber('SEND_BACKOFF_BASE_MS'),
    backoffCapMs: envNumber('SEND_BACKOFF_CAP_MS'), giveUpAfterMs: envNumber('SEND_GIVE_UP_AFTER_MS'),
    concurrency: rest.includes('--concurrency') ? Number(rest[rest.indexOf('--concurrency') + 1]) : 4,
    pollIntervalMs: 200, logger: stderrLogger,
    onAttempt: (a, answer) => say(`attempt ${a.operation} ${a.attempt} ${answer.status ?? 'none'}`),
    onFinished: (a, r) => say(`finished ${a.operation} ${describe(r).join(' ')}`),
    onDbError: (_e, { code, message }) => say(`db-error ${code} ${message}`),
    onDbReconnected: () => say('db-reconnected'),
  });
} catch (e) {
  if (!(e instanceof RangeError || e instanceof TypeError)) throw e;
  say(`refused ${e.message}`);
  await pool.end();
  process.exit(2);
}
try {
  if (command === 'prepare') {
    await prepareOrders(pool, sender, Number(rest[0]), rest[1]);
    say(`prepared ${rest[0]}`);
  } else if (command === 'inline') {
    await prepareOrders(pool, sender, Number(rest[0]), rest[1], async (operation) => {
      say(`delivered ${operation} ${describe(await sender.deliver(SCOPE, operation)).join(' ')}`);
    });
  } else {
    const stop = new AbortController();
    process.on('SIGTERM', () => stop.abort());
    await sender.run(target, { signal: stop.signal, untilIdle: rest.includes('--until-idle') });
  }
} finally {
  sender.close();
  await pool.end();
}
