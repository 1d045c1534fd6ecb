// Fastify (4 or 5): a route handler; Fastify's JSON body parser gives request.body.
import { fieldLines } from './key.js';

/** @param {import('./middleware.js').Idempotency} idem */
export function fastifyRoute(idem, routeOptions, handler) {
  return async function idempotentRoute(request, reply) {
    const out = await idem.execute(routeOptions, handler, request, {
      method: request.method,
      route: request.routeOptions?.url ?? request.url,
      keyValues: fieldLines(request.raw.rawHeaders),
      body: request.body,
    });
    reply.code(out.status).headers(out.headers);
    // A Buffer is sent as it is: a string would get "; charset=utf-8" added to its Content-Type.
    return reply.send(Buffer.from(out.body));
  };
}
