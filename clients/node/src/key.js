// The Idempotency-Key request header (draft-ietf-httpapi-idempotency-key-header): exactly one
// field line whose value is an RFC 8941 sf-string, 1 to 255 printable ASCII characters.
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

/**
 * @param {string[]} values the raw values of every Idempotency-Key field line
 * @returns {{key: string} | {error: string}}
 */
export function parseIdempotencyKey(values) {
  if (values.length === 0) return { error: 'the request has no Idempotency-Key header' };
  if (values.length > 1) return { error: 'the Idempotency-Key header must appear once' };
  let item;
  try {
    item = parseItem(values[0]);
  } catch {
    return { error: 'the Idempotency-Key header is not an RFC 8941 structured field item' };
  }
  const [value, params] = item;
  if (typeof value !== 'string') {
    return { error: 'the Idempotency-Key must be a quoted string (RFC 8941 sf-string), e.g. "8e03978e-40d5"' };
  }
  if (params.size > 0) return { error: 'the Idempotency-Key takes no parameters' };
  if (value.length === 0) return { error: 'the Idempotency-Key is empty' };
  if (value.length > MAX_KEY_LENGTH) return { error: `the Idempotency-Key is longer than ${MAX_KEY_LENGTH} characters` };
  return { key: value };
}
