// The package against contract/contract.json, the repository's one description of the contract:
// its outcome words, its SQLSTATE map, its refused statuses and every problem answer the
// middleware makes (type, title, detail, status, Retry-After) are exactly the description's. No I/O.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { Outcome } from '../src/client.js';
import { BY_SQLSTATE, IdempotencyError, mapError } from '../src/errors.js';
import { Idempotency, REFUSED_STATUSES, answerWithoutWork } from '../src/middleware.js';
import { PROBLEMS, PROBLEM_TYPE_PREFIX, contractProblem, problems } from '../src/problem.js';

const contract = JSON.parse(readFileSync(new URL('../../../contract/contract.json', import.meta.url), 'utf8'));
const bySlug = Object.fromEntries(contract.problems.map((p) => [p.slug, p]));

function assertIsProblem(answer, slug) {
  const p = bySlug[slug];
  const headers = Object.fromEntries(Object.entries(answer.headers).map(([k, v]) => [k.toLowerCase(), v]));
  assert.equal(answer.status, p.status, `${slug}: status`);
  assert.equal(headers['content-type'], 'application/problem+json');
  assert.deepEqual(JSON.parse(answer.body),
    { type: contract.problem_type_prefix + slug, title: p.title, status: p.status, detail: p.detail }, slug);
  assert.equal('retry-after' in headers, (p.headers ?? []).includes('Retry-After'), `${slug}: Retry-After`);
  if ('retry-after' in headers) assert.ok(Number(headers['retry-after']) >= 1);
}

test('the package describes the contract\'s problems and no other', () => {
  assert.equal(PROBLEM_TYPE_PREFIX, contract.problem_type_prefix);
  assert.deepEqual(Object.keys(PROBLEMS).sort(), Object.keys(bySlug).sort());
});

for (const slug of Object.keys(bySlug)) {
  test(`problem ${slug}: the body is the contract's`, () => assertIsProblem(contractProblem(slug).toResponse(), slug));
}

test('outcome words are the contract\'s', () => {
  assert.deepEqual(Object.values(Outcome).sort(), contract.outcomes.map((o) => o.outcome).sort());
});

for (const o of contract.outcomes) {
  test(`outcome ${o.outcome}: answered with HTTP ${o.http_status}`, () => {
    const claim = { outcome: o.outcome, retryAfterSeconds: 3, responseStatus: 201, responseHeaders: { Location: '/x' }, responseBodyText: '{"id": 1}' };
    if (o.http_status === null) {
      assert.throws(() => answerWithoutWork(claim)); // the handler runs
    } else if (o.http_status === 'stored') {
      const a = answerWithoutWork(claim);
      assert.deepEqual([a.status, a.body, a.replayed], [201, '{"id": 1}', true]);
    } else {
      const a = answerWithoutWork(claim);
      assert.equal(a.status, o.http_status);
      assertIsProblem(a, o.problem);
    }
  });
}

test('in_progress: Retry-After is the lease left', () => {
  assert.equal(answerWithoutWork({ outcome: 'in_progress', retryAfterSeconds: 7 }).headers['Retry-After'], '7');
});

test('REFUSED_STATUSES is the contract\'s refused_statuses', () => {
  assert.deepEqual([...REFUSED_STATUSES], contract.refused_statuses.statuses);
});

const noDatabase = () => {
  throw new Error('no database in this test');
};
const pool = { connect: noDatabase, query: noDatabase, listenerCount: () => 1 };
for (const [name, values, slug] of [
  ['missing', [], 'idempotency-key-missing'],
  ['twice', ['"a"', '"b"'], 'idempotency-key-invalid'],
  ['empty', ['""'], 'idempotency-key-invalid'],
  ['a bare value with a space', ['a b'], 'idempotency-key-invalid'],
  ['256 characters', [`"${'k'.repeat(256)}"`], 'idempotency-key-invalid'],
]) {
  test(`a key ${name}: answered with ${slug}`, async () => {
    const idem = new Idempotency({ pool, logger: { error() {}, warn() {} } });
    const a = await idem.execute({}, () => assert.fail('the handler must not run'), {}, { method: 'POST', route: '/x', keyValues: values, body: {} });
    assertIsProblem(a, slug);
  });
}

test('a claim taken over answers superseded; a failure answers internal-error', () => {
  assertIsProblem(problems.superseded().toResponse(), 'idempotency-key-superseded');
  assertIsProblem(problems.internal().toResponse(), 'internal-error');
});

test('the SQLSTATE map is the contract\'s', () => {
  const described = new Set(contract.sqlstates.map((s) => s.code));
  const forClients = contract.sqlstates.filter((s) => s.client).map((s) => s.code);
  assert.deepEqual(Object.keys(BY_SQLSTATE).filter((c) => !described.has(c)), [], 'codes the description does not give');
  assert.deepEqual(forClients.filter((c) => !(c in BY_SQLSTATE)), [], 'codes every client maps, missing here');
  for (const code of Object.keys(BY_SQLSTATE)) {
    const e = mapError({ code, message: 'm' });
    assert.ok(e instanceof IdempotencyError && e.code === code, code);
  }
});
