// The sending side (docs/sending.md): a request to another service with an Idempotency-Key made
// once per business operation and kept in your database. `prepare` runs in your transaction;
// a Sender delivers right after COMMIT (one attempt) or runs as a worker (retries with backoff,
// jitter and the retry budget, all decided by the extension).
import { mapError } from './errors.js';
import { intervalText } from './client.js';

export const SEND_CHANNEL = 'idempotency_send';

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

const SEND_SQL = `
SELECT key, state, attempts, next_attempt_at, response_status, response_body, response_headers
FROM idempotency.idem_send($1, $2, $3, $4::jsonb, $5, $6::interval)`;

const NEXT_SQL = `
SELECT scope, operation, target, key, request, attempt, token::text AS token, locked_until, give_up_at
FROM idempotency.idem_send_next(target => $1, max_rows => $2, lease => $3::interval, scope => $4, operation => $5)`;

const RESULT_SQL = `
SELECT state, attempts, next_attempt_at
FROM idempotency.idem_send_result($1, $2, $3::uuid, $4, $5, $6::jsonb, $7::interval, $8)`;

const ROW_SQL = `
SELECT state, attempts, next_attempt_at, last_status, last_error, response_status, response_body, response_headers, key
FROM idempotency.outbound WHERE scope = $1 AND operation = $2`;

async function query(db, sql, args) {
  try {
    return await db.query(sql, args);
  } catch (e) {
    throw mapError(e);
  }
}

/**
 * Records the send in the caller's open transaction (`client`: the pg.Client or PoolClient that
 * runs it; never commits) and returns { key, state, attempts, nextAttemptAt, response }. The same
 * operation again returns the same key.
 */
export async function prepare(client, scope, operation, target, request = null, { key = null, giveUpAfter = null } = {}) {
  const { rows } = await query(client, SEND_SQL, [scope, operation, target,
    request === null || request === undefined ? null : JSON.stringify(request), key, intervalText(giveUpAfter)]);
  const r = rows[0];
  return {
    key: r.key, state: r.state, attempts: r.attempts, nextAttemptAt: r.next_attempt_at,
    response: r.state === 'done' ? delivered(r.response_status, r.response_headers, r.response_body) : null,
  };
}

const delivered = (status, headers, body) => ({ kind: 'delivered', status, headers: headers ?? {}, body });

/**
 * Sends due requests: `deliver` (one operation, right after COMMIT) and `run` (a worker).
 * `urls` maps a target to the URL its requests are POSTed to (the request as JSON, with the
 * target's extra `headers`), or `send(attempt)` is your own function returning
 * { status, headers, body } or { status: null, error } for no answer. `timeoutMs` bounds one
 * attempt and must stay below `leaseMs`, the time a sender holds a send.
 */
export class Sender {
  constructor(pool, { urls = {}, send = null, headers = {}, timeoutMs = 10000, leaseMs = 30000, concurrency = 4,
    pollIntervalMs = 1000, onAttempt = null, onFinished = null } = {}) {
    if (!send && Object.keys(urls).length === 0) throw new TypeError('give urls (a URL per target) or send (a function)');
    if (timeoutMs >= leaseMs) throw new RangeError('timeoutMs must be shorter than leaseMs');
    Object.assign(this, { pool, urls, headers, timeoutMs, leaseMs, concurrency: Math.max(1, concurrency),
      pollIntervalMs, onAttempt, onFinished });
    this.sendFn = send ?? ((attempt) => this.httpSend(attempt));
  }

  async httpSend(attempt) {
    const url = this.urls[attempt.target];
    if (!url) return { status: null, error: `no URL for target ${attempt.target}` };
    try {
      const r = await fetch(url, {
        method: 'POST',
        headers: { ...(this.headers[attempt.target] ?? {}), 'Idempotency-Key': keyHeader(attempt.key),
          'Content-Type': 'application/json' },
        body: JSON.stringify(attempt.request),
        signal: AbortSignal.timeout(this.timeoutMs),
      });
      const headers = {};
      r.headers.forEach((v, k) => { headers[k.toLowerCase()] = v; });
      return { status: r.status, headers, body: await r.text() };
    } catch (e) {
      if (e.name === 'TimeoutError' || e.name === 'AbortError') return { status: null, error: 'timed out' };
      return { status: null, error: `connection failed: ${e.cause?.code ?? e.cause?.message ?? e.message}` };
    }
  }

  /** One HTTP attempt of a send this sender holds, and its result recorded. */
  async attempt(attempt) {
    let answer;
    try {
      answer = await this.sendFn(attempt);
    } catch (e) {
      answer = { status: null, error: `${e.name}: ${e.message}` };
    }
    if (this.onAttempt) this.onAttempt(attempt, answer);
    return this.record(attempt, answer);
  }

