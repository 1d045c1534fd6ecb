// The package as published: `npm pack` (test.sh sets PACK_FILE: scripts/build-artifacts.sh node) and
// the hand-written types.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));

test('index.d.ts type-checks against an application using it (tsc --noEmit)', () => {
  execFileSync(root + 'node_modules/.bin/tsc', ['--noEmit', '-p', root + 'test/types'], { stdio: 'inherit' });
});

test('npm pack: the tarball holds the code, the types, the README and its example apps, not the tests or demos',
  { skip: process.env.PACK_FILE ? false : 'PACK_FILE is not set (test.sh runs npm pack)' }, () => {
    const files = execFileSync('tar', ['-tzf', process.env.PACK_FILE], { encoding: 'utf8' }).trim().split('\n');
    for (const f of ['package/package.json', 'package/index.d.ts', 'package/README.md', 'package/src/index.js',
      'package/src/middleware.js', 'package/src/client.js', 'package/src/connection.js', 'package/examples/express-app.mjs',
      'package/examples/fastify-app.mjs']) {
      assert.ok(files.includes(f), `${f} missing from ${files.join(' ')}`);
    }
    assert.ok(!files.some((f) => f.startsWith('package/test/') || f.startsWith('package/demo/')), files.join(' '));
  });
