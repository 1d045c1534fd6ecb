export { IdempotencyClient, Outcome, intervalText } from './client.js';
export * from './errors.js';
export { contractProblem } from './problem.js';
export { fingerprint } from './fingerprint.js';
export { parseIdempotencyKey, fieldLines, MAX_KEY_LENGTH } from './key.js';
export { HttpProblem, Refused } from './problem.js';
export { Idempotency, Mode, REFUSED_STATUSES, answerWithoutWork } from './middleware.js';
import { Idempotency } from './middleware.js';
import { expressMiddleware, expressRoute } from './express.js';
export { DEFAULT_METHODS, expressProblemHandler } from './express.js';
import { fastifyPlugin, fastifyRoute } from './fastify.js';

/**
 * One object per application: `idem.express(routeOptions, handler)` and
 * `idem.fastify(routeOptions, handler)` make idempotent route handlers; `idem.middleware(routeOptions)`
 * is Express middleware before ordinary handlers; `app.register(idem.fastifyPlugin, options)` is
 * Fastify's plugin.
 */
export function createIdempotency(options) {
  const idem = new Idempotency(options);
  Object.assign(idem, {
    express: (routeOptions, handler) => expressRoute(idem, routeOptions, handler),
    middleware: (routeOptions) => expressMiddleware(idem, routeOptions),
    fastify: (routeOptions, handler) => fastifyRoute(idem, routeOptions, handler),
  });
  idem.fastifyPlugin = fastifyPlugin(idem);
  return idem;
}
export { Sender, prepare, keyHeader, parseRetryAfter, MAX_RETRY_AFTER_MS, SEND_CHANNEL } from './sender.js';