  async record(attempt, answer) {
    const status = answer.status ?? null;
    const retryAfter = status === null ? null : parseRetryAfter(answer.headers?.['retry-after']);
    let row;
    try {
      ({ rows: [row] } = await this.pool.query(RESULT_SQL, [attempt.scope, attempt.operation, attempt.token, status,
        answer.body ?? null, status === null ? null : JSON.stringify(answer.headers ?? {}), intervalText(retryAfter),
        answer.error ?? null]));
    } catch (e) {
      if (e.code === 'IK002') return { kind: 'lost', scope: attempt.scope, operation: attempt.operation };
      throw mapError(e);
    }
    let result;
    if (row.state === 'done') result = delivered(status, answer.headers ?? {}, answer.body ?? null);
    else if (row.state === 'gave_up') result = { kind: 'unknown', key: attempt.key, attempts: row.attempts, lastStatus: status, lastError: answer.error ?? null };
    else result = { kind: 'not_yet', state: row.state, attempts: row.attempts, nextAttemptAt: row.next_attempt_at, lastStatus: status, lastError: answer.error ?? null };
    if (this.onFinished && result.kind !== 'not_yet') this.onFinished(attempt, result);
    return result;
  }

  async take(target, maxRows, scope = null, operation = null) {
    const { rows } = await query(this.pool, NEXT_SQL, [target, maxRows, intervalText(this.leaseMs), scope, operation]);
    return rows.map((r) => ({ scope: r.scope, operation: r.operation, target: r.target, key: r.key, request: r.request,
      attempt: r.attempt, token: r.token, lockedUntil: r.locked_until, giveUpAt: r.give_up_at }));
  }

  /**
   * Right after the COMMIT that prepared it: one attempt of this send, if it is due and no other
   * sender holds it; otherwise (or after a retryable answer) where it is now. Retries are the worker's.
   */
  async deliver(scope, operation) {
    const [taken] = await this.take(null, 1, scope, operation);
    return taken ? this.attempt(taken) : this.status(scope, operation);
  }

  /** Where the send is now, from its row. */
  async status(scope, operation) {
    const { rows: [r] } = await query(this.pool, ROW_SQL, [scope, operation]);
    if (!r) throw new RangeError(`no outbound record for operation ${operation} in scope ${scope}`);
    if (r.state === 'done') return delivered(r.response_status, r.response_headers, r.response_body);
    if (r.state === 'gave_up') return { kind: 'unknown', key: r.key, attempts: r.attempts, lastStatus: r.last_status, lastError: r.last_error };
    return { kind: 'not_yet', state: r.state, attempts: r.attempts, nextAttemptAt: r.next_attempt_at, lastStatus: r.last_status, lastError: r.last_error };
  }

  /** One round: up to `concurrency` due sends, attempted at once. Returns how many. */
  async runOnce(target = null) {
    const taken = await this.take(target, this.concurrency);
    await Promise.all(taken.map((a) => this.attempt(a)));
    return taken.length;
  }

  async idle(target = null) {
    const { rows: [r] } = await query(this.pool,
      `SELECT NOT EXISTS (SELECT FROM idempotency.outbound WHERE state IN ('pending', 'sending')
         AND ($1::text IS NULL OR target = $1)) AS idle`, [target]);
    return r.idle;
  }

  /**
   * The worker: rounds of runOnce while there is due work; between them it waits for a NOTIFY on
   * idempotency_send (a send committed) or pollIntervalMs, whichever first. Stops when `signal`
   * aborts (after the attempts in flight are recorded) or, with untilIdle, when nothing of the
   * target is left. LISTEN needs a session of its own: not through PgBouncer's transaction pooling.
   */
  async run(target = null, { signal = null, untilIdle = false } = {}) {
    const listener = await this.pool.connect();
    let wake = null;
    const onNotify = () => wake?.();
    listener.on('notification', onNotify);
    try {
      await listener.query(`LISTEN ${SEND_CHANNEL}`);
      while (!signal?.aborted) {
        if (await this.runOnce(target)) continue;
        if (untilIdle && await this.idle(target)) return;
        await new Promise((resolve) => {
          const done = () => {
            clearTimeout(timer);
            signal?.removeEventListener('abort', done);
            resolve();
          };
          const timer = setTimeout(done, this.pollIntervalMs);
          wake = done;
          signal?.addEventListener('abort', done, { once: true });
        });
        wake = null;
      }
    } finally {
      listener.off('notification', onNotify);
      try {
        await listener.query(`UNLISTEN ${SEND_CHANNEL}`);
        listener.release();
      } catch {
        listener.release(true);
      }
    }
  }
}
