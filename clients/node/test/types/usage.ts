// Compiled by `tsc --noEmit -p test/types` (test.sh): the hand-written index.d.ts against how an
// application uses the package. Wrong types here fail the type check.
import express from 'express';
import Fastify from 'fastify';
import pg from 'pg';
import {
  ClaimTakenOverError, HttpProblem, IdempotencyClient, Mode, Outcome, Refused, Sender, createIdempotency, fingerprint,
  keyHeader, prepare, type ClaimResult, type SendAnswer, type SendResult,
} from 'pg-idempotency';

const pool = new pg.Pool();
const client = new IdempotencyClient(pool);

async function useClient(): Promise<void> {
  const c: ClaimResult = await client.claim('acct_1:POST /x', 'k', { fingerprint: fingerprint({ a: 1 }), lease: 30_000 });
  if (c.outcome === Outcome.CLAIMED && c.token !== null) {
    const stored: string | null = await client.complete('acct_1:POST /x', 'k', c.token, 201, { body: { ok: true } });
    void stored;
  }
  const first: boolean = await client.seen('consumer', 'm-1');
  const many: boolean[] = await client.seenMany('consumer', ['m-1', 'm-2']);
  void first, many;
  try {
    await client.checkpoint('s', 'k', 't', 'step-1', { data: { n: 1 }, lease: '30 seconds' });
  } catch (e) {
    if (e instanceof ClaimTakenOverError) console.log(e.code);
  }
}
void useClient;

const idem = createIdempotency({
  pool,
  tenant: (req: any) => {
    const t = req.headers['x-api-key'];
    if (typeof t !== 'string') throw new Refused({ status: 401, detail: 'Give your API key.', headers: { 'WWW-Authenticate': 'ApiKey' } });
    if (t === '') throw new HttpProblem(401, 'Unauthorized');
    return t;
  },
});

const app = express();
app.use(express.json());
app.post('/charges', idem.express({ mode: Mode.SAME_TRANSACTION, ignore: ['note'] }, async (req, ctx) => {
  const { rows } = await ctx.db.query('INSERT INTO charges DEFAULT VALUES RETURNING id');
  return { status: 201, headers: { Location: `/charges/${rows[0].id}` }, body: rows[0] };
}));

app.use(idem.middleware({ methods: ['POST'] }));
app.post('/orders', async (req, res) => {
  const ctx = req.idempotency;
  if (ctx?.mode === 'same-transaction') await ctx.db.query('SELECT 1');
  res.status(201).json({ key: ctx?.key ?? null });
});

const f = Fastify();
void f.register(idem.fastifyPlugin, { refusedStatuses: [400] });
f.post('/orders', async (request) => ({ key: request.idempotency?.key ?? null }));
f.post('/charges/external', idem.fastify({ mode: Mode.COMMITTED_FIRST, lease: 10_000 }, async (req, ctx) => {
  if (ctx.signal.aborted) throw new Error('lost');
  await ctx.checkpoint('charged', { id: 'ch_1' });
  return { status: 201, body: { id: 'ch_1' } };
}));

async function useSender(): Promise<void> {
  const db = await pool.connect();
  await db.query('BEGIN');
  const sent = await prepare(db, 'shop', 'order-42:charge', 'payments', { amount: 500 }, { giveUpAfter: '2 hours' });
  const key: string = sent.key;
  await db.query('COMMIT');
  db.release();
  const sender = new Sender(pool, { urls: { payments: 'https://pay.example/charges' }, concurrency: 8 });
  const r: SendResult = await sender.deliver('shop', 'order-42:charge');
  if (r.kind === 'delivered') {
    const status: number = r.status;
    void status;
  } else if (r.kind === 'not_yet') {
    const when: Date = r.nextAttemptAt;
    void when;
  }
  const own = new Sender(pool, {
    send: async (a, signal): Promise<SendAnswer> => {
      const res = await fetch('https://pay.example/charges', { method: 'POST', signal, headers: { 'Idempotency-Key': keyHeader(a.key) } });
      return { status: res.status, headers: {}, body: await res.text() };
    },
    timeoutMs: 2000, leaseMs: 5000, retryBudget: 0.5, backoffBaseMs: 100, backoffCapMs: 2000, giveUpAfterMs: 3600000,
    reconnectBaseMs: 50, reconnectCapMs: 1000, logger: console,
    onDbError: (_e, { code, message, delayMs }) => console.warn(code, message, delayMs),
    onDbReconnected: () => console.info('back'),
  });
  const again = await own.prepare(db, 'shop', 'order-43:charge', 'payments', { amount: 1 });
  void again.key;
  own.close();
  const stop = new AbortController();
  await own.run('payments', { signal: stop.signal, untilIdle: true });
  void key;
}
void useSender;
