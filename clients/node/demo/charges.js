// The demo charges service (notes: the demo app contract), shared by the Express and Fastify apps:
// options, the schema, and the two POST /charges handlers on top of pg-idempotency.
import { parseArgs } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { HttpProblem, Mode, Refused, contractProblem, isUnavailable } from '../src/index.js';

const USAGE = `usage: node demo/<express|fastify>.js --database-url URL --listen HOST:PORT
       [--lease-ms N (default 10000)] [--allow-fault-injection]
  (or env DATABASE_URL, LISTEN_ADDR; options win)`;

export function options(argv = process.argv.slice(2)) {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        'database-url': { type: 'string' },
        listen: { type: 'string' },
        'lease-ms': { type: 'string' },
        'allow-fault-injection': { type: 'boolean', default: false },
        help: { type: 'boolean', default: false },
      },
    }));
  } catch (e) {
    fail(e.message);
  }
  if (values.help) {
    console.error(USAGE);
    process.exit(0);
  }
  const databaseUrl = values['database-url'] ?? process.env.DATABASE_URL;
  const listen = values.listen ?? process.env.LISTEN_ADDR;
  if (!databaseUrl) fail('no database: give --database-url or DATABASE_URL');
  if (!listen) fail('no address: give --listen HOST:PORT or LISTEN_ADDR');
  const m = /^(.*):(\d+)$/.exec(listen);
  if (!m || Number(m[2]) > 65535) fail(`--listen: expected HOST:PORT, got ${JSON.stringify(listen)}`);
  const leaseMs = Number(values['lease-ms'] ?? 10000);
  if (!Number.isInteger(leaseMs) || leaseMs < 100) fail(`--lease-ms: expected an integer >= 100, got ${values['lease-ms']}`);
  return {
    databaseUrl,
    host: m[1].replace(/^\[(.*)\]$/, '$1'),
    port: Number(m[2]),
    leaseMs,
    faults: values['allow-fault-injection'],
  };
}

function fail(message) {
  console.error(`demo: ${message}\n${USAGE}`);
  process.exit(2);
}

const SCHEMA = `
CREATE TABLE IF NOT EXISTS charges (
    id text PRIMARY KEY, tenant text NOT NULL, amount bigint NOT NULL CHECK (amount > 0),
    currency text NOT NULL, gateway_charge_id text UNIQUE, created_at timestamptz NOT NULL DEFAULT now())`;

const CHARGE_JSON = `jsonb_build_object('id', id, 'object', 'charge', 'amount', amount, 'currency', currency,
  'gateway_charge_id', gateway_charge_id, 'status', 'succeeded', 'created_at', created_at)::text AS charge`;

const INSERT_CHARGE = `
INSERT INTO charges (id, tenant, amount, currency)
VALUES ('ch_' || replace(gen_random_uuid()::text, '-', ''), $1, $2, $3)
RETURNING ${CHARGE_JSON}`;

const SELECT_CHARGE = `SELECT ${CHARGE_JSON} FROM charges WHERE id = $1 AND tenant = $2`;

export async function openPool(databaseUrl) {
  // connectionTimeoutMillis bounds the demo's own queries (GET /charges/:id: 503 after 5 s without a
  // connection); the middleware waits 1 s at most for its own (createIdempotency's connectionTimeout).
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 20, connectionTimeoutMillis: 5000 });
  pool.on('error', (e) => console.error('demo: idle database connection failed:', e.message));
  await pool.query(SCHEMA);
  return pool;
}

/** The tenant is the X-Api-Key header; missing or empty: 401 before anything is claimed. */
export function tenant(req) {
  const value = req.headers['x-api-key'];
  if (typeof value !== 'string' || value === '') {
    throw new Refused({
      status: 401, title: 'Unauthorized', detail: 'Give your API key in the X-Api-Key header.',
      headers: { 'WWW-Authenticate': 'ApiKey realm="charges"' },
    });
  }
  return value;
}

