// A small typed client for the idempotency extension on node-postgres. Every statement is one
// parameterized query with an unnamed prepared statement, so it runs unchanged through
// PgBouncer in transaction-pooling mode.
import { mapError, UnsupportedFeatureError } from './errors.js';

export const Outcome = Object.freeze({
  CLAIMED: 'claimed',
  RECLAIMED: 'reclaimed',
  REPLAY: 'replay',
  IN_PROGRESS: 'in_progress',
  MISMATCH: 'mismatch',
  EXPIRED: 'expired',
});

const FEATURES_SQL = `
SELECT coalesce(bool_or(p.proname = 'idem_claim' AND 'wait' = ANY (p.proargnames)), false) AS wait,
       coalesce(bool_or(p.proname = 'idem_claim' AND 'token' = ANY (p.proargnames)), false) AS token,
       coalesce(bool_or(p.proname = 'idem_claim' AND 'deferred' = ANY (p.proargnames)), false) AS deferred,
       coalesce(bool_or(p.proname = 'idem_seen_many'), false) AS seen_many
FROM pg_catalog.pg_proc p
WHERE p.pronamespace = 'idempotency'::regnamespace`;

/** An interval argument: milliseconds (number) or PostgreSQL interval text ('30 seconds'). */
export function intervalText(v) {
  if (v === undefined || v === null) return null;
  if (typeof v === 'number') {
    if (!Number.isFinite(v)) throw new TypeError(`not a finite number of milliseconds: ${v}`);
    return `${v} milliseconds`;
  }
  return String(v);
}

function jsonText(v) {
  return v === undefined || v === null ? null : JSON.stringify(v);
}

function claimSql(extraArgs, firstArgs = '$1, $2, $3') {
  return `
SELECT c.outcome, c.token::text AS token, c.http_status, c.response_status, c.response_headers,
       c.response_body::text AS response_body_text, c.recovery_point, c.recovery_data, c.attempts,
       c.expires_at, c.locked_until,
       CASE WHEN c.outcome = 'in_progress' AND c.locked_until IS NOT NULL
            THEN greatest(1, ceil(extract(epoch FROM c.locked_until - clock_timestamp())))::int END
         AS retry_after
FROM idempotency.idem_claim(${firstArgs}${extraArgs}) AS c`;
}

/**
 * A SQL literal for a simple-protocol statement (node-postgres sends parameters only with the
 * extended protocol, one statement per round trip). An escape string E'...' reads backslashes
 * the same whatever standard_conforming_strings says: each backslash and quote is doubled, so
 * the text comes back unchanged (node-postgres talks UTF-8, where no multi-byte character holds
 * a quote or backslash byte). null and undefined are NULL; text holding NUL is refused, as
 * PostgreSQL cannot store it.
 */
export function sqlLiteral(value) {
  if (value === null || value === undefined) return 'NULL';
  const text = String(value);
  if (text.includes('\0')) throw new TypeError('a text value for PostgreSQL cannot hold U+0000 (NUL)');
  return `E'${text.replace(/\\/g, '\\\\').replace(/'/g, "''")}'`;
}

function claimResult(row) {
  const text = row.response_body_text;
  return {
    outcome: row.outcome,
    token: row.token,
    httpStatus: row.http_status,
    responseStatus: row.response_status,
    responseHeaders: row.response_headers,
    responseBody: text === null ? null : JSON.parse(text),
    responseBodyText: text,
    recoveryPoint: row.recovery_point,
    recoveryData: row.recovery_data,
    attempts: row.attempts,
    expiresAt: row.expires_at,
    lockedUntil: row.locked_until,
    retryAfterSeconds: row.retry_after,
  };
}

export class IdempotencyClient {
  /**
   * @param {{query: Function}} db a pg.Pool, pg.Client or pg.PoolClient
   * @param {{features?: Promise<object>}} [shared] internal: a feature cache to share
   */
  constructor(db, shared = {}) {
    this.db = db;
    this.shared = shared;
  }

  /** The same client running its statements on `db` (e.g. a pool client inside BEGIN). */
  on(db) {
    return new IdempotencyClient(db, this.shared);
  }

  /** What the installed extension offers, looked up once per client (pool) and cached. */
  features() {
    if (!this.shared.features) {
      this.shared.features = this.query(FEATURES_SQL).then(
        (r) => ({ wait: r.rows[0].wait, token: r.rows[0].token, deferred: r.rows[0].deferred, seenMany: r.rows[0].seen_many }),
        (e) => {
          this.shared.features = undefined;
          throw e;
        });
    }
    return this.shared.features;
  }

  async query(sql, params) {
    try {
      return await this.db.query(sql, params);
    } catch (e) {
      throw mapError(e);
    }
  }

  /**
   * idem_claim. `wait` and `token` are passed only when the extension has them (release 0.4.0):
   * otherwise the claim answers at once and makes its own token (use the result's token).
   * `deferred` (release 0.6.0, for a claim completed in the same transaction) likewise: without
   * it the claim writes its in_progress record at once, as before.
   */
  async claim(scope, key, { fingerprint = null, ttl, lease, wait, token, deferred = false } = {}) {
    const features = await this.features();
    const params = [scope, key, fingerprint, intervalText(ttl), intervalText(lease)];
    let extra = ', ttl => $4::interval, lease => $5::interval';
    if (features.wait && wait !== undefined && wait !== null) {
      params.push(intervalText(wait));
      extra += `, wait => $${params.length}::interval`;
    }
    if (features.token && token !== undefined && token !== null) {
      params.push(token);
      extra += `, token => $${params.length}::uuid`;
    }
    if (deferred && features.deferred) extra += ', deferred => true';
    const r = await this.query(claimSql(extra), params);
    return claimResult(r.rows[0]);
  }

