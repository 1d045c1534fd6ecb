// RFC 9457 problem details, and the refusal a handler (or a tenant/scope function) throws to
// answer with one. A thrown Refused means "not carried out": the claim is released or rolled
// back, never stored.
import { STATUS_CODES } from 'node:http';

export class Refused extends Error {
  /**
   * The argument names of the Python package's Refused: `new Refused({ status: 401, title:
   * 'Unauthorized', detail: '...', headers: { 'WWW-Authenticate': '...' } })` (title defaults to
   * the status's reason phrase). The older positional form `(status, title, { detail, type,
   * headers })` is kept.
   * @param {number | {status: number, title?: string, detail?: string, type?: string, headers?: Record<string, string>}} status
   * @param {string} [title]
   * @param {{detail?: string, type?: string, headers?: Record<string, string>}} [o]
   */
  constructor(status, title, o = {}) {
    const a = refusalArguments(status, title, o);
    super(a.detail ?? a.title);
    this.name = 'Refused';
    this.status = a.status;
    this.title = a.title;
    this.detail = a.detail;
    this.type = a.type ?? 'about:blank';
    this.headers = a.headers ?? {};
  }

  /** The response: { status, headers, body } with body as text. */
  toResponse() {
    const problem = { type: this.type, title: this.title, status: this.status };
    if (this.detail !== undefined) problem.detail = this.detail;
    return {
      status: this.status,
      headers: { 'Content-Type': 'application/problem+json', ...this.headers },
      body: JSON.stringify(problem),
    };
  }
}

function refusalArguments(status, title, o) {
  const a = typeof status === 'object' && status !== null ? { ...status } : { ...o, status, title };
  if (!Number.isInteger(a.status) || a.status < 400 || a.status > 599) {
    throw new TypeError(`Refused: status must be an HTTP error status (400-599), got ${a.status}`);
  }
  a.title ??= STATUS_CODES[a.status] ?? 'Error';
  return a;
}

// The middleware's answers, exactly as contract/contract.json gives them (test/contract.test.js
// checks this table against it).
export const PROBLEM_TYPE_PREFIX = 'urn:pg-idempotency:problem:';
export const PROBLEMS = Object.freeze({
  'idempotency-key-missing': { status: 400, title: 'Idempotency-Key missing',
    detail: 'This request requires an Idempotency-Key header.' },
  'idempotency-key-invalid': { status: 400, title: 'Idempotency-Key invalid',
    detail: 'The Idempotency-Key header must appear once and hold 1 to 255 characters, none of them control characters.' },
  'idempotency-key-in-progress': { status: 409, title: 'Request in progress',
    detail: 'A request with this Idempotency-Key is still being processed. Retry later.', retryAfter: true },
  'idempotency-key-superseded': { status: 409, title: 'Request taken over',
    detail: 'This attempt lost its claim on the Idempotency-Key to a later one. Retry to get the result.', retryAfter: true },
  'idempotency-key-reused': { status: 422, title: 'Idempotency-Key reused',
    detail: 'This Idempotency-Key was used with a different request payload. Use a new key for a new request.' },
  'idempotency-key-expired': { status: 410, title: 'Idempotency-Key expired',
    detail: 'This Idempotency-Key was used and its stored response has expired. Use a new key.' },
  'service-unavailable': { status: 503, title: 'Service unavailable',
    detail: 'The database could not be reached; nothing was done. Retry later.', retryAfter: true },
  'internal-error': { status: 500, title: 'Internal server error', detail: 'The request failed.' },
});

/** The contract's answer `slug`, with Retry-After (seconds, at least 1) where it has one. */
export function contractProblem(slug, retryAfterSeconds = 1) {
  const p = PROBLEMS[slug];
  if (!p) throw new Error(`no problem ${slug} in the contract`);
  const headers = p.retryAfter ? { 'Retry-After': String(Math.max(1, Math.ceil(retryAfterSeconds ?? 1))) } : {};
  return new Refused({ status: p.status, title: p.title, type: PROBLEM_TYPE_PREFIX + slug, detail: p.detail, headers });
}

/** The name this package first gave Refused (the same class). */
export const HttpProblem = Refused;

export const problems = {
  missingKey: () => contractProblem('idempotency-key-missing'),
  badKey: () => contractProblem('idempotency-key-invalid'),
  inProgress: (seconds) => contractProblem('idempotency-key-in-progress', seconds),
  superseded: () => contractProblem('idempotency-key-superseded'),
  mismatch: () => contractProblem('idempotency-key-reused'),
  expired: () => contractProblem('idempotency-key-expired'),
  unavailable: () => contractProblem('service-unavailable'),
  internal: () => contractProblem('internal-error'),
};
