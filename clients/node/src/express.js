// Express (4 or 5). Put express.json() before these so req.body is parsed.
//   idem.express(routeOptions, handler): a route handler returning { status, headers, body };
//   idem.middleware(routeOptions): ordinary middleware (app.use or per route) before ordinary
//     handlers that answer with res (res.status().json(), next(err)); the answer is captured,
//     stored and sent.
import { isUnavailable } from './errors.js';
import { fieldLines } from './key.js';
import { Refused, contractProblem } from './problem.js';

/** The methods app.use(idem.middleware()) protects; other requests pass through. */
export const DEFAULT_METHODS = Object.freeze(['POST', 'PATCH']);

function inputOf(req) {
  return {
    method: req.method,
    route: req.baseUrl + (req.route?.path ?? req.path),
    keyValues: fieldLines(req.rawHeaders),
    body: req.body,
  };
}

function send(res, out) {
  res.status(out.status);
  for (const [name, value] of Object.entries(out.headers)) res.setHeader(name, value);
  res.setHeader('Content-Length', Buffer.byteLength(out.body));
  res.end(out.body);
}

/** @param {import('./middleware.js').Idempotency} idem */
export function expressRoute(idem, routeOptions, handler) {
  return async function idempotentRoute(req, res, next) {
    try {
      send(res, await idem.execute(routeOptions, handler, req, inputOf(req)));
    } catch (e) {
      next(e);
    }
  };
}

/** @param {import('./middleware.js').Idempotency} idem */
export function expressMiddleware(idem, { methods = DEFAULT_METHODS, ...routeOptions } = {}) {
  return function idempotency(req, res, next) {
    if (!methods.includes(req.method)) return next();
    const runRest = (r, ctx) => {
      req.idempotency = ctx;
      const captured = captureResponse(res);
      next();
      return captured;
    };
    idem.execute(routeOptions, runRest, req, inputOf(req)).then((out) => send(res, out)).catch(next);
  };
}

// Headers that describe the captured bytes, not the answer (the stored body is sent instead).
const FRAMING = new Set(['content-length', 'transfer-encoding', 'etag']);

/**
 * Holds back what the rest of the chain writes to `res` (writeHead, write, end) and resolves to
 * it as { status, headers, body (Buffer) } once it ends; `res` is then as before, headers cleared.
 */
function captureResponse(res) {
  return new Promise((resolve) => {
    const own = { writeHead: res.writeHead, write: res.write, end: res.end };
    const chunks = [];
    const add = (chunk, encoding) => {
      if (chunk !== undefined && chunk !== null && typeof chunk !== 'function') {
        chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk, typeof encoding === 'string' ? encoding : 'utf8'));
      }
    };
    res.writeHead = (status, reason, headers) => {
      res.statusCode = status;
      const h = typeof reason === 'object' ? reason : headers;
      if (h && !Array.isArray(h)) for (const [k, v] of Object.entries(h)) res.setHeader(k, v);
      return res;
    };
    res.write = (chunk, encoding, cb) => {
      add(chunk, encoding);
      (typeof encoding === 'function' ? encoding : cb)?.();
      return true;
    };
    res.end = (chunk, encoding, cb) => {
      add(chunk, encoding);
      Object.assign(res, own);
      const headers = {};
      for (const [name, value] of Object.entries(res.getHeaders())) {
        if (!FRAMING.has(name)) headers[name] = value;
        res.removeHeader(name);
      }
      resolve({ status: res.statusCode, headers, body: Buffer.concat(chunks) });
      [chunk, encoding, cb].find((f) => typeof f === 'function')?.();
      return res;
    };
  });
}

/**
 * An Express error handler (app.use(...) last): a thrown or next()-ed Refused answered as its
 * problem+json, the database unavailable as 503 service-unavailable; anything else goes on.
 */
export function expressProblemHandler() {
  return function idempotencyProblems(err, req, res, next) {
    let problem;
    if (err instanceof Refused) problem = err;
    else if (isUnavailable(err)) problem = contractProblem('service-unavailable');
    else return next(err);
    const out = problem.toResponse();
    res.status(out.status).set(out.headers).end(out.body);
  };
}
