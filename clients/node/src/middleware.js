// The framework-independent part of the Express and Fastify middleware: key, scope, fingerprint,
// claim, running the handler in one of the two modes, storing or releasing, and the answers.
import { randomUUID } from 'node:crypto';
import { setImmediate as nextTurn } from 'node:timers/promises';
import { IdempotencyClient, Outcome } from './client.js';
import { DEFAULT_CONNECTION_TIMEOUT, HeldConnection, boundedPool, guardPool } from './connection.js';
import {
  ClaimTakenOverError, LockTimeoutError, NoConnectionError, NoLiveRecordError, SerializationError, isServerError,
  isUnavailable,
} from './errors.js';
import { fingerprint } from './fingerprint.js';
import { parseIdempotencyKey } from './key.js';
import { HttpProblem, problems } from './problem.js';
import { DEFAULT_REPLAY_HEADERS, prepareResponse, storedBodyText } from './response.js';

export const Mode = Object.freeze({
  SAME_TRANSACTION: 'same-transaction',
  COMMITTED_FIRST: 'committed-first',
});

/**
 * Answers that refuse the request rather than carry it out (contract/contract.json's
 * refused_statuses, the same in every package; test/contract.test.js checks it): released, not
 * stored, so a request refused by validation leaves its key free.
 */
export const REFUSED_STATUSES = Object.freeze([400, 401, 403, 404, 405, 406, 408, 411, 413, 414, 415, 422, 429]);

const DEFAULTS = {
  mode: Mode.SAME_TRANSACTION,
  tenant: () => undefined,
  scope: ({ tenant, method, route }) => (tenant ? `${tenant}:${method} ${route}` : `${method} ${route}`),
  ignore: [],
  required: true,
  ttl: undefined,
  lease: 30_000,
  wait: undefined,
  replayHeaders: DEFAULT_REPLAY_HEADERS,
  storeServerErrors: false,
  refusedStatuses: REFUSED_STATUSES,
  logger: console,
};

const answer = (problem) => ({ ...problem.toResponse(), replayed: false });

/** What a claim that did not give us the key answers: replay, 409, 422 or 410. */
export function answerWithoutWork(c) {
  switch (c.outcome) {
    case Outcome.REPLAY: {
      const headers = { ...(c.responseHeaders ?? {}), 'Idempotent-Replayed': 'true' };
      return { status: c.responseStatus, headers, body: storedBodyText(c.responseHeaders, c.responseBodyText), replayed: true };
    }
    case Outcome.IN_PROGRESS:
      return answer(problems.inProgress(c.retryAfterSeconds));
    case Outcome.MISMATCH:
      return answer(problems.mismatch());
    case Outcome.EXPIRED:
      return answer(problems.expired());
    default:
      throw new Error(`unexpected claim outcome ${c.outcome}`);
  }
}

export class Idempotency {
  /**
   * @param {object} options { pool (pg.Pool), connectionTimeout (ms the middleware waits for one of
   *   its connections, default 1000), and defaults for every route: mode, tenant, scope, ignore,
   *   required, ttl, lease, wait, replayHeaders, storeServerErrors, refusedStatuses, logger }
   */
  constructor({ pool, connectionTimeout = DEFAULT_CONNECTION_TIMEOUT, ...defaults }) {
    if (!pool || typeof pool.connect !== 'function') throw new TypeError('createIdempotency: `pool` (a pg.Pool) is required');
    if (!(Number.isFinite(connectionTimeout) && connectionTimeout > 0)) {
      throw new TypeError(`createIdempotency: connectionTimeout must be a positive number of milliseconds, not ${connectionTimeout}`);
    }
    this.pool = pool;
    this.connectionTimeout = connectionTimeout;
    this.client = new IdempotencyClient(boundedPool(pool, connectionTimeout));
    this.defaults = { ...DEFAULTS, ...defaults };
    guardPool(pool, this.defaults.logger);
  }

