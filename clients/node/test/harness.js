// Shared by the tests: the database (DATABASE_URL, a throwaway cluster started by test.sh), demo
// servers as child processes, and a small HTTP client that can send what fetch will not
// (duplicated field lines, control characters).
import { execFile, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import { fileURLToPath } from 'node:url';
import { after } from 'node:test';
import pg from 'pg';

export const DATABASE_URL = process.env.DATABASE_URL;
if (!DATABASE_URL) throw new Error('set DATABASE_URL (test.sh starts a throwaway cluster and sets it)');
export const PGBOUNCER_URL = process.env.PGBOUNCER_URL;
const DEMO_DIR = fileURLToPath(new URL('../demo/', import.meta.url));
export const LEASE_MS = 1500;

// Demo servers listen on DEMO_PORT_BASE (test.sh: tests/lib.sh's node-demos) + 5 ports per test
// file, taken in turn (at most two servers of a file run at once).
const FILES = ['outage', 'crash', 'http', 'readme', 'pgbouncer', 'unit'];
const fileIndex = Math.max(0, FILES.indexOf(process.argv[1]?.match(/(\w+)\.test\.js$/)?.[1]));
if (!process.env.DEMO_PORT_BASE) throw new Error("set DEMO_PORT_BASE (test.sh takes it from tests/lib.sh's port table)");
const firstPort = Number(process.env.DEMO_PORT_BASE) + 5 * fileIndex;
let taken = 0;
export const takePort = () => firstPort + (taken++ % 5);

/**
 * The suite's PostgreSQL server (test.sh: PG_DATA_DIR, PG_BIN), stopped and started with pg_ctl as
 * the postgres user, without blocking the tests' own requests meanwhile. `skip` says why not when
 * they are not set.
 */
const { PG_DATA_DIR, PG_BIN } = process.env;
const pgCtl = (...args) => promisify(execFile)('runuser', ['-u', 'postgres', '--', `${PG_BIN}/pg_ctl`, '-D', PG_DATA_DIR, ...args],
  { cwd: '/' });
export const database = {
  skip: PG_DATA_DIR && PG_BIN ? false : 'PG_DATA_DIR and PG_BIN are not set (test.sh sets them)',
  stop: () => pgCtl('-m', 'fast', '-w', 'stop'),
  start: () => pgCtl('-l', `${PG_DATA_DIR}/../server.log`, '-w', '-t', '60', 'start'),
  restart: () => pgCtl('-m', 'fast', '-l', `${PG_DATA_DIR}/../server.log`, '-w', '-t', '60', 'restart'),
};

export const newTenant = () => 't_' + randomUUID().slice(0, 8);
export const newKey = () => 'k-' + randomUUID();
export const quoted = (key) => `"${key.replace(/[\\"]/g, (c) => '\\' + c)}"`;

export function newPool(url = DATABASE_URL) {
  const pool = new pg.Pool({ connectionString: url, max: 4 });
  pool.on('error', (e) => console.error('test pool: an idle connection failed:', e.message));
  return pool;
}

const running = new Set();
// Whatever a failed test left running is stopped when the file's tests end.
after(() => Promise.all([...running].map((s) => s.stop('SIGKILL'))));

/**
 * A demo server (`express` or `fastify`) as a child process, up once /healthz answers. A port
 * that is taken (the ephemeral range covers ours: a client socket may hold it) moves on to the next.
 */
export async function startDemo(framework, { port, databaseUrl = DATABASE_URL, leaseMs = LEASE_MS, faults = true } = {}) {
  for (let attempt = 0; ; attempt++) {
    const p = attempt === 0 && port !== undefined ? port : takePort();
    try {
      return await startDemoOn(framework, p, databaseUrl, leaseMs, faults);
    } catch (e) {
      if (!/EADDRINUSE/.test(e.message) || attempt >= 5) throw e;
    }
  }
}

async function startDemoOn(framework, port, databaseUrl, leaseMs, faults) {
  const proc = spawn(process.execPath, [DEMO_DIR + framework + '.js', '--database-url', databaseUrl,
    '--listen', `127.0.0.1:${port}`, '--lease-ms', String(leaseMs), ...(faults ? ['--allow-fault-injection'] : [])],
  { stdio: ['ignore', 'inherit', 'pipe'] });
  let log = '';
  proc.stderr.on('data', (d) => (log += d));
  const exited = new Promise((resolve) => proc.on('exit', resolve));
  const server = {
    proc, port, framework,
    log: () => log,
    async stop(signal = 'SIGTERM') {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill('SIGCONT');
        proc.kill(signal);
      }
      await exited;
      running.delete(server);
    },
  };
  running.add(server);
  for (let i = 0; i < 400; i++) {
    if (proc.exitCode !== null) {
      running.delete(server);
      throw new Error(`${framework} demo exited (${proc.exitCode}):\n${log}`);
    }
    try {
      const r = await request(port, 'GET', '/healthz', { timeout: 2000 });
      if (r.status === 200 && /listening/.test(log)) return server;
    } catch {
      // not listening yet
    }
    await sleep(50);
  }
  await server.stop('SIGKILL');
  throw new Error(`${framework} demo did not answer /healthz:\n${log}`);
}

