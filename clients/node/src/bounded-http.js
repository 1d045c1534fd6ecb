// An HTTP POST bounded in total time: the name lookup, connecting, sending and reading the whole
// answer end by one deadline, whatever the other side does (a receiver that answers a byte at a
// time never lets a per-read timeout fire). When the deadline passes the request is destroyed, and
// its socket with it, so nothing more is sent or read. Connections are kept between attempts
// (keep-alive agents); node:http and node:https only.
import http from 'node:http';
import https from 'node:https';

/** No HTTP answer: refused, reset, timed out. The message says which. */
export class NoAnswer extends Error {
  constructor(message) {
    super(message);
    this.name = 'NoAnswer';
  }
}

// The socket's errors before any byte reached the receiver.
const CONNECT_CODES = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', 'EADDRNOTAVAIL']);

export class BoundedClient {
  constructor({ maxSockets = 10 } = {}) {
    const options = { keepAlive: true, maxSockets, maxFreeSockets: maxSockets };
    this.agents = { 'http:': new http.Agent(options), 'https:': new https.Agent(options) };
  }

  /**
   * POSTs `body` (a string or Buffer) to `url`; resolves { status, headers (names in lower case;
   * repeated ones joined with ", "), body (text) } within `timeoutMs` of the call, or rejects with
   * NoAnswer.
   */
  post(url, body, headers, timeoutMs) {
    return new Promise((resolve, reject) => {
      let req;
      let timer;
      let settled = false;
      const settle = (fn, value) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        fn(value);
      };
      const fail = (e) => settle(reject, e instanceof NoAnswer ? e
        : new NoAnswer(CONNECT_CODES.has(e?.code) ? `connection failed: ${e.code}` : `no answer: ${e?.code ?? e?.message ?? e}`));
      let u;
      try {
        u = new URL(url);
      } catch {
        fail(new NoAnswer(`not a URL: ${url}`));
        return;
      }
      const agent = this.agents[u.protocol];
      if (!agent) {
        fail(new NoAnswer(`not an http(s) URL: ${url}`));
        return;
      }
      const payload = Buffer.from(body);
      timer = setTimeout(() => {
        fail(new NoAnswer('timed out'));
        req.destroy();
      }, timeoutMs);
      req = (u.protocol === 'https:' ? https : http).request(u, {
        method: 'POST', agent, headers: { ...headers, 'Content-Length': payload.length },
      });
      req.on('error', fail);
      req.on('response', (res) => {
        const chunks = [];
        res.on('data', (c) => chunks.push(c));
        res.on('error', fail);
        res.on('aborted', () => fail(new NoAnswer('no answer: the connection closed before the whole answer')));
        res.on('end', () => {
          if (!res.complete) return fail(new NoAnswer('no answer: the connection closed before the whole answer'));
          const answerHeaders = {};
          for (let i = 0; i < res.rawHeaders.length; i += 2) { // a name more than once: its values joined
            const name = res.rawHeaders[i].toLowerCase();
            const value = res.rawHeaders[i + 1];
            answerHeaders[name] = Object.hasOwn(answerHeaders, name) ? `${answerHeaders[name]}, ${value}` : value;
          }
          settle(resolve, { status: res.statusCode, headers: answerHeaders, body: Buffer.concat(chunks).toString('utf8') });
        });
      });
      req.end(payload);
    });
  }

  /** Closes the kept connections. */
  close() {
    for (const agent of Object.values(this.agents)) agent.destroy();
  }
}
