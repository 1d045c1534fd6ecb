#!/usr/bin/env node
// The demo charges service on Fastify, with the package's plugin before ordinary handlers:
//   node demo/fastify.js --database-url postgresql://... --listen 127.0.0.1:8080
import Fastify from 'fastify';
import { createIdempotency } from '../src/index.js';
import { errorResponse, openPool, options, problemResponse, routes } from './charges.js';

const opts = options();
const pool = await openPool(opts.databaseUrl);
const r = routes(pool, opts);
const idem = createIdempotency(r.idempotency);

const app = Fastify({ logger: false });
// Every body is read as JSON, whatever its Content-Type.
app.removeAllContentTypeParsers();
app.addContentTypeParser('*', { parseAs: 'string' }, (req, text, done) => {
  if (text === '') return done(null, undefined);
  try {
    done(null, JSON.parse(text));
  } catch {
    const e = new Error('The body is not valid JSON.');
    e.statusCode = 400;
    done(e);
  }
});
app.get('/healthz', async (req, reply) => reply.type('text/plain').send('ok\n'));
await app.register(idem.fastifyPlugin);
app.post('/charges', { config: { idempotency: r.sameTransaction.options } }, answer(r.sameTransaction.handler));
app.post('/charges/external', { config: { idempotency: r.committedFirst.options } }, answer(r.committedFirst.handler));
app.get('/charges/:id', async (req, reply) => send(reply, await r.getCharge(req, req.params.id)));
app.setNotFoundHandler((req, reply) => send(reply, problemResponse(404, 'No such route.')));
app.setErrorHandler((err, req, reply) => send(reply, errorResponse(err)));

/** An ordinary Fastify handler around a demo route. */
function answer(handler) {
  return async (request, reply) => {
    const { status, headers, body } = await handler(request, request.idempotency);
    reply.code(status).headers(headers);
    return Buffer.from(JSON.stringify(body)); // an object would get "; charset=utf-8" added to its Content-Type
  };
}

function send(reply, { status, headers, body }) {
  return reply.code(status).headers(headers).send(Buffer.from(body));
}

try {
  await app.listen({ host: opts.host, port: opts.port });
  console.error(`demo (fastify): listening on http://${opts.host}:${app.server.address().port}`);
} catch (e) {
  console.error(`demo (fastify): cannot listen on ${opts.host}:${opts.port}: ${e.message}`);
  process.exit(1);
}
