// fastify-app.mjs: POST /orders made idempotent with Fastify (the README's example app).
//   DATABASE_URL=postgresql://app@localhost/app PORT=3000 node fastify-app.mjs
import Fastify from 'fastify';
import pg from 'pg';
import { createIdempotency } from 'pg-idempotency';

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
await pool.query('CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, item text NOT NULL)');
const idem = createIdempotency({ pool }); // guards the pool as in express-app.mjs

const app = Fastify();
await app.register(idem.fastifyPlugin); // every POST and PATCH route now needs an Idempotency-Key
const schema = { body: { type: 'object', required: ['item'], properties: { item: { type: 'string' } } } };
app.post('/orders', { schema }, async (request, reply) => {
  // The connection holding the claim's transaction: the order and the stored answer commit together.
  const { rows: [order] } = await request.idempotency.db.query(
    'INSERT INTO orders (item) VALUES ($1) RETURNING id, item', [request.body.item]);
  reply.code(201).header('Location', `/orders/${order.id}`);
  return order;
});
await app.listen({ port: Number(process.env.PORT ?? 3000) });
