// Fastify (4 or 5).
//   idem.fastify(routeOptions, handler): a route handler returning { status, headers, body };
//   app.register(idem.fastifyPlugin, { methods, ...routeOptions }): hooks on every route of the
//     app with ordinary handlers (return a value, reply.code().send(), throw): the claim in
//     preHandler (after Fastify's parsing and schema validation, so a request they refuse claims
//     nothing), the answer captured, stored and sent in onSend. A route's own options are its
//     `config: { idempotency: {...} }`; `config: { idempotency: false }` leaves it out.
import { fieldLines } from './key.js';
import { DEFAULT_METHODS } from './express.js';

function inputOf(request) {
  return {
    method: request.method,
    route: request.routeOptions?.url ?? request.url,
    keyValues: fieldLines(request.raw.rawHeaders),
    body: request.body,
  };
}

// A Buffer is sent as it is: a string would get "; charset=utf-8" added to its Content-Type.
const send = (reply, out) => reply.code(out.status).headers(out.headers).send(Buffer.from(out.body));

/** @param {import('./middleware.js').Idempotency} idem */
export function fastifyRoute(idem, routeOptions, handler) {
  return async function idempotentRoute(request, reply) {
    return send(reply, await idem.execute(routeOptions, handler, request, inputOf(request)));
  };
}

const RUN = Symbol('pg-idempotency run');
const FRAMING = new Set(['content-length', 'transfer-encoding', 'etag']);

/** @param {import('./middleware.js').Idempotency} idem */
export function fastifyPlugin(idem) {
  async function idempotencyPlugin(fastify, { methods = DEFAULT_METHODS, ...pluginOptions }) {
    fastify.decorateRequest('idempotency', null);

    fastify.addHook('preHandler', async (request, reply) => {
      const routeConfig = request.routeOptions?.config?.idempotency;
      if (routeConfig === false || !methods.includes(request.method)) return;
      let started;
      const ready = new Promise((resolve) => (started = resolve));
      let deliver;
      const answered = new Promise((resolve) => (deliver = resolve));
      const runHandler = (req, ctx) => {
        request.idempotency = ctx;
        started(true);
        return answered;
      };
      const run = idem.execute({ ...pluginOptions, ...routeConfig }, runHandler, request, inputOf(request));
      const first = await Promise.race([ready, run]);
      if (first === true) {
        request[RUN] = { deliver, run };
        return;
      }
      return send(reply, first); // replay, 4xx/409/422/503: the handler does not run
    });

    fastify.addHook('onSend', async (request, reply, payload) => {
      const r = request[RUN];
      if (!r) return payload;
      request[RUN] = undefined;
      const headers = {};
      for (const [name, value] of Object.entries(reply.getHeaders())) {
        if (!FRAMING.has(name)) headers[name] = value;
        else reply.removeHeader(name);
      }
      r.deliver({ status: reply.statusCode, headers, body: await payloadBuffer(payload) });
      const out = await r.run;
      reply.code(out.status).headers(out.headers);
      return Buffer.from(out.body);
    });

    // The request ended without an answer (the client went away first): the claim is not kept.
    fastify.addHook('onResponse', async (request) => {
      request[RUN]?.deliver({ status: 500, headers: {}, body: '' });
    });
  }
  idempotencyPlugin[Symbol.for('skip-override')] = true; // the hooks apply to the whole app (fastify-plugin's way)
  idempotencyPlugin[Symbol.for('fastify.display-name')] = 'pg-idempotency';
  idempotencyPlugin[Symbol.for('plugin-meta')] = { name: 'pg-idempotency', fastify: '4.x || 5.x' };
  return idempotencyPlugin;
}

async function payloadBuffer(payload) {
  if (payload === null || payload === undefined) return Buffer.alloc(0);
  if (typeof payload === 'string' || Buffer.isBuffer(payload)) return Buffer.from(payload);
  const chunks = [];
  for await (const chunk of payload) chunks.push(Buffer.from(chunk));
  return Buffer.concat(chunks);
}