  /**
   * `BEGIN` and idem_claim in one round trip (one simple-protocol string of two statements) on a
   * connection of its own (a pg.PoolClient): the transaction stays open, also when the claim
   * fails (then aborted); the caller ends it (completeAndCommit, or ROLLBACK). `deferred` as in
   * claim(): a free key's record is then written once, by idem_complete.
   */
  async beginAndClaim(scope, key, { fingerprint = null, ttl, deferred = false } = {}) {
    const args = [scope, key, fingerprint].map(sqlLiteral).join(', ');
    const defer = deferred && (await this.features()).deferred ? ', deferred => true' : '';
    const r = await this.query(`BEGIN; ${claimSql(`, ttl => ${sqlLiteral(intervalText(ttl))}::interval, lease => NULL::interval${defer}`,
      `${args}::text`)}`);
    return claimResult(r[1].rows[0]);
  }

  /**
   * idem_complete and `COMMIT` in one round trip, in the transaction beginAndClaim opened. When
   * idem_complete fails, COMMIT is not run (the statements after a failed one are skipped) and the
   * transaction stays open, aborted, for the caller's ROLLBACK. Resolves as complete() does.
   */
  async completeAndCommit(scope, key, token, status, { bodyJson, headers } = {}) {
    if (!Number.isInteger(status)) throw new TypeError(`an HTTP status must be an integer, not ${status}`);
    const r = await this.query(
      `SELECT stored.body::text AS body
       FROM (SELECT ${sqlLiteral(bodyJson)}::jsonb AS body) AS stored,
            idempotency.idem_complete(${sqlLiteral(scope)}, ${sqlLiteral(key)}, ${sqlLiteral(token)}::uuid, ${status},
                                      stored.body, ${sqlLiteral(jsonText(headers))}::jsonb);
       COMMIT`);
    return r[0].rows[0].body;
  }

  /**
   * idem_complete. `body` is any JSON value; `bodyJson` is JSON text instead (kept as jsonb).
   * Resolves to the stored body as jsonb prints it (what a replay gets), or null.
   */
  async complete(scope, key, token, status, { body, bodyJson, headers } = {}) {
    const text = bodyJson ?? jsonText(body);
    const r = await this.query(
      `SELECT $5::jsonb::text AS body
       FROM idempotency.idem_complete($1, $2, $3::uuid, $4::int, $5::jsonb, $6::jsonb)`,
      [scope, key, token, status, text, jsonText(headers)]);
    return r.rows[0].body;
  }

  /** idem_checkpoint: records progress and renews the lease. Resolves to the new locked_until. */
  async checkpoint(scope, key, token, recoveryPoint, { data, lease } = {}) {
    const r = await this.query(
      `SELECT idempotency.idem_checkpoint($1, $2, $3::uuid, $4, $5::jsonb, $6::interval) AS locked_until`,
      [scope, key, token, recoveryPoint, jsonText(data), intervalText(lease)]);
    return r.rows[0].locked_until;
  }

  /** idem_release: false when the token no longer owns a live in_progress record. */
  async release(scope, key, token) {
    const r = await this.query('SELECT idempotency.idem_release($1, $2, $3::uuid) AS released',
      [scope, key, token]);
    return r.rows[0].released;
  }

  /** idem_lookup: the live record (camelCase fields), or null. */
  async lookup(scope, key) {
    const r = await this.query(
      `SELECT scope, key, fingerprint, status::text AS status, token::text AS token, attempts,
              locked_until, recovery_point, recovery_data, response_status, response_headers,
              response_body::text AS response_body_text, created_at, updated_at, completed_at, expires_at
       FROM idempotency.idem_lookup($1, $2)`, [scope, key]);
    const row = r.rows[0];
    if (!row) return null;
    return {
      scope: row.scope, key: row.key, fingerprint: row.fingerprint, status: row.status,
      token: row.token, attempts: row.attempts, lockedUntil: row.locked_until,
      recoveryPoint: row.recovery_point, recoveryData: row.recovery_data,
      responseStatus: row.response_status, responseHeaders: row.response_headers,
      responseBody: row.response_body_text === null ? null : JSON.parse(row.response_body_text),
      responseBodyText: row.response_body_text,
      createdAt: row.created_at, updatedAt: row.updated_at, completedAt: row.completed_at,
      expiresAt: row.expires_at,
    };
  }

  /** idem_seen: true the first time messageId is seen in scope (recorded in the caller's transaction). */
  async seen(scope, messageId, { ttl } = {}) {
    const r = await this.query('SELECT idempotency.idem_seen($1, $2, $3::interval) AS first',
      [scope, messageId, intervalText(ttl)]);
    return r.rows[0].first;
  }

  /** idem_seen_many (release 0.4.0): element i is true when messageIds[i] is new. */
  async seenMany(scope, messageIds, { ttl } = {}) {
    if (!(await this.features()).seenMany) {
      throw new UnsupportedFeatureError('the installed idempotency extension has no idem_seen_many (release 0.4.0)');
    }
    const r = await this.query('SELECT idempotency.idem_seen_many($1, $2::text[], $3::interval) AS first',
      [scope, messageIds, intervalText(ttl)]);
    return r.rows[0].first;
  }

  /** idem_fingerprint(jsonb, ignore) computed by the database. */
  async fingerprint(value, ignore = null) {
    const r = await this.query('SELECT idempotency.idem_fingerprint($1::jsonb, $2::text[]) AS fp',
      [JSON.stringify(value), ignore]);
    return r.rows[0].fp;
  }
}
