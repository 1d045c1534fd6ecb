// Express (4 or 5): a route handler. Put express.json() before it so req.body is parsed.
import { fieldLines } from './key.js';

/** @param {import('./middleware.js').Idempotency} idem */
export function expressRoute(idem, routeOptions, handler) {
  return async function idempotentRoute(req, res, next) {
    try {
      const out = await idem.execute(routeOptions, handler, req, {
        method: req.method,
        route: req.baseUrl + (req.route?.path ?? req.path),
        keyValues: fieldLines(req.rawHeaders),
        body: req.body,
      });
      res.status(out.status);
      for (const [name, value] of Object.entries(out.headers)) res.setHeader(name, value);
      res.end(out.body);
    } catch (e) {
      next(e);
    }
  };
}
