#!/usr/bin/env node
// The demo charges service on Express, with the package's middleware before ordinary handlers:
//   node demo/express.js --database-url postgresql://... --listen 127.0.0.1:8080
import http from 'node:http';
import express from 'express';
import { createIdempotency, expressProblemHandler } from '../src/index.js';
import { errorResponse, openPool, options, problemResponse, routes } from './charges.js';

const opts = options();
const pool = await openPool(opts.databaseUrl);
const r = routes(pool, opts);
const idem = createIdempotency(r.idempotency);

const app = express();
app.disable('x-powered-by');
app.use(express.json({ type: () => true }));
app.get('/healthz', (req, res) => res.type('text/plain').send('ok\n'));
app.post('/charges', idem.middleware(r.sameTransaction.options), answer(r.sameTransaction.handler));
app.post('/charges/external', idem.middleware(r.committedFirst.options), answer(r.committedFirst.handler));
app.get('/charges/:id', async (req, res) => reply(res, await r.getCharge(req, req.params.id)));
app.use((req, res) => reply(res, problemResponse(404, 'No such route.')));
// express.json() refusing the body (not JSON, too large) lands here: 400 before any claim; the
// database unavailable under GET /charges/:id: 503.
app.use(expressProblemHandler());
app.use((err, req, res, _next) => reply(res, errorResponse(err, 'The body is not valid JSON.')));

/** An ordinary Express handler around a demo route (a thrown Refused goes to next()). */
function answer(handler) {
  return async (req, res, next) => {
    try {
      const { status, headers, body } = await handler(req, req.idempotency);
      res.status(status);
      for (const [name, value] of Object.entries(headers)) res.setHeader(name, value); // res.set would add a charset
      res.send(Buffer.from(JSON.stringify(body)));
    } catch (e) {
      next(e);
    }
  };
}

function reply(res, { status, headers, body }) {
  res.status(status).set(headers).end(body);
}

const server = http.createServer(app);
server.on('error', (e) => {
  console.error(`demo (express): cannot listen on ${opts.host}:${opts.port}: ${e.message}`);
  process.exit(1);
});
server.listen(opts.port, opts.host, () => {
  console.error(`demo (express): listening on http://${opts.host}:${server.address().port}`);
});
