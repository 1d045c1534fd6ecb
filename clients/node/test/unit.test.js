// Pure modules: the Idempotency-Key parser and how responses are stored and replayed.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { fieldLines, parseIdempotencyKey } from '../src/key.js';
import { prepareResponse, storedBodyText } from '../src/response.js';
import { intervalText } from '../src/client.js';
import { HttpProblem, Refused } from '../src/problem.js';

test('Refused: the Python package\'s argument names (status, title, detail, headers); the positional form kept', () => {
  const r = new Refused({ status: 401, detail: 'Give your API key.', headers: { 'WWW-Authenticate': 'ApiKey' } });
  assert.deepEqual(r.toResponse(), {
    status: 401,
    headers: { 'Content-Type': 'application/problem+json', 'WWW-Authenticate': 'ApiKey' },
    body: JSON.stringify({ type: 'about:blank', title: 'Unauthorized', status: 401, detail: 'Give your API key.' }),
  });
  const old = new HttpProblem(402, 'Payment required', { detail: 'declined' });
  assert.ok(old instanceof Refused);
  assert.deepEqual(JSON.parse(old.toResponse().body), { type: 'about:blank', title: 'Payment required', status: 402, detail: 'declined' });
  assert.throws(() => new Refused({ status: 200 }), TypeError);
  assert.throws(() => new Refused(401.5, 'x'), TypeError);
});

test('Idempotency-Key: exactly one sf-string, or a bare value of token characters, of 1-255 characters', () => {
  assert.deepEqual(parseIdempotencyKey(['"abc"']), { key: 'abc' });
  assert.deepEqual(parseIdempotencyKey([' "a\\"b\\\\" ']), { key: 'a"b\\' });
  assert.deepEqual(parseIdempotencyKey(['"' + 'k'.repeat(255) + '"']), { key: 'k'.repeat(255) });
  assert.deepEqual(parseIdempotencyKey(['"a b;c"']), { key: 'a b;c' });
  for (const bare of ['k-bare', '8e03978e-40d5-43e8-bc93-6894a57f9324', '1', "!#$%&'*+-.^_`|~", 'k'.repeat(255),
    'a/b', 'a:b', 'tok-1:a/b']) {
    assert.deepEqual(parseIdempotencyKey([bare]), { key: bare }, bare);
  }
  for (const bad of [[], ['"a"', '"a"'], ['""'], [''], ['"' + 'k'.repeat(256) + '"'], ['k'.repeat(256)], ['"a";x=1'],
    ['"a", "b"'], ['"a\x01"'], ['"é"'], ['"abc'], ['?1'], ['a b'], ['a,b'], ['a;p=1'],
    ['a"b'], ['é'], ['a\x01']]) {
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
