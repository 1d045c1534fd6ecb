// The sending side (docs/sending.md): a request to another service with an Idempotency-Key made
// once per business operation and kept in your database. `prepare` runs in your transaction;
// a Sender delivers right after COMMIT (one attempt) or runs as a worker (retries with backoff,
// jitter and the retry budget, all decided by the extension). Each HTTP attempt is bounded in
// total by the sender's timeout (./bounded-http.js). The worker outlives its database: on any
// database error it logs it, reconnects with exponential backoff and full jitter, and goes on.
import { mapError, isUnavailable } from './errors.js';
import { intervalText } from './client.js';
import { HeldConnection, guardPool } from './connection.js';
import { BoundedClient, NoAnswer } from './bounded-http.js';
import {
  checkInterval, checkTimeout, errorCode, firstLine, isDatabaseError, keyHeader, parseRetryAfter, reconnectDelay,
  settingValues,
} from './send-rules.js';

export { keyHeader, parseRetryAfter, MAX_RETRY_AFTER_MS } from './send-rules.js';

export const SEND_CHANNEL = 'idempotency_send';

const SEND_SQL = `
SELECT key, state, attempts, next_attempt_at, response_status, response_body, response_headers
FROM idempotency.idem_send($1, $2, $3, $4::jsonb, $5, $6::interval)`;

const NEXT_SQL = `
SELECT scope, operation, target, key, request, attempt, token::text AS token, locked_until, give_up_at
FROM idempotency.idem_send_next(target => $1, max_rows => $2, lease => $3::interval, scope => $4, operation => $5)`;

const RESULT_SQL = `
SELECT state, attempts, next_attempt_at
FROM idempotency.idem_send_result($1, $2, $3::uuid, $4, $5, $6::jsonb, $7::interval, $8)`;

// The answers of a round, recorded in one statement (one round trip, one transaction), in the
// order given: idem_send_result once per element of the arrays.
const RESULTS_SQL = `
SELECT r.state, r.attempts, r.next_attempt_at
FROM unnest($1::text[], $2::text[], $3::uuid[], $4::int[], $5::text[], $6::jsonb[], $7::interval[], $8::text[])
       WITH ORDINALITY AS a(scope, operation, token, http_status, response_body, response_headers, retry_after, error, n),
     LATERAL idempotency.idem_send_result(a.scope, a.operation, a.token, a.http_status, a.response_body,
                                          a.response_headers, a.retry_after, a.error) AS r
ORDER BY a.n`;

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

/** Resolves after `ms`, or at once when `signal` aborts. */
function pause(ms, signal) {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener('abort', done, { once: true });
  });
}

/**
 * The worker's LISTEN session: a pool connection held for the whole run. A NOTIFY, the poll
 * interval or the stop signal ends a wait; the session failing (the backend terminated, the
 * server gone) makes the wait reject with its error, which the worker's loop handles.
 */
class Listener {
  static async open(pool) {
    const listener = new Listener(await pool.connect());
    try {
      await listener.client.query(`LISTEN ${SEND_CHANNEL}`);
    } catch (e) {
      listener.failed ??= e;
      await listener.close();
      throw e;
    }
    return listener;
  }

  constructor(client) {
    this.client = client;
    this.failed = null;
    this.notified = false;
    this.wake = null;
    this.onNotify = () => {
      this.notified = true;
      this.wake?.();
    };
    // node-postgres would crash the process with an 'error' of a held connection that has no listener.
    this.onError = (e) => {
      this.failed ??= e;
      this.wake?.();
    };
    this.onEnd = () => this.onError(new Error('Connection terminated: the LISTEN session ended'));
    client.on('notification', this.onNotify);
    client.on('error', this.onError);
    client.on('end', this.onEnd);
  }

  /** Until a NOTIFY (or one that came since the last wait), `ms`, or `signal`; rejects when the session failed. */
  wait(ms, signal) {
    return new Promise((resolve, reject) => {
      const done = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', done);
        this.wake = null;
        if (this.failed) return reject(this.failed);
        this.notified = false;
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.wake = done;
      signal?.addEventListener('abort', done, { once: true });
      if (this.failed || this.notified || signal?.aborted) done();
    });
  }

  async close() {
    if (!this.failed) {
      try {
        await this.client.query(`UNLISTEN ${SEND_CHANNEL}`);
      } catch (e) {
        this.failed = e;
      }
    }
    this.client.removeListener('notification', this.onNotify);
    this.client.removeListener('error', this.onError);
    this.client.removeListener('end', this.onEnd);
    this.client.release(this.failed ?? undefined);
  }
}

