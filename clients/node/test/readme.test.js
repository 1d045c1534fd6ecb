// README.md as a new user follows it: its build command in the repository, its install command in
// a fresh npm project (the built tarball copied into the project's vendor/), a later plain
// `npm install`, then its two example apps, which are the files in examples/ (checked), copied
// into the project and run as they are against the real database over real HTTP: an order, its
// replay, another body, no key, a body the app refuses; the database restarted under the idle app,
// stopped under a stream of requests, started again.
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { copyFileSync, lstatSync, mkdirSync, readFileSync, rmSync } from 'node:fs';
import { basename } from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import {
  DATABASE_URL, database, isProblem, isUnavailableAnswer, newKey, newPool, quoted, request, sleep, takePort,
} from './harness.js';

const here = fileURLToPath(new URL('..', import.meta.url));
const repo = fileURLToPath(new URL('../../..', import.meta.url));
const readme = readFileSync(here + 'README.md', 'utf8');
const devVersions = JSON.parse(readFileSync(here + 'package.json', 'utf8')).devDependencies;
const work = process.env.SUITE_DIR && `${process.env.SUITE_DIR}/readme`;
const skip = work ? database.skip : 'SUITE_DIR is not set (test.sh sets it)';

const buildBlock = () => [...readme.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1])
  .find((b) => b.includes('scripts/build-artifacts.sh node'));
const installBlock = () => /<!-- install: [^\n]*-->\n```sh\n([\s\S]*?)```/.exec(readme)?.[1];
const fileBlock = (file) => new RegExp(`<!-- file: examples/${file} -->\\n\`\`\`js\\n([\\s\\S]*?)\`\`\``).exec(readme)?.[1];

const pool = newPool();
after(() => pool.end());
const app = `${work}/my-app`;
const sh = (cmd, cwd) => execFileSync('bash', ['-euo', 'pipefail', '-c', cmd], { cwd, stdio: ['ignore', 'pipe', 'inherit'], encoding: 'utf8' });

before(() => {
  if (!work) return;
  rmSync(work, { recursive: true, force: true });
  mkdirSync(app, { recursive: true });
  sh('npm init -y >/dev/null', app);
});

test('the README\'s build command makes the tarball its install command installs; a later plain npm install keeps it', { skip }, () => {
  const build = buildBlock();
  const install = installBlock();
  assert.ok(build && install, 'README.md has the build block and the install block');
  const built = sh(build.trim(), repo).trim().split('\n').pop();
  const tarball = /\.\/vendor\/(\S+\.tgz)/.exec(install)?.[1];
  assert.equal(tarball, basename(built), 'the install command names the file the build command makes');
  mkdirSync(`${app}/vendor`);
  copyFileSync(built, `${app}/vendor/${tarball}`);
  sh(`${install.trim()} --no-audit --no-fund --loglevel=error`, app);
  const manifest = JSON.parse(readFileSync(`${app}/package.json`, 'utf8'));
  assert.equal(manifest.dependencies['pg-idempotency'], `file:vendor/${tarball}`, 'a path inside the application');
  assert.ok(!lstatSync(`${app}/node_modules/pg-idempotency`).isSymbolicLink(), 'a copy, not a link to the clone');
  // Later, another framework: npm installs the tarball again, with its dependencies.
  sh(`npm install --no-audit --no-fund --loglevel=error fastify@${devVersions.fastify}`, app);
  const out = sh(`node --input-type=module -e "import('pg-idempotency').then((m) => console.log(typeof m.createIdempotency))"`, app);
  assert.equal(out.trim(), 'function');
});

/** The example app `file`, started in the project; resolves once it answers HTTP. */
async function startExample(file) {
  const port = takePort();
  const proc = spawn(process.execPath, [file], {
    cwd: app, env: { ...process.env, DATABASE_URL, PORT: String(port) }, stdio: ['ignore', 'pipe', 'pipe'],
  });
  let log = '';
  proc.stdout.on('data', (d) => (log += d));
  proc.stderr.on('data', (d) => (log += d));
  const example = { port, proc, log: () => log, alive: () => proc.exitCode === null && proc.signalCode === null };
  for (let i = 0; i < 200; i++) {
    assert.ok(example.alive(), `${file} exited:\n${log}`);
    if (await request(port, 'GET', '/', { timeout: 1000 }).catch(() => null)) return example;
    await sleep(50);
  }
  proc.kill('SIGKILL');
  throw new Error(`${file} did not answer:\n${log}`);
}

async function ordersOf(items) {
  const { rows } = await pool.query('SELECT item, count(*)::int AS n FROM orders WHERE item = ANY ($1) GROUP BY item', [items]);
  return Object.fromEntries(rows.map((r) => [r.item, r.n]));
}