  /**
   * Runs one request. `input`: { method, route (template), keyValues (every Idempotency-Key field
   * line), body (parsed JSON or undefined) }. Resolves to { status, headers, body (text), replayed }.
   */
  async execute(routeOptions, handler, req, input) {
    const o = { ...this.defaults, ...routeOptions };
    try {
      return await this.#execute(o, handler, req, input);
    } catch (e) {
      if (e instanceof HttpProblem) return answer(e);
      if (e instanceof LockTimeoutError || e instanceof SerializationError) return answer(problems.inProgress(1));
      if (isUnavailable(e) && !(e instanceof OutcomeUnknown)) {
        o.logger.warn(`pg-idempotency: ${input.method} ${input.route}: the database is unavailable (${e.message}): 503, nothing was done`);
        return answer(problems.unavailable());
      }
      o.logger.error(`pg-idempotency: ${input.method} ${input.route}:`, e);
      return answer(problems.internal());
    }
  }

  async #execute(o, handler, req, input) {
    const tenant = await o.tenant(req); // may throw an HttpProblem (401) before anything else
    const parsed = input.keyValues.length === 0 && !o.required ? null : parseIdempotencyKey(input.keyValues);
    if (parsed?.error) return answer(input.keyValues.length === 0 ? problems.missingKey() : problems.badKey());
    const scope = await o.scope({ tenant, method: input.method, route: input.route, req });
    const fp = input.body === undefined ? null : fingerprint(input.body, o.ignore);
    const claim = parsed && { scope, key: parsed.key, fingerprint: fp };
    return o.mode === Mode.COMMITTED_FIRST
      ? this.#committedFirst(o, handler, req, claim)
      : this.#sameTransaction(o, handler, req, claim);
  }

  // BEGIN + claim, the handler, idem_complete + COMMIT: two round trips besides the handler's. A
  // claim that runs nothing (replay, 409, 422, 410) resolves at once: its ROLLBACK is sent while
  // the answer goes out, and the connection goes back to the pool once it is done.
  async #sameTransaction(o, handler, req, claim) {
    const { held, c } = await this.#begin(o, claim);
    const db = held.db;
    let open = true;
    let releaseLater = false;
    try {
      if (c && c.outcome !== Outcome.CLAIMED && c.outcome !== Outcome.RECLAIMED) {
        open = false;
        releaseLater = true;
        db.query('ROLLBACK').catch((e) => held.markBroken(e)).finally(() => held.release());
        return answerWithoutWork(c);
      }
      const idem = this.client.on(db);
      const ctx = { mode: Mode.SAME_TRANSACTION, db, idem, ...claimContext(claim, c) };
      const res = prepareResponse(await handler(req, ctx), o.replayHeaders);
      if (!claim || notStored(res, o)) {
        open = false;
        await commit(db, notStored(res, o) ? 'ROLLBACK' : 'COMMIT');
        return send(res, res.text);
      }
      let stored;
      try {
        stored = await idem.completeAndCommit(claim.scope, claim.key, c.token, res.status,
          { bodyJson: res.json, headers: res.stored });
      } catch (e) {
        // The server's own error (idem_complete refused, or COMMIT failed): rolled back, as
        // before. The connection lost: see commit().
        if (isUnavailable(e)) {
          open = false;
          throw committedOrNot(e, 'idem_complete and COMMIT');
        }
        throw e;
      }
      open = false;
      return send(res, res.isJson ? stored ?? '' : res.text);
    } catch (e) {
      if (isUnavailable(e)) held.markBroken(e);
      throw e;
    } finally {
      if (!releaseLater) {
        if (open && !held.broken) await db.query('ROLLBACK').catch((e) => held.markBroken(e));
        held.release();
      }
    }
  }

  // A pool connection (within connectionTimeout) with BEGIN and the claim done: { held, c }, c
  // null without a claim. That transaction cannot have committed whatever became of it, so a claim
  // whose connection failed (closed by the server while idle in the pool, reset) is sent once more
  // on another connection, within what is left of the same bound.
  async #begin(o, claim) {
    const deadline = Date.now() + this.connectionTimeout;
    for (let attempt = 1; ; attempt++) {
      const held = await HeldConnection.take(this.pool, Math.max(1, deadline - Date.now()));
      try {
        if (!claim) {
          await held.db.query('BEGIN');
          return { held, c: null };
        }
        const c = await this.client.on(held.db).beginAndClaim(claim.scope, claim.key,
          { fingerprint: claim.fingerprint, ttl: o.ttl, deferred: true });
        return { held, c };
      } catch (e) {
        if (isUnavailable(e)) held.markBroken(e);
        else await held.db.query('ROLLBACK').catch((r) => held.markBroken(r));
        held.release();
        if (!isUnavailable(e) || attempt > 1) throw e;
        const what = claim ? `${claim.scope} ${claim.key}: the connection failed before the claim was answered` : 'BEGIN failed';
        o.logger.warn(`pg-idempotency: ${what} (${e.message}); sending it once more on another connection`);
        await nextTurn(); // the pool first hears of the other connections the server closed
      }
    }
  }

  async #committedFirst(o, handler, req, claim) {
    if (!claim) {
      const ctx = { mode: Mode.COMMITTED_FIRST, db: this.pool, idem: this.client, sideEffectStarted() {}, async checkpoint() {} };
      const res = prepareResponse(await handler(req, ctx), o.replayHeaders);
      return send(res, res.text);
    }
    const { scope, key } = claim;
    const c = await this.#claimCommitted(claim, o);
    if (c.outcome !== Outcome.CLAIMED && c.outcome !== Outcome.RECLAIMED) return answerWithoutWork(c);
    const lease = new Lease(this.client, scope, key, c, o);
    const ctx = {
      mode: Mode.COMMITTED_FIRST, db: this.pool, idem: this.client, ...claimContext(claim, c),
      signal: lease.abort.signal,
      sideEffectStarted: () => void (lease.sideEffects = true),
      checkpoint: (point, data, { db } = {}) => lease.checkpoint(point, data, db),
    };
    let res;
    try {
      res = prepareResponse(await handler(req, ctx), o.replayHeaders);
    } catch (e) {
      await lease.stop();
      if (isFenced(e)) return this.#fenced(o, scope, key, e);
      if (!lease.sideEffects) {
        await this.client.release(scope, key, c.token).catch((r) => {
          if (!isUnavailable(r)) throw r;
          o.logger.warn(`pg-idempotency: ${scope} ${key}: the key could not be released (${r.message}); it is free again when its lease ends`);
        });
        if (e instanceof HttpProblem || isUnavailable(e)) throw e;
        o.logger.error(`pg-idempotency: ${scope} ${key}: the handler failed before its side effects (key released):`, e);
        return answer(problems.internal());
      }
      o.logger.error(`pg-idempotency: ${scope} ${key}: the handler failed after its side effects (failure stored):`, e);
      res = prepareResponse(e instanceof HttpProblem ? e.toResponse() : problems.internal().toResponse(), o.replayHeaders);
    }
    await lease.stop();
    if (notStored(res, o) && !lease.sideEffects) {
      await this.client.release(scope, key, c.token);
      return send(res, res.text);
    }
    try {
      const stored = await this.client.complete(scope, key, c.token, res.status, { bodyJson: res.json, headers: res.stored });
      return send(res, res.isJson ? stored ?? '' : res.text);
    } catch (e) {
      if (isFenced(e)) return this.#fenced(o, scope, key, e);
      throw new OutcomeUnknown('the handler ran but its response could not be stored', e);
    }
  }

  // A caller-chosen token (extension 0.4.0) makes the claim safe to repeat: when its connection
  // fails during it (not when no connection came at all), the same call on another connection
  // says whether we own the key. Never deferred: the claim commits first.
  async #claimCommitted(claim, o) {
    const args = { fingerprint: claim.fingerprint, ttl: o.ttl, lease: o.lease, wait: o.wait, token: randomUUID() };
    try {
      return await this.client.claim(claim.scope, claim.key, args);
    } catch (e) {
      if (!isUnavailable(e) || e instanceof NoConnectionError || !(await this.client.features()).token) throw e;
      o.logger.warn(`pg-idempotency: ${claim.scope} ${claim.key}: the claim's connection failed (${e.message}); repeating it with the same token on another connection`);
      await nextTurn();
      return this.client.claim(claim.scope, claim.key, args);
    }
  }

  #fenced(o, scope, key, e) {
    o.logger.warn(`pg-idempotency: ${scope} ${key}: late completion fenced (${e.code}): another attempt owns the key; not reporting success`);
    return answer(problems.superseded());
  }
}