/**
 * Sends due requests: `deliver` (one operation, right after COMMIT) and `run` (a worker).
 *
 * `urls` maps a target to the URL its requests are POSTed to (the request as JSON, with the
 * target's extra `headers`), or `send(attempt, signal)` is your own function resolving
 * { status, headers, body }, or { status: null, error } for no answer. `timeoutMs` bounds one
 * attempt in total (connect, send, the whole answer; your `send` gets `signal`, aborted then) and
 * must be below `leaseMs`, the time a sender holds a send before another may take it over
 * (RangeError otherwise).
 *
 * This sender's own values of the extension's settings, the database's when not given:
 * `retryBudget` (idempotency.send_retry_budget), `backoffBaseMs` and `backoffCapMs`
 * (idempotency.send_backoff_base / _cap), set with set_config(..., true) in each transaction that
 * calls idem_send_next or idem_send_result (so they hold through PgBouncer in transaction mode);
 * `giveUpAfterMs` (idempotency.send_give_up_after), given to idem_send by `sender.prepare`.
 * `reconnectBaseMs` and `reconnectCapMs` bound the worker's waits between reconnections.
 *
 * `logger` (console-like: info, warn) gets the worker's database errors and reconnections;
 * `onDbError(error, { code, message, delayMs })` (code: the SQLSTATE, else the error's class;
 * message: its first line) and `onDbReconnected()` are called for them too, `onAttempt` after
 * each attempt, `onFinished` when an attempt's result finished the send (done or gave_up).
 */
export class Sender {
  constructor(pool, { urls = {}, send = null, headers = {}, timeoutMs = 10000, leaseMs = 30000, concurrency = 4,
    pollIntervalMs = 1000, retryBudget = null, backoffBaseMs = null, backoffCapMs = null, giveUpAfterMs = null,
    reconnectBaseMs = 100, reconnectCapMs = 5000, logger = console, onAttempt = null, onFinished = null,
    onDbError = null, onDbReconnected = null } = {}) {
    if (!send && Object.keys(urls).length === 0) throw new TypeError('give urls (a URL per target) or send (a function)');
    checkTimeout(timeoutMs, leaseMs);
    Object.assign(this, {
      pool, urls, headers, timeoutMs, leaseMs, concurrency: Math.max(1, concurrency), pollIntervalMs,
      settings: settingValues({ retryBudget, backoffBaseMs, backoffCapMs }),
      giveUpAfterMs: giveUpAfterMs === null || giveUpAfterMs === undefined ? null : checkInterval('giveUpAfterMs', giveUpAfterMs),
      reconnectBaseMs, reconnectCapMs, logger, onAttempt, onFinished, onDbError, onDbReconnected,
    });
    this.customSend = send;
    this.http = send ? null : new BoundedClient({ maxSockets: Math.max(10, this.concurrency) });
    // Answers the database went away before recording: recorded after reconnecting while their lease holds.
    this.unrecorded = [];
    guardPool(pool, logger);
  }

  /** Closes the HTTP connections this sender keeps (not the pool: it is yours). */
  close() {
    this.http?.close();
  }

  /** `prepare`, with this sender's giveUpAfterMs when the call gives none. */
  prepare(client, scope, operation, target, request = null, { key = null, giveUpAfter = null } = {}) {
    return prepare(client, scope, operation, target, request, { key, giveUpAfter: giveUpAfter ?? this.giveUpAfterMs });
  }

  /** One call of the extension: with this sender's settings, in a transaction of its own. */
  async call(sql, args) {
    if (this.settings.length === 0) return (await this.pool.query(sql, args)).rows;
    const held = new HeldConnection(await this.pool.connect());
    try {
      await held.db.query('BEGIN');
      await held.db.query('SELECT ' + this.settings.map((_, i) => `set_config($${2 * i + 1}, $${2 * i + 2}, true)`).join(', '),
        this.settings.flat());
      const { rows } = await held.db.query(sql, args);
      await held.db.query('COMMIT');
      return rows;
    } catch (e) {
      if (isUnavailable(e)) held.markBroken(e);
      else await held.db.query('ROLLBACK').catch((r) => held.markBroken(r));
      throw e;
    } finally {
      held.release();
    }
  }

  async httpSend(attempt) {
    const url = this.urls[attempt.target];
    if (!url) return { status: null, error: `no URL for target ${attempt.target}` };
    const body = attempt.request === null || attempt.request === undefined ? 'null' : JSON.stringify(attempt.request);
    const headers = { ...(this.headers[attempt.target] ?? {}), 'Idempotency-Key': keyHeader(attempt.key),
      'Content-Type': 'application/json' };
    try {
      return await this.http.post(url, body, headers, this.timeoutMs);
    } catch (e) {
      if (e instanceof NoAnswer) return { status: null, error: e.message };
      throw e;
    }
  }

