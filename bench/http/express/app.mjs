// bench/http.sh's Express app: POST /charges inserts one row and answers 201 with it.
//
//     MIDDLEWARE=on|off DATABASE_URL=... POOL_SIZE=N PORT=N node bench/http/express/app.mjs
//
// With MIDDLEWARE=on the route is protected by pg-idempotency's middleware (same transaction:
// the row and the stored answer commit together); off, the same handler inserts through the
// same pool. Nothing else differs.
import express from 'express';
import pg from 'pg';
import { createIdempotency, expressProblemHandler } from 'pg-idempotency';

const protectedRoute = { on: true, off: false }[process.env.MIDDLEWARE];
if (protectedRoute === undefined) throw new Error('MIDDLEWARE must be on or off');
const poolSize = Number(process.env.POOL_SIZE ?? 16);
const INSERT = 'INSERT INTO charges (amount, currency) VALUES ($1, $2) RETURNING id';

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: poolSize, min: poolSize });
const app = express();
app.use(express.json());
if (protectedRoute) app.use(createIdempotency({ pool }).middleware());
app.post('/charges', async (req, res) => {
  const { amount, currency } = req.body;
  const db = protectedRoute ? req.idempotency.db : pool;
  const { rows: [{ id }] } = await db.query(INSERT, [amount, currency]);
  res.status(201).json({ id: Number(id), amount, currency });
});
app.use(expressProblemHandler());
app.listen(Number(process.env.PORT), '127.0.0.1');