/**
 * One HTTP request. `headers` values may be arrays (one field line each).
 * Resolves to { status, headers, raw (rawHeaders), body (text) }.
 */
export function request(port, method, path, { headers = {}, body, timeout = 30_000 } = {}) {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body);
    const req = http.request({ host: '127.0.0.1', port, method, path, headers, agent: false, timeout }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => (text += d));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, raw: res.rawHeaders, body: text }));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
    if (payload !== undefined) req.setHeader('Content-Type', 'application/json');
    req.end(payload);
  });
}

/** POST a charge: tenant in X-Api-Key (omitted when null), key as given (quote it yourself). */
export function postCharge(port, route, { tenant, key, body = { amount: 500, currency: 'eur' }, headers = {} } = {}) {
  const h = { ...headers };
  if (tenant !== null && tenant !== undefined) h['X-Api-Key'] = tenant;
  if (key !== undefined) h['Idempotency-Key'] = key;
  return request(port, 'POST', route, { headers: h, body });
}

/** A request written byte for byte on a socket (for field values Node's client refuses to send). */
export function rawRequest(port, lines, body) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    const head = [...lines, `Content-Length: ${Buffer.byteLength(body)}`, 'Connection: close', '', ''].join('\r\n');
    let text = '';
    sock.on('connect', () => sock.end(Buffer.concat([Buffer.from(head, 'latin1'), Buffer.from(body)])));
    sock.on('data', (d) => (text += d.toString('latin1')));
    sock.on('end', () => resolve({ status: Number(text.split(' ')[1]), text }));
    sock.on('error', reject);
  });
}

export async function chargeCount(pool, tenant) {
  const { rows } = await pool.query('SELECT count(*)::int AS n FROM charges WHERE tenant = $1', [tenant]);
  return rows[0].n;
}

export async function keyCount(pool, tenant) {
  const { rows } = await pool.query('SELECT count(*)::int AS n FROM idempotency.keys WHERE scope LIKE $1', [tenant + ':%']);
  return rows[0].n;
}

/** The contract's 503: service-unavailable problem+json with a Retry-After of at least a second. */
export function isUnavailableAnswer(r) {
  return isProblem(r, 503) && JSON.parse(r.body).type === 'urn:pg-idempotency:problem:service-unavailable' &&
    Number(r.headers['retry-after']) >= 1;
}

export function isProblem(r, status) {
  if (r.status !== status || !/^application\/problem\+json/.test(r.headers['content-type'] ?? '')) return false;
  const p = JSON.parse(r.body);
  return p.status === status && typeof p.title === 'string';
}

/** Waits until (scope, key) has an in_progress record. */
export async function waitInProgress(pool, scope, key) {
  for (let i = 0; i < 250; i++) {
    const { rows } = await pool.query('SELECT status::text FROM idempotency.idem_lookup($1, $2)', [scope, key]);
    if (rows[0]?.status === 'in_progress') return;
    await sleep(20);
  }
  throw new Error(`${scope} ${key} never became in_progress`);
}

export { sleep };