  /** The application's send function, given up on (no answer) when timeoutMs has passed. */
  async customAnswer(attempt) {
    const stop = new AbortController();
    let timer;
    const timedOut = new Promise((resolve) => {
      timer = setTimeout(() => {
        stop.abort(new NoAnswer('timed out'));
        resolve({ status: null, error: 'timed out' });
      }, this.timeoutMs);
    });
    const sent = Promise.resolve().then(() => this.customSend(attempt, stop.signal));
    sent.catch(() => {}); // settled after the timeout: nobody waits for it any more
    try {
      return await Promise.race([sent, timedOut]);
    } finally {
      clearTimeout(timer);
    }
  }

  async answer(attempt) {
    let answer;
    try {
      answer = this.customSend ? await this.customAnswer(attempt) : await this.httpSend(attempt);
    } catch (e) {
      answer = { status: null, error: `${e.name}: ${e.message}` };
    }
    if (this.onAttempt) this.onAttempt(attempt, answer);
    return answer;
  }

  /** One HTTP attempt of a send this sender holds, and its result recorded. */
  async attempt(attempt) {
    return this.record(attempt, await this.answer(attempt));
  }

  static resultArgs(attempt, answer) {
    const status = answer.status ?? null;
    const retryAfter = status === null ? null : parseRetryAfter(answer.headers?.['retry-after']);
    return [attempt.scope, attempt.operation, attempt.token, status, answer.body ?? null,
      status === null ? null : JSON.stringify(answer.headers ?? {}), intervalText(retryAfter), answer.error ?? null];
  }

  async record(attempt, answer) {
    let row;
    try {
      [row] = await this.call(RESULT_SQL, Sender.resultArgs(attempt, answer));
    } catch (e) {
      if (e.code === 'IK002') return { kind: 'lost', scope: attempt.scope, operation: attempt.operation };
      // Recorded already: the COMMIT's reply was lost with the connection.
      if (e.code === 'IK003') return this.status(attempt.scope, attempt.operation);
      throw mapError(e);
    }
    return this.recorded(attempt, answer, row);
  }

  recorded(attempt, answer, row) {
    const status = answer.status ?? null;
    let result;
    if (row.state === 'done') result = delivered(status, answer.headers ?? {}, answer.body ?? null);
    else if (row.state === 'gave_up') result = { kind: 'unknown', key: attempt.key, attempts: row.attempts, lastStatus: status, lastError: answer.error ?? null };
    else result = { kind: 'not_yet', state: row.state, attempts: row.attempts, nextAttemptAt: row.next_attempt_at, lastStatus: status, lastError: answer.error ?? null };
    if (this.onFinished && result.kind !== 'not_yet') this.onFinished(attempt, result);
    return result;
  }

  /**
   * The answers of a round, recorded together: one statement, so one round trip and one
   * transaction, in (scope, operation) order (two senders never lock rows in opposite orders).
   * When the extension refuses one of them (IK002: its lease was lost; IK003: recorded already)
   * the statement records none, and each is recorded on its own.
   */
  async recordRound(done) {
    const key = ({ attempt: a }) => `${a.scope}\u0000${a.operation}`;
    const sorted = [...done].sort((x, y) => (key(x) < key(y) ? -1 : key(x) > key(y) ? 1 : 0));
    const columns = Array.from({ length: 8 }, () => []);
    for (const { attempt, answer } of sorted) {
      Sender.resultArgs(attempt, answer).forEach((v, i) => columns[i].push(v));
    }
    let rows;
    try {
      rows = await this.call(RESULTS_SQL, columns);
    } catch (e) {
      if (e.code !== 'IK002' && e.code !== 'IK003') throw mapError(e);
      const results = [];
      for (const { attempt, answer } of sorted) results.push(await this.record(attempt, answer));
      return results;
    }
    return sorted.map(({ attempt, answer }, i) => this.recorded(attempt, answer, rows[i]));
  }

  /**
   * Due sends, and a performance.now() instant at or before the end of their lease (it began at
   * the transaction's now(), after this instant).
   */
  async take(target, maxRows, scope = null, operation = null) {
    const before = performance.now();
    let rows;
    try {
      rows = await this.call(NEXT_SQL, [target, maxRows, intervalText(this.leaseMs), scope, operation]);
    } catch (e) {
      throw mapError(e);
    }
    const taken = rows.map((r) => ({ scope: r.scope, operation: r.operation, target: r.target, key: r.key, request: r.request,
      attempt: r.attempt, token: r.token, lockedUntil: r.locked_until, giveUpAt: r.give_up_at }));
    return { taken, leaseEnd: before + this.leaseMs };
  }

  /**
   * Right after the COMMIT that prepared it: one attempt of this send, if it is due and no other
   * sender holds it; otherwise (or after a retryable answer) where it is now. Retries are the
   * worker's. A database error is thrown (the worker takes the send again when its lease ends).
   */
  async deliver(scope, operation) {
    const { taken: [attempt] } = await this.take(null, 1, scope, operation);
    return attempt ? this.attempt(attempt) : this.status(scope, operation);
  }

