// README.md as written: its install command in a fresh npm project (next to a "clone" of the
// repository: a link to this tree), then its Express and Fastify examples, copied as they are, run
// against the real database and checked over real HTTP.
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { DATABASE_URL, newKey, newPool, quoted, request, sleep, takePort } from './harness.js';

const here = fileURLToPath(new URL('..', import.meta.url));
const readme = readFileSync(here + 'README.md', 'utf8');
const devVersions = JSON.parse(readFileSync(here + 'package.json', 'utf8')).devDependencies;
const work = process.env.SUITE_DIR && `${process.env.SUITE_DIR}/readme`;
const skip = work ? false : 'SUITE_DIR is not set (test.sh sets it)';

/** The fenced blocks of one language, in order. */
const blocks = (lang) => [...readme.matchAll(new RegExp('```' + lang + '\\n([\\s\\S]*?)```', 'g'))].map((m) => m[1]);
const installBlock = () => blocks('sh').find((b) => b.includes('--install-links'));
const example = (file) => blocks('js').find((b) => b.startsWith(`// ${file}\n`));

const pool = newPool();
after(() => pool.end());
const app = `${work}/my-app`;
const sh = (cmd, cwd) => execFileSync('bash', ['-euo', 'pipefail', '-c', cmd], { cwd, stdio: ['ignore', 'pipe', 'inherit'], encoding: 'utf8' });

before(() => {
  if (!work) return;
  rmSync(work, { recursive: true, force: true });
  mkdirSync(app, { recursive: true });
  symlinkSync(fileURLToPath(new URL('../../..', import.meta.url)), `${work}/idempotency`);
  sh('npm init -y >/dev/null', app);
});

test('the README\'s install command installs the package with its dependencies in a fresh npm project', { skip }, () => {
  const block = installBlock();
  assert.ok(block, 'README.md has a ```sh block with npm install --install-links');
  sh(`${block.trim()} --no-audit --no-fund --loglevel=error`, app);
  const out = sh(`node --input-type=module -e "import('pg-idempotency').then((m) => console.log(typeof m.createIdempotency))"`, app);
  assert.equal(out.trim(), 'function');
  // The frameworks the examples use, at the versions this package is tested with.
  sh(`npm install --no-audit --no-fund --loglevel=error express@${devVersions.express} fastify@${devVersions.fastify}`, app);
});

for (const file of ['express-app.mjs', 'fastify-app.mjs']) {
  test(`the README's ${file}, copied as it is: 201, a replay byte for byte, 400 without a key, one row`, { skip }, async () => {
    const code = example(file);
    assert.ok(code, `README.md has a \`\`\`js block starting with // ${file}`);
    writeFileSync(`${app}/${file}`, code);
    const port = takePort();
    const proc = spawn(process.execPath, [file], {
      cwd: app, env: { ...process.env, DATABASE_URL, PORT: String(port) }, stdio: ['ignore', 'inherit', 'pipe'],
    });
    let log = '';
    proc.stderr.on('data', (d) => (log += d));
    try {
      const item = 'item-' + newKey();
      const post = (key, body = { item }) => request(port, 'POST', '/orders',
        { headers: key === undefined ? {} : { 'Idempotency-Key': key }, body });
      let first;
      for (let i = 0; i < 200 && !first; i++) {
        first = await post(quoted(item)).catch(() => null);
        if (!first) await sleep(50);
        assert.equal(proc.exitCode, null, `${file} exited:\n${log}`);
      }
      assert.equal(first.status, 201, first.body);
      const order = JSON.parse(first.body);
      assert.equal(order.item, item);
      assert.equal(first.headers.location, `/orders/${order.id}`);
      const again = await post(item); // the same key, bare this time
      assert.equal(again.headers['idempotent-replayed'], 'true');
      assert.equal(again.body, first.body);
      const missing = await post(undefined);
      assert.equal(missing.status, 400);
      assert.equal(missing.headers['content-type'], 'application/problem+json');
      const { rows } = await pool.query('SELECT count(*)::int AS n FROM orders WHERE item = $1', [item]);
      assert.equal(rows[0].n, 1);
    } finally {
      proc.kill('SIGKILL');
    }
  });
}