/**
 * An error after work may have been done (a lost reply to COMMIT, a response not stored after a
 * side effect): answered 500, never 503 ("nothing was done" may be untrue).
 */
class OutcomeUnknown extends Error {
  constructor(message, cause) {
    super(`${message}: ${cause?.message}`, { cause });
    this.name = 'OutcomeUnknown';
  }
}

async function commit(db, statement) {
  try {
    await db.query(statement);
  } catch (e) {
    throw statement === 'COMMIT' && isUnavailable(e) ? committedOrNot(e, 'COMMIT') : e;
  }
}

/**
 * The connection failed while COMMIT was sent or on its way: `e` itself (answered 503) when the
 * transaction cannot have committed, an OutcomeUnknown (500) otherwise. It cannot when nothing was
 * sent (node-postgres refuses a query on a connection it knows is dead) or when the server
 * answered with its own error (57P01 at a shutdown or pg_terminate_backend: the server ends a
 * session only where its transaction still rolls back, never between a commit and its answer).
 */
function committedOrNot(e, what) {
  if (isServerError(e) || /is not queryable$/.test(e?.message ?? '')) return e;
  return new OutcomeUnknown(`${what} got no answer; the transaction may or may not have committed`, e);
}

/** A 5xx (unless storeServerErrors) or a refusal: rolled back or released, never stored. */
function notStored(res, o) {
  return (res.status >= 500 && !o.storeServerErrors) || o.refusedStatuses.includes(res.status);
}

