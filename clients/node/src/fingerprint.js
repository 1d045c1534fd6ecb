// RFC 8785 (JSON Canonicalization Scheme) fingerprint of a JSON value, the same text
// idempotency.idem_fingerprint(jsonb, ignore) returns: 'sha256:' || hex.
import { createHash } from 'node:crypto';
import canonicalize from 'canonicalize';

/**
 * @param {unknown} value a parsed JSON value
 * @param {string[]} [ignore] top-level fields left out (only when value is an object)
 */
export function fingerprint(value, ignore = []) {
  let v = value;
  if (ignore.length && v !== null && typeof v === 'object' && !Array.isArray(v)) {
    v = Object.fromEntries(Object.entries(v).filter(([k]) => !ignore.includes(k)));
  }
  const text = canonicalize(v);
  if (text === undefined) throw new TypeError('fingerprint: the value is not JSON');
  return 'sha256:' + createHash('sha256').update(text, 'utf8').digest('hex');
}
