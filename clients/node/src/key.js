// The Idempotency-Key request header (draft-ietf-httpapi-idempotency-key-header), as
// contract/contract.json's key_header gives it.
import { parseItem } from 'structured-headers';

export const MAX_KEY_LENGTH = 255;

/** Values of every `name` field line, from Node's rawHeaders ([name, value, name, value, ...]). */
export function fieldLines(rawHeaders, name = 'idempotency-key') {
  const values = [];
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    if (rawHeaders[i].toLowerCase() === name) values.push(rawHeaders[i + 1]);
  }
  return values;
}

// RFC 9110 tchar, ':' and '/' (an sf-token's characters): what a bare (unquoted) key may hold.
const BARE_KEY = /^[!#$%&'*+\-.^_`|~0-9A-Za-z:/]+$/;
// An RFC 8941 sf-string without escapes (printable ASCII but '"' and '\\'), e.g. a quoted UUID: its
// value is what lies between the quotes; anything else goes to structured-headers' parser.
const PLAIN_QUOTED = /^"([\x20\x21\x23-\x5b\x5d-\x7e]*)"$/;

/**
 * contract/contract.json's key_header: exactly one field line holding an RFC 8941 sf-string
 * ("...") or a bare value of RFC 9110 token characters, ':' and '/' (a bare UUID, k-1001: what
 * Stripe-style clients send); 1 to 255 characters after unquoting.
 * @param {string[]} values the raw values of every Idempotency-Key field line
 * @returns {{key: string} | {error: string}}
 */
export function parseIdempotencyKey(values) {
  if (values.length === 0) return { error: 'the request has no Idempotency-Key header' };
  if (values.length > 1) return { error: 'the Idempotency-Key header must appear once' };
  const raw = values[0].replace(/^[ \t]+|[ \t]+$/g, '');
  let value = raw;
  const plain = PLAIN_QUOTED.exec(raw);
  if (plain) {
    value = plain[1];
  } else if (raw.startsWith('"')) {
    let item;
    try {
      item = parseItem(raw);
    } catch {
      return { error: 'the Idempotency-Key is not a well-formed quoted string (RFC 8941 sf-string), e.g. "8e03978e-40d5"' };
    }
    if (typeof item[0] !== 'string' || item[1].size > 0) {
      return { error: 'the Idempotency-Key must be one quoted string, without parameters' };
    }
    value = item[0];
  } else if (!BARE_KEY.test(raw) && raw !== '') {
    return { error: "a bare Idempotency-Key may hold letters, digits and !#$%&'*+-.^_`|~:/ only; quote it: \"...\"" };
  }
  if (value.length === 0) return { error: 'the Idempotency-Key is empty' };
  if (value.length > MAX_KEY_LENGTH) return { error: `the Idempotency-Key is longer than ${MAX_KEY_LENGTH} characters` };
  return { key: value };
}