function isFenced(e) {
  return e instanceof ClaimTakenOverError || e instanceof NoLiveRecordError;
}

function claimContext(claim, c) {
  if (!c) return { scope: claim?.scope, key: null, token: null, outcome: null, attempts: 0, recoveryPoint: null, recoveryData: null };
  return {
    scope: claim.scope, key: claim.key, token: c.token, outcome: c.outcome, attempts: c.attempts,
    recoveryPoint: c.recoveryPoint, recoveryData: c.recoveryData,
  };
}

function send(res, body) {
  return { status: res.status, headers: res.headers, body, replayed: false };
}

/** Keeps a committed claim's lease alive (idem_checkpoint every third of the lease). */
class Lease {
  constructor(client, scope, key, c, o) {
    Object.assign(this, { client, scope, key, token: c.token, lease: o.lease, logger: o.logger });
    this.point = c.recoveryPoint ?? 'started';
    this.data = c.recoveryData ?? null;
    this.sideEffects = false;
    this.abort = new AbortController();
    this.beat = Promise.resolve();
    this.timer = setInterval(() => (this.beat = this.#renew()), Math.max(50, leaseMs(o.lease) / 3));
  }

  async #renew() {
    try {
      await this.client.checkpoint(this.scope, this.key, this.token, this.point, { data: this.data, lease: this.lease });
    } catch (e) {
      if (isFenced(e)) {
        clearInterval(this.timer);
        this.abort.abort(e);
        this.logger.warn(`pg-idempotency: ${this.scope} ${this.key}: the claim was lost while the handler ran (${e.code})`);
      } else {
        this.logger.warn(`pg-idempotency: ${this.scope} ${this.key}: lease renewal failed:`, e.message);
      }
    }
  }

  async checkpoint(point, data, db) {
    this.sideEffects = true;
    const idem = db ? this.client.on(db) : this.client;
    const lockedUntil = await idem.checkpoint(this.scope, this.key, this.token, point, { data, lease: this.lease });
    this.point = point;
    this.data = data ?? null;
    return lockedUntil;
  }

  async stop() {
    clearInterval(this.timer);
    await this.beat;
  }
}

function leaseMs(lease) {
  if (typeof lease === 'number') return lease;
  throw new TypeError('the committed-first lease must be a number of milliseconds');
}
