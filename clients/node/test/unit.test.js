// Pure modules: the Idempotency-Key parser and how responses are stored and replayed.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { fieldLines, parseIdempotencyKey } from '../src/key.js';
import { prepareResponse, storedBodyText } from '../src/response.js';
import { intervalText } from '../src/client.js';

test('Idempotency-Key: exactly one sf-string of 1-255 printable ASCII', () => {
  assert.deepEqual(parseIdempotencyKey(['"abc"']), { key: 'abc' });
  assert.deepEqual(parseIdempotencyKey([' "a\\"b\\\\" ']), { key: 'a"b\\' });
  assert.deepEqual(parseIdempotencyKey(['"' + 'k'.repeat(255) + '"']), { key: 'k'.repeat(255) });
  for (const bad of [[], ['"a"', '"a"'], ['abc'], ['""'], ['"' + 'k'.repeat(256) + '"'], ['"a";x=1'], ['"a", "b"'],
    ['"a\x01"'], ['"é"'], ['"abc'], ['1'], ['?1'], [':YWJj:']]) {
    assert.ok('error' in parseIdempotencyKey(bad), JSON.stringify(bad));
  }
});

test('fieldLines keeps every field line, whatever the case of its name', () => {
  assert.deepEqual(fieldLines(['Host', 'x', 'Idempotency-Key', '"a"', 'idempotency-key', '"b"']), ['"a"', '"b"']);
});

test('a JSON response is stored as jsonb; text is stored as a string and replayed as the same text', () => {
  const j = prepareResponse({ status: 201, headers: { Location: '/c/1', 'X-Other': 'y' }, body: { id: 1 } });
  assert.equal(j.json, '{"id":1}');
  assert.equal(j.isJson, true);
  assert.deepEqual(j.stored, { Location: '/c/1', 'Content-Type': 'application/json' });
  const t = prepareResponse({ status: 200, body: 'plain {text}' });
  assert.equal(t.json, '"plain {text}"');
  assert.equal(t.isJson, false);
  assert.equal(storedBodyText(t.stored, t.json), 'plain {text}');
  assert.equal(storedBodyText({ 'Content-Type': 'application/json' }, '{"id": 1}'), '{"id": 1}');
  assert.equal(storedBodyText({ 'Content-Type': 'application/problem+json' }, '"s"'), '"s"');
  const invalid = prepareResponse({ headers: { 'content-type': 'application/json' }, body: 'not json' });
  assert.equal(invalid.isJson, false);
  assert.equal(prepareResponse({ status: 204 }).json, null);
});

test('intervals: milliseconds or interval text', () => {
  assert.equal(intervalText(1500), '1500 milliseconds');
  assert.equal(intervalText('30 seconds'), '30 seconds');
  assert.equal(intervalText(undefined), null);
  assert.throws(() => intervalText(NaN), TypeError);
});
