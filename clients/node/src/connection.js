// Connections from the application's pg.Pool as the middleware takes them: within a bound of its
// own (whatever the pool's connectionTimeoutMillis, which is none by default), watched for errors
// while held, and discarded when they failed.
import { NoConnectionError, isUnavailable } from './errors.js';

/** The middleware's default bound on waiting for a pool connection, in milliseconds. */
export const DEFAULT_CONNECTION_TIMEOUT = 1000;

/**
 * pool.connect(), given up after `ms` (NoConnectionError); a connection that comes later goes
 * straight back to the pool. A pool that cannot connect also gives NoConnectionError.
 */
export async function connectWithin(pool, ms) {
  const pending = pool.connect();
  let timer;
  const timeout = new Promise((resolve) => (timer = setTimeout(resolve, ms, null)));
  let db;
  try {
    db = await Promise.race([pending, timeout]);
  } catch (e) {
    throw new NoConnectionError(`no database connection: ${e.message}`, e);
  } finally {
    clearTimeout(timer);
  }
  if (db === null) {
    pending.then((late) => late.release(), () => {});
    throw new NoConnectionError(`no database connection within ${ms} ms`);
  }
  return db;
}

/**
 * A pool connection held by one request. An 'error' it emits meanwhile (the server ended the
 * session) is kept instead of thrown (node-postgres would otherwise crash the process with it),
 * and makes release() discard the connection.
 */
export class HeldConnection {
  static async take(pool, ms) {
    return new HeldConnection(await connectWithin(pool, ms));
  }

  constructor(db) {
    this.db = db;
    this.broken = undefined;
    this.onError = (e) => this.markBroken(e);
    db.on('error', this.onError);
  }

  markBroken(e) {
    this.broken ??= e;
  }

  release() {
    this.db.removeListener('error', this.onError);
    this.db.release(this.broken);
  }
}

/**
 * The pool's query() with the connection taken within `ms`: what the middleware's own statements
 * outside a transaction run on (committed-first mode). A connection that failed is discarded.
 */
export function boundedPool(pool, ms) {
  return {
    async query(sql, params) {
      const held = await HeldConnection.take(pool, ms);
      try {
        return await held.db.query(sql, params);
      } catch (e) {
        if (isUnavailable(e)) held.markBroken(e);
        throw e;
      } finally {
        held.release();
      }
    },
  };
}

/**
 * node-postgres's pool re-emits an error of an idle connection (the database restarted or
 * stopped) as its own 'error' event: with no listener, the process exits. When the application
 * gave its pool none, this adds one that logs a warning (the pool has already dropped the
 * connection). Returns whether it did.
 */
export function guardPool(pool, logger) {
  if (typeof pool.listenerCount !== 'function' || pool.listenerCount('error') > 0) return false;
  pool.on('error', (e) => logger.warn(`pg-idempotency: an idle database connection failed (${e.message}); the pool dropped it`));
  return true;
}
