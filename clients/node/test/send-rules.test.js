// The sending side's pure rules (src/send-rules.js): the timeout against the lease, the per-sender
// settings as the SQL gets them, the worker's backoff between reconnections, how a database error
// is told from others and named in the log. No database, no network.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import pg from 'pg';
import {
  MAX_INTERVAL_MS, MAX_RETRY_BUDGET, checkInterval, checkTimeout, errorCode, firstLine, intervalSetting, isDatabaseError,
  reconnectDelay, settingValues,
} from '../src/send-rules.js';
import { SerializationError, mapError } from '../src/errors.js';
import { Sender } from '../src/index.js';

test('the timeout must be a positive number of milliseconds below the lease', () => {
  checkTimeout(1000, 2000);
  checkTimeout(0.5, 1);
  assert.throws(() => checkTimeout(1500, 1500), /timeoutMs \(1500 ms\) must be below the lease \(leaseMs, 1500 ms\)/);
  assert.throws(() => checkTimeout(30000, 10000), RangeError);
  for (const bad of [0, -1, NaN, Infinity, '1000', null]) assert.throws(() => checkTimeout(bad, 5000), RangeError, String(bad));
  for (const bad of [0, -5, NaN, '30000', MAX_INTERVAL_MS + 1]) assert.throws(() => checkTimeout(100, bad), RangeError, String(bad));
});

test('a Sender refuses a timeout that is not below its lease, and a setting out of range, at construction', () => {
  const pool = new pg.Pool(); // never connects: nothing is queried here
  const urls = { t: 'http://receiver.invalid/charges' };
  try {
    assert.throws(() => new Sender(pool, { urls, timeoutMs: 1500, leaseMs: 1500 }), RangeError);
    assert.throws(() => new Sender(pool, { urls, timeoutMs: 40000 }), RangeError, 'the default lease is 30 s');
    assert.throws(() => new Sender(pool, { urls, retryBudget: -1 }), /retryBudget must be a number from 0 to 1000000/);
    assert.throws(() => new Sender(pool, { urls, backoffBaseMs: 0 }), /backoffBaseMs must be a positive number/);
    assert.throws(() => new Sender(pool, { urls, giveUpAfterMs: NaN }), /giveUpAfterMs must be a positive number/);
    const s = new Sender(pool, { urls, timeoutMs: 1000, leaseMs: 2000, retryBudget: 0, backoffCapMs: 20, giveUpAfterMs: 1500 });
    assert.deepEqual(s.settings, [['idempotency.send_retry_budget', '0'], ['idempotency.send_backoff_cap', '0.020000 seconds']]);
    assert.equal(s.giveUpAfterMs, 1500);
    s.close();
  } finally {
    pool.end();
  }
});

test('per-sender settings: only those given, checked, as the text set_config gets', () => {
  assert.deepEqual(settingValues(), []);
  assert.deepEqual(settingValues({ retryBudget: null, backoffBaseMs: undefined }), []);
  assert.deepEqual(settingValues({ retryBudget: 0.1, backoffBaseMs: 50, backoffCapMs: 300 }), [
    ['idempotency.send_retry_budget', '0.1'],
    ['idempotency.send_backoff_base', '0.050000 seconds'],
    ['idempotency.send_backoff_cap', '0.300000 seconds'],
  ]);
  assert.deepEqual(settingValues({ retryBudget: MAX_RETRY_BUDGET }), [['idempotency.send_retry_budget', '1000000']]);
  for (const bad of [-0.1, MAX_RETRY_BUDGET + 1, NaN, Infinity, '0.1']) {
    assert.throws(() => settingValues({ retryBudget: bad }), RangeError, String(bad));
  }
  for (const bad of [0, -1, NaN, '50ms', MAX_INTERVAL_MS * 2]) {
    assert.throws(() => settingValues({ backoffCapMs: bad }), /backoffCapMs must be a positive number of milliseconds/, String(bad));
  }
  assert.equal(checkInterval('x', MAX_INTERVAL_MS), MAX_INTERVAL_MS);
});

test('interval settings are exact to the microsecond, up to 10000 years', () => {
  assert.equal(intervalSetting(1), '0.001000 seconds');
  assert.equal(intervalSetting(1.5), '0.001500 seconds');
  assert.equal(intervalSetting(0.001), '0.000001 seconds');
  assert.equal(intervalSetting(90061001), '90061.001000 seconds');
  assert.equal(intervalSetting(MAX_INTERVAL_MS), '311040000000.000000 seconds');
});

test('reconnecting: exponential backoff with full jitter, capped', () => {
  const top = () => 1;
  assert.deepEqual([1, 2, 3, 4, 5, 6, 7].map((n) => reconnectDelay(n, 100, 5000, top)), [100, 200, 400, 800, 1600, 3200, 5000]);
  assert.equal(reconnectDelay(10000, 100, 5000, top), 5000, 'no overflow after many failures');
  assert.equal(reconnectDelay(3, 100, 5000, () => 0), 0);
  assert.equal(reconnectDelay(3, 100, 5000, () => 0.5), 200);
  for (let i = 0; i < 200; i++) {
    const d = reconnectDelay(4, 100, 5000);
    assert.ok(d >= 0 && d < 800, String(d));
  }
});

test('database errors: those with a SQLSTATE or of an unreachable database; named by SQLSTATE, else class', () => {
  // The shapes node-postgres gives: a server's ErrorResponse (severity, code), a socket error, a lost connection.
  const terminated = Object.assign(new Error('terminating connection due to administrator command\nmore'),
    { severity: 'FATAL', code: '57P01' });
  const refused = Object.assign(new Error('connect ECONNREFUSED (the server is down)'), { code: 'ECONNREFUSED', errno: -111 });
  const lost = new Error('Connection terminated unexpectedly');
  const deadlock = Object.assign(new Error('deadlock detected'), { severity: 'ERROR', code: '40P01' });
  const serialization = mapError(Object.assign(new Error('could not serialize access'), { severity: 'ERROR', code: '40001' }));
  assert.ok(serialization instanceof SerializationError);
  for (const e of [terminated, refused, lost, deadlock, serialization]) assert.ok(isDatabaseError(e), e.message);
  for (const e of [new TypeError('x is not a function'), new RangeError('bad'), new Error('a callback failed'), null]) {
    assert.ok(!isDatabaseError(e), String(e));
  }
  assert.deepEqual([terminated, refused, lost, deadlock, serialization].map(errorCode),
    ['57P01', 'ECONNREFUSED', 'Error', '40P01', '40001']);
  assert.equal(firstLine(terminated), 'terminating connection due to administrator command');
  assert.equal(firstLine(new Error('')), 'Error');
});
