export { IdempotencyClient, Outcome, intervalText } from './client.js';
export * from './errors.js';
export { contractProblem } from './problem.js';
export { fingerprint } from './fingerprint.js';
export { parseIdempotencyKey, fieldLines, MAX_KEY_LENGTH } from './key.js';
export { HttpProblem, Refused } from './problem.js';
export { Idempotency, Mode, answerWithoutWork } from './middleware.js';
import { Idempotency } from './middleware.js';
import { expressRoute } from './express.js';
import { fastifyRoute } from './fastify.js';

/**
 * One object per application: `idem.express(routeOptions, handler)` and
 * `idem.fastify(routeOptions, handler)` make idempotent route handlers.
 */
export function createIdempotency(options) {
  const idem = new Idempotency(options);
  return Object.assign(idem, {
    express: (routeOptions, handler) => expressRoute(idem, routeOptions, handler),
    fastify: (routeOptions, handler) => fastifyRoute(idem, routeOptions, handler),
  });
}
