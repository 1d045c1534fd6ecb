// RFC 9457 problem details, and an error a handler (or a tenant/scope function) throws to
// answer with one. A thrown HttpProblem means "not carried out": the claim is released or
// rolled back, never stored.

export class HttpProblem extends Error {
  /**
   * @param {number} status
   * @param {string} title
   * @param {{detail?: string, type?: string, headers?: Record<string, string>}} [o]
   */
  constructor(status, title, { detail, type, headers = {} } = {}) {
    super(detail ?? title);
    this.name = 'HttpProblem';
    this.status = status;
    this.title = title;
    this.detail = detail;
    this.type = type ?? 'about:blank';
    this.headers = headers;
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

const TYPE = 'urn:pg-idempotency:problem:';

export const problems = {
  badKey: (detail) => new HttpProblem(400, 'Invalid Idempotency-Key', { type: TYPE + 'invalid-idempotency-key', detail }),
  inProgress: (seconds) => new HttpProblem(409, 'A request with this Idempotency-Key is being processed', {
    type: TYPE + 'idempotency-key-in-progress',
    detail: 'The first request with this Idempotency-Key is still being processed. Retry later.',
    headers: { 'Retry-After': String(Math.max(1, seconds ?? 1)) },
  }),
  superseded: () => new HttpProblem(409, 'A request with this Idempotency-Key is being processed', {
    type: TYPE + 'idempotency-key-superseded',
    detail: 'This attempt lost its claim on the Idempotency-Key to a later one. Retry to get the result.',
    headers: { 'Retry-After': '1' },
  }),
  mismatch: () => new HttpProblem(422, 'Idempotency-Key is already used', {
    type: TYPE + 'idempotency-key-reused',
    detail: 'This Idempotency-Key was used with a different request payload. Use a new key for a new request.',
  }),
  expired: () => new HttpProblem(410, 'Idempotency-Key has expired', {
    type: TYPE + 'idempotency-key-expired',
    detail: 'This Idempotency-Key was used and its stored response has expired. Use a new key.',
  }),
  internal: () => new HttpProblem(500, 'Internal Server Error', {
    detail: 'The request failed.',
  }),
};