  /** Where the send is now, from its row. */
  async status(scope, operation) {
    const { rows: [r] } = await query(this.pool, ROW_SQL, [scope, operation]);
    if (!r) throw new RangeError(`no outbound record for operation ${operation} in scope ${scope}`);
    if (r.state === 'done') return delivered(r.response_status, r.response_headers, r.response_body);
    if (r.state === 'gave_up') return { kind: 'unknown', key: r.key, attempts: r.attempts, lastStatus: r.last_status, lastError: r.last_error };
    return { kind: 'not_yet', state: r.state, attempts: r.attempts, nextAttemptAt: r.next_attempt_at, lastStatus: r.last_status, lastError: r.last_error };
  }

  /** `attempt`, keeping the answer when the database fails to record it. */
  async attemptKept(attempt, leaseEnd) {
    const answer = await this.answer(attempt);
    try {
      return await this.record(attempt, answer);
    } catch (e) {
      if (isDatabaseError(e)) this.unrecorded.push({ attempt, answer, leaseEnd });
      throw e;
    }
  }

  /**
   * One round: up to `concurrency` due sends, attempted at once; their answers are recorded
   * together once every attempt of the round has ended (one statement: recordRound). Returns
   * how many. A database error is thrown; the answers it kept from being recorded are recorded
   * by the worker when it has reconnected.
   */
  async runOnce(target = null) {
    const { taken, leaseEnd } = await this.take(target, this.concurrency);
    if (taken.length === 1) {
      await this.attemptKept(taken[0], leaseEnd);
      return 1;
    }
    if (taken.length === 0) return 0;
    const answers = await Promise.all(taken.map((a) => this.answer(a)));
    const done = taken.map((attempt, i) => ({ attempt, answer: answers[i] }));
    try {
      await this.recordRound(done);
    } catch (e) {
      if (isDatabaseError(e)) this.unrecorded.push(...done.map(({ attempt, answer }) => ({ attempt, answer, leaseEnd })));
      throw e;
    }
    return taken.length;
  }

  async recordUnrecorded() {
    const kept = this.unrecorded;
    this.unrecorded = [];
    for (const [i, { attempt: a, answer, leaseEnd }] of kept.entries()) {
      if (performance.now() >= leaseEnd) {
        this.logger.info(`pg-idempotency: sender: the answer to ${a.scope} / ${a.operation} (attempt ${a.attempt}) was not `
          + 'recorded before its lease ended: the send is left to be taken again');
        continue;
      }
      try {
        await this.record(a, answer);
      } catch (e) {
        this.unrecorded.unshift(...kept.slice(i));
        throw e;
      }
      this.logger.info(`pg-idempotency: sender: recorded the answer to ${a.scope} / ${a.operation} (attempt ${a.attempt}) after reconnecting`);
    }
  }

  /** Whether no send of `target` (of any target: null) is pending or sending. */
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
   *
   * A database error (the backend terminated, the server restarting or down, a failover, a
   * deadlock, a serialization failure) does not end it: it is logged (logger.warn, onDbError),
   * its LISTEN session is dropped, and after a wait of exponential backoff with full jitter
   * (reconnectBaseMs, reconnectCapMs) it reconnects (logger.info, onDbReconnected), records the
   * answers the error kept from being recorded while their lease holds, and goes on. Any other
   * error (one of your callbacks) ends it.
   */
  async run(target = null, { signal = null, untilIdle = false } = {}) {
    let listener = null;
    let failures = 0;
    try {
      while (!signal?.aborted) {
        try {
          if (listener === null) {
            listener = await Listener.open(this.pool);
            if (failures) {
              this.logger.info('pg-idempotency: sender: reconnected to the database');
              this.onDbReconnected?.();
            }
            await this.recordUnrecorded();
          }
          const worked = await this.runOnce(target);
          failures = 0;
          if (worked) continue;
          if (untilIdle && await this.idle(target)) return;
          await listener.wait(this.pollIntervalMs, signal);
        } catch (e) {
          if (!isDatabaseError(e)) throw e;
          failures += 1;
          const delayMs = reconnectDelay(failures, this.reconnectBaseMs, this.reconnectCapMs);
          const code = errorCode(e);
          const message = firstLine(e);
          this.logger.warn(`pg-idempotency: sender: database error (${code}): ${message}; `
            + `reconnecting in ${(delayMs / 1000).toFixed(2)} s`);
          this.onDbError?.(e, { code, message, delayMs });
          const dropped = listener;
          listener = null;
          await dropped?.close();
          await pause(delayMs, signal);
        }
      }
    } finally {
      await listener?.close();
    }
  }
}