function chargeRequest(body) {
  const ok = body !== null && typeof body === 'object' && !Array.isArray(body) &&
    Object.keys(body).length === 2 && Number.isSafeInteger(body.amount) && body.amount > 0 &&
    typeof body.currency === 'string' && body.currency !== '';
  if (!ok) {
    throw new Refused({
      status: 400, title: 'Invalid request', detail: 'The body must be {"amount": <integer > 0>, "currency": <string>}.',
    });
  }
  return body;
}

const created = (charge) => ({
  status: 201,
  headers: { Location: `/charges/${charge.id}`, 'Content-Type': 'application/json' },
  body: charge,
});

async function insertCharge(db, tenantId, { amount, currency }) {
  const { rows } = await db.query(INSERT_CHARGE, [tenantId, amount, currency]);
  return JSON.parse(rows[0].charge);
}

/** X-Fault-* request headers, honoured only with --allow-fault-injection. */
async function injectFaults(req, allowed) {
  if (!allowed) return;
  const delay = Number(req.headers['x-fault-delay-ms'] ?? 0);
  if (delay > 0) await sleep(delay);
  if (req.headers['x-fault-fail-before'] === '1') throw new Error('fault injected before the side effect');
}

export function routes(pool, { leaseMs, faults }) {
  return {
    idempotency: { pool, tenant, lease: leaseMs },

    // POST /charges: the charge row and the stored response commit with the claim.
    sameTransaction: {
      options: { mode: Mode.SAME_TRANSACTION },
      async handler(req, ctx) {
        const body = chargeRequest(req.body);
        await injectFaults(req, faults); // inside the claim's transaction
        return created(await insertCharge(ctx.db, tenant(req), body));
      },
    },

    // POST /charges/external: the claim commits first; the charge row is written later in a
    // transaction of its own, fenced by a checkpoint that records its id.
    committedFirst: {
      options: { mode: Mode.COMMITTED_FIRST },
      async handler(req, ctx) {
        const body = chargeRequest(req.body);
        const tenantId = tenant(req);
        if (ctx.recoveryPoint === 'charged') {
          // An earlier attempt wrote the charge and died before completing: answer with it.
          const { rows } = await pool.query(SELECT_CHARGE, [ctx.recoveryData.id, tenantId]);
          return created(JSON.parse(rows[0].charge));
        }
        await injectFaults(req, faults);
        const db = await pool.connect();
        try {
          await db.query('BEGIN');
          const charge = await insertCharge(db, tenantId, body);
          await ctx.checkpoint('charged', { id: charge.id }, { db });
          await db.query('COMMIT');
          return created(charge);
        } catch (e) {
          await db.query('ROLLBACK').catch(() => {});
          throw e;
        } finally {
          db.release();
        }
      },
    },

    /** GET /charges/:id -> { status, headers, body } */
    async getCharge(req, id) {
      let tenantId;
      try {
        tenantId = tenant(req);
      } catch (e) {
        return e.toResponse();
      }
      const { rows } = await pool.query(SELECT_CHARGE, [id, tenantId]);
      if (rows.length === 0) return new HttpProblem(404, 'Not found', { detail: 'No such charge.' }).toResponse();
      return { status: 200, headers: { 'Content-Type': 'application/json' }, body: rows[0].charge };
    },
  };
}

/** The answer to an error the routes did not handle: 503 while the database is unavailable, else 4xx or 500. */
export function errorResponse(err, detail = err.message) {
  if (err instanceof Refused) return err.toResponse();
  if (isUnavailable(err)) return contractProblem('service-unavailable').toResponse();
  const status = err.status ?? err.statusCode;
  if (status >= 400 && status < 500) return problemResponse(status, detail);
  console.error('demo:', err);
  return contractProblem('internal-error').toResponse();
}

export function problemResponse(status, detail) {
  return new HttpProblem(status, status === 404 ? 'Not found' : 'Invalid request', { detail }).toResponse();
}
