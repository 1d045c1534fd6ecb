// The sending side's pure rules (docs/sending.md): the key header, Retry-After, what a sender
// accepts as its timeout and its own settings, the worker's wait between reconnections, and how a
// database error is named in its log. No I/O here: test/unit.test.js tests them as they are.
import { isUnavailable } from './errors.js';

/** The Idempotency-Key header's value: an RFC 8941 sf-string. */
export function keyHeader(key) {
  return '"' + key.replace(/[\\"]/g, (c) => '\\' + c) + '"';
}

/** A longer Retry-After is read as this (1000 years): past any give_up_at, within an interval. */
export const MAX_RETRY_AFTER_MS = 365000 * 86400 * 1000;

/** Retry-After as delta-seconds or an HTTP date, in milliseconds (at most MAX_RETRY_AFTER_MS); null when absent or unreadable. */
export function parseRetryAfter(value, now = Date.now()) {
  if (value === undefined || value === null) return null;
  const v = String(value).trim();
  if (/^\d+$/.test(v)) return Math.min(Number(v) * 1000, MAX_RETRY_AFTER_MS);
  const when = Date.parse(v);
  if (Number.isNaN(when)) return null;
  return Math.min(Math.max(0, when - now), MAX_RETRY_AFTER_MS);
}

// The extension's limits of its settings (docs/reference.md): a budget of at most 1,000,000,
// intervals of at most 10000 years, which PostgreSQL compares as 120000 months of 30 days.
export const MAX_RETRY_BUDGET = 1_000_000;
export const MAX_INTERVAL_MS = 10000 * 12 * 30 * 86400 * 1000;

const isNumber = (v) => typeof v === 'number' && Number.isFinite(v);

/** `value` if it is a positive number of milliseconds of at most 10000 years; a RangeError naming `name` otherwise. */
export function checkInterval(name, value) {
  if (!isNumber(value) || value <= 0 || value > MAX_INTERVAL_MS) {
    throw new RangeError(`${name} must be a positive number of milliseconds, at most 10000 years (got ${String(value)})`);
  }
  return value;
}

/**
 * A sender's timeout bounds each attempt and must end before its lease does: an attempt that
 * outlives its lease runs beside the attempt of the sender that took the send over.
 */
export function checkTimeout(timeoutMs, leaseMs) {
  checkInterval('leaseMs', leaseMs);
  if (!isNumber(timeoutMs) || timeoutMs <= 0) {
    throw new RangeError(`timeoutMs must be a positive number of milliseconds (got ${String(timeoutMs)})`);
  }
  if (timeoutMs >= leaseMs) {
    throw new RangeError(`timeoutMs (${timeoutMs} ms) must be below the lease (leaseMs, ${leaseMs} ms): an attempt `
      + 'that outlives its lease runs beside the attempt of the sender that takes the send over');
  }
}

/** An interval setting's value, exact to the microsecond. */
export function intervalSetting(ms) {
  const us = BigInt(Math.round(ms * 1000));
  return `${us / 1000000n}.${String(us % 1000000n).padStart(6, '0')} seconds`;
}

/**
 * The extension's settings a sender sets in each of its transactions, as [name, value] pairs
 * (checked here: a value the database refuses would fail every call); those not given (null or
 * undefined) stay the database's.
 */
export function settingValues({ retryBudget = null, backoffBaseMs = null, backoffCapMs = null } = {}) {
  const values = [];
  if (retryBudget !== null && retryBudget !== undefined) {
    if (!isNumber(retryBudget) || retryBudget < 0 || retryBudget > MAX_RETRY_BUDGET) {
      throw new RangeError(`retryBudget must be a number from 0 to ${MAX_RETRY_BUDGET} (got ${String(retryBudget)})`);
    }
    values.push(['idempotency.send_retry_budget', String(retryBudget)]);
  }
  for (const [name, value, setting] of [['backoffBaseMs', backoffBaseMs, 'send_backoff_base'],
    ['backoffCapMs', backoffCapMs, 'send_backoff_cap']]) {
    if (value !== null && value !== undefined) {
      values.push([`idempotency.${setting}`, intervalSetting(checkInterval(name, value))]);
    }
  }
  return values;
}

/**
 * Milliseconds to wait after the `failures`-th database error in a row: exponential backoff
 * with full jitter, anywhere from 0 to min(capMs, baseMs * 2^(failures - 1)).
 */
export function reconnectDelay(failures, baseMs, capMs, rand = Math.random) {
  return rand() * Math.min(capMs, baseMs * 2 ** Math.min(failures - 1, 60));
}

const SQLSTATE = /^[0-9A-Z]{5}$/;

function sqlstate(e) {
  for (let x = e, depth = 0; x && depth < 5; x = x.cause, depth++) {
    if (typeof x.code === 'string' && SQLSTATE.test(x.code)) return x.code;
  }
  return null;
}

/**
 * Whether `e` came from the database (node-postgres or pg-pool): an error with a SQLSTATE, or
 * the database unreachable (a refused connect, a connection lost). Anything else (a bug, an
 * error of the application's own callback) is not the worker's to outlive.
 */
export function isDatabaseError(e) {
  return sqlstate(e) !== null || isUnavailable(e);
}

/** A database error's SQLSTATE, else its class: the socket's code (ECONNREFUSED) or the error's name. */
export function errorCode(e) {
  return sqlstate(e) ?? (typeof e?.code === 'string' && e.code ? e.code : (e?.name || 'Error'));
}

/** An error's message on one line. */
export function firstLine(e) {
  const text = String(e?.message ?? e ?? '').trim();
  return text ? text.split(/\r?\n/)[0] : (e?.name || 'Error');
}
