// express-app.mjs: POST /orders made idempotent with Express (the README's example app).
//   DATABASE_URL=postgresql://app@localhost/app PORT=3000 node express-app.mjs
import express from 'express';
import pg from 'pg';
import { Refused, createIdempotency, expressProblemHandler } from 'pg-idempotency';

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
await pool.query('CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, item text NOT NULL)');
// Also guards the pool: a connection the database closes while idle (a restart) is logged, not
// fatal; and waits at most a second for a connection (then 503), whatever the pool's own timeout.
const idem = createIdempotency({ pool });

const app = express();
app.use(express.json());
app.use(idem.middleware()); // every POST and PATCH now needs an Idempotency-Key
app.post('/orders', async (req, res) => {
  if (typeof req.body?.item !== 'string') throw new Refused({ status: 400, detail: 'Send {"item": "..."}.' });
  // The connection holding the claim's transaction: the order and the stored answer commit together.
  const { rows: [order] } = await req.idempotency.db.query(
    'INSERT INTO orders (item) VALUES ($1) RETURNING id, item', [req.body.item]);
  res.status(201).location(`/orders/${order.id}`).json(order);
});
app.use(expressProblemHandler()); // a Refused as problem+json, the database unavailable as 503
app.listen(Number(process.env.PORT ?? 3000));