/** POSTs fresh keys from six clients at once until stop() resolves; each answer with its time. */
function stream(port) {
  const answers = [];
  let streaming = true;
  const client = async () => {
    while (streaming) {
      const key = newKey();
      const started = Date.now();
      const r = await request(port, 'POST', '/orders', { headers: { 'Idempotency-Key': quoted(key) }, body: { item: key } })
        .catch((e) => ({ status: 0, headers: {}, body: e.message }));
      answers.push({ key, r, ms: Date.now() - started });
      await sleep(50);
    }
  };
  const clients = Array.from({ length: 6 }, client);
  return { answers, stop: () => ((streaming = false), Promise.all(clients)) };
}

for (const file of ['express-app.mjs', 'fastify-app.mjs']) {
  test(`the README shows examples/${file} as it is`, () => {
    assert.equal(fileBlock(file), readFileSync(`${here}examples/${file}`, 'utf8'));
  });

  test(`examples/${file} copied into the project: an order, its replay, 422, 400s; the database restarted, stopped under load, started`,
    { skip }, async () => {
      copyFileSync(`${here}examples/${file}`, `${app}/${file}`);
      const example = await startExample(file);
      const post = (key, body) => request(example.port, 'POST', '/orders',
        { headers: key === undefined ? {} : { 'Idempotency-Key': key }, body });
      try {
        const item = 'item-' + newKey();
        const first = await post(quoted(item), { item });
        assert.equal(first.status, 201, first.body);
        const order = JSON.parse(first.body);
        assert.equal(order.item, item);
        assert.equal(first.headers.location, `/orders/${order.id}`);
        const again = await post(item, { item }); // the same key, bare this time
        assert.equal(again.headers['idempotent-replayed'], 'true');
        assert.equal(again.body, first.body);
        const other = await post(quoted(item), { item: 'another' });
        assert.ok(isProblem(other, 422), `${other.status} ${other.body}`);
        assert.equal(JSON.parse(other.body).type, 'urn:pg-idempotency:problem:idempotency-key-reused');
        assert.ok(isProblem(await post(undefined, { item }), 400), 'no key');
        const refusedKey = newKey();
        assert.equal((await post(quoted(refusedKey), { note: 'no item' })).status, 400, 'a body the app refuses');
        assert.equal((await post(quoted(refusedKey), { item: refusedKey })).status, 201, 'the refused key stayed free');
        assert.deepEqual(await ordersOf([item, 'another', refusedKey]), { [item]: 1, [refusedKey]: 1 });

        await database.restart();
        const afterRestart = newKey();
        const r = await post(quoted(afterRestart), { item: afterRestart });
        assert.equal(r.status, 201, `the first request after a restart: ${r.status} ${r.body}\n${example.log()}`);
        assert.ok(example.alive(), `${file} died at the restart:\n${example.log()}`);

        const load = stream(example.port);
        await sleep(400);
        try {
          await database.stop();
          await sleep(1500);
        } finally {
          await load.stop();
          await database.start();
        }
        assert.ok(example.alive(), `${file} died when the database stopped:\n${example.log()}`);
        const unexpected = load.answers.filter(({ r, ms }) => r.status !== 201 && !(isUnavailableAnswer(r) && ms < 2000));
        assert.deepEqual(unexpected.map(({ r, ms }) => `${r.status} in ${ms} ms: ${r.body}`), [],
          'every answer is 201, or 503 problem+json with Retry-After within 2 s');
        const refused = load.answers.filter(({ r }) => r.status === 503).map(({ key }) => key);
        const done = load.answers.filter(({ r }) => r.status === 201).map(({ key }) => key);
        assert.ok(refused.length > 0 && done.length > 0, `201 before the stop, 503 after (${done.length}, ${refused.length})`);
        assert.deepEqual(await ordersOf(refused), {}, 'a key answered 503 has no order');
        assert.deepEqual(await ordersOf(done), Object.fromEntries(done.map((k) => [k, 1])), 'a key answered 201 has one');

        for (const key of refused) {
          const retry = await post(quoted(key), { item: key });
          assert.equal(retry.status, 201, `a key answered 503, once the database is back: ${retry.body}`);
          assert.equal(retry.headers['idempotent-replayed'], undefined);
        }
        assert.equal((await post(quoted(done[0]), { item: done[0] })).headers['idempotent-replayed'], 'true');
        assert.doesNotMatch(example.log(), /Unhandled|Uncaught|\n\s+at /, 'nothing unhandled, no stack trace');
      } finally {
        example.proc.kill('SIGKILL');
      }
    });
}
