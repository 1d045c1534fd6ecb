// SQLSTATEs of the idempotency extension (and the PostgreSQL ones its callers meet) as classes.

export class IdempotencyError extends Error {
  /** @param {string} message @param {{code?: string|null, cause?: unknown}} [o] */
  constructor(message, { code = null, cause } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = new.target.name;
    this.code = code;
    this.detail = cause?.detail;
    this.hint = cause?.hint;
  }
}

/** 22004: an argument is NULL where a value is required. */
export class NullArgumentError extends IdempotencyError {}
/** 22023: a bad argument value (empty or too long key, bad ttl, status outside 100-599...). */
export class InvalidArgumentError extends IdempotencyError {}
/** IK001: no live record for (scope, key): never claimed, released, or expired. */
export class NoLiveRecordError extends IdempotencyError {}
/** IK002: the token no longer owns the record (taken over or released): do not report success. */
export class ClaimTakenOverError extends IdempotencyError {}
/** IK003: the record is already completed by this token. */
export class AlreadyCompletedError extends IdempotencyError {}
/** 54000: a response or checkpoint larger than idempotency.max_response_size. */
export class ResponseTooLargeError extends IdempotencyError {}
/** 25006: a write function on a hot standby. */
export class ReadOnlyError extends IdempotencyError {}
/** 40001: serialization failure; retry the transaction. */
export class SerializationError extends IdempotencyError {}
/** 55P03: lock_timeout while waiting behind another transaction's claim of the same key. */
export class LockTimeoutError extends IdempotencyError {}
/** 42501: the role lacks the grants, or row-level security refused the scope. */
export class PermissionDeniedError extends IdempotencyError {}
/** The installed extension lacks a function or argument this call needs (no SQLSTATE). */
export class UnsupportedFeatureError extends IdempotencyError {}

/** SQLSTATE -> error class (test/contract.test.js checks it against contract/contract.json). */
export const BY_SQLSTATE = Object.freeze({
  22004: NullArgumentError,
  22023: InvalidArgumentError,
  IK001: NoLiveRecordError,
  IK002: ClaimTakenOverError,
  IK003: AlreadyCompletedError,
  54000: ResponseTooLargeError,
  25006: ReadOnlyError,
  40001: SerializationError,
  '55P03': LockTimeoutError,
  42501: PermissionDeniedError,
});

/** The typed error for a node-postgres error, or the error itself when its SQLSTATE is not ours. */
export function mapError(e) {
  const Class = e && typeof e.code === 'string' ? BY_SQLSTATE[e.code] : undefined;
  return Class ? new Class(e.message, { code: e.code, cause: e }) : e;
}

/**
 * No connection from the pool: none came within the middleware's own bound (`connectionTimeout`),
 * or the pool could not open one (the original error is the `cause`). Nothing was sent.
 */
export class NoConnectionError extends Error {
  constructor(message, cause) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = 'NoConnectionError';
  }
}

// The database could not be reached: the socket's own errors, the server shutting down, starting
// or out of connections, a connection exception (class 08), and node-postgres's and pg-pool's
// errors for a dead connection or a pool that gave none in time (connectionTimeoutMillis).
const UNREACHABLE_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH',
  'ENETUNREACH', 'ENOTFOUND', 'EAI_AGAIN', '57P01', '57P02', '57P03', '53300']);
const UNREACHABLE_MESSAGES = /^(Connection terminated|timeout exceeded when trying to connect|Client has encountered a connection error|Client was closed|Query read timeout)/;

/** Whether `e` (a node-postgres or pg-pool error) means the database is unavailable. */
export function isUnavailable(e) {
  for (let x = e, depth = 0; x && depth < 5; x = x.cause, depth++) {
    if (x instanceof NoConnectionError) return true;
    const code = typeof x.code === 'string' ? x.code : '';
    if (UNREACHABLE_CODES.has(code) || /^08[0-9A-Z]{3}$/.test(code)) return true;
    if (typeof x.message === 'string' && UNREACHABLE_MESSAGES.test(x.message)) return true;
  }
  return false;
}

/** Whether `e` is the server's own error answer (an ErrorResponse: it has a severity), not the socket's. */
export function isServerError(e) {
  for (let x = e, depth = 0; x && depth < 5; x = x.cause, depth++) {
    if (typeof x.severity === 'string') return true;
  }
  return false;
}
