// The first-use install: what counts as installed, the lock that makes concurrent first runs
// safe, and how a failure reads (with a fake npm: no registry needed).

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';

import { HERE, ensureInstalled, lockMatches, withLock } from '../install.mjs';

const dir = mkdtempSync(join(tmpdir(), 'tether-host-js-install-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const LOCK = {
  name: 'x',
  lockfileVersion: 3,
  packages: {
    '': { name: 'x', dependencies: { a: '1.0.0' } },
    'node_modules/a': { version: '1.0.0', integrity: 'sha512-a' },
    'node_modules/a-darwin': { version: '1.0.0', optional: true },
  },
};
const installedLock = (packages) => ({ name: 'x', lockfileVersion: 3, packages });

test('installed means node_modules/.package-lock.json matches package-lock.json', () => {
  assert.equal(lockMatches(LOCK, installedLock({ 'node_modules/a': { version: '1.0.0', integrity: 'sha512-a' } })), true);
  assert.equal(lockMatches(LOCK, installedLock({ 'node_modules/a': { version: '0.9.0', integrity: 'sha512-a' } })), false, 'another version');
  assert.equal(lockMatches(LOCK, installedLock({})), false, 'a package missing');
  assert.equal(lockMatches(LOCK, installedLock({ 'node_modules/a': LOCK.packages['node_modules/a'], 'node_modules/b': {} })), false, 'a package the lock lacks');
  assert.equal(lockMatches(LOCK, null), false, 'never installed');
  assert.equal(lockMatches(LOCK, { ...installedLock({ 'node_modules/a': LOCK.packages['node_modules/a'] }), lockfileVersion: 2 }), false);
});

test('withLock: waits for a live lock, takes over a stale one', () => {
  const lock = join(dir, 'held.lock');
  mkdirSync(lock);
  assert.throws(() => withLock(lock, () => 1, { waitMs: 300, staleMs: 60000 }), /another install has held/);
  assert.ok(existsSync(lock), 'a live lock is left alone');
  const old = new Date(Date.now() - 120000);
  utimesSync(lock, old, old);
  assert.equal(withLock(lock, () => 7, { waitMs: 300, staleMs: 60000 }), 7);
  assert.equal(existsSync(lock), false, 'released');
  assert.throws(() => withLock(lock, () => { throw new Error('boom'); }), /boom/);
  assert.equal(existsSync(lock), false, 'released on failure too');
});

/** A package dir with a lock, and a fake npm that counts its runs and "installs" slowly. */
function fakePackage(name, { fails = false } = {}) {
  const pkg = join(dir, name);
  mkdirSync(pkg, { recursive: true });
  writeFileSync(join(pkg, 'package-lock.json'), JSON.stringify(LOCK));
  const npm = join(pkg, 'fake-npm.sh');
  writeFileSync(
    npm,
    `#!/bin/sh
echo "$@" >> runs.txt
sleep 0.5
${fails ? 'echo "npm error 404" >&2; exit 1' : ''}
mkdir -p node_modules
echo '${JSON.stringify(installedLock({ 'node_modules/a': LOCK.packages['node_modules/a'] }))}' > node_modules/.package-lock.json
`,
  );
  chmodSync(npm, 0o755);
  return { pkg, npm };
}

const runEnsure = (pkg, npm) =>
  new Promise((done) => {
    const code = `import { ensureInstalled } from ${JSON.stringify(join(HERE, 'install.mjs'))};
      try { console.log(ensureInstalled({ dir: ${JSON.stringify(pkg)}, npm: ${JSON.stringify(npm)} })); }
      catch (e) { console.log('error: ' + e.message); }`;
    const child = spawn(process.execPath, ['--input-type=module', '-e', code], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.on('close', () => done(out.trim()));
  });

test('concurrent first runs install once; the later ones wait and re-check', async () => {
  const { pkg, npm } = fakePackage('concurrent');
  const results = await Promise.all([runEnsure(pkg, npm), runEnsure(pkg, npm), runEnsure(pkg, npm)]);
  assert.deepEqual(results.sort(), ['false', 'false', 'true']);
  const runs = readFileSync(join(pkg, 'runs.txt'), 'utf8').trim().split('\n');
  assert.deepEqual(runs, ['ci --no-audit --no-fund --loglevel=error']);
  assert.equal(existsSync(join(pkg, '.install.lock')), false);
  assert.equal(ensureInstalled({ dir: pkg, npm: '/nonexistent' }), false, 'installed: npm is not run');
});

test('a failed install names the registry and how to install by hand', async () => {
  const { pkg, npm } = fakePackage('failing', { fails: true });
  const out = await runEnsure(pkg, npm);
  assert.match(out, /^error: npm ci in .*failing failed \(exit 1\): install by hand with `npm ci` in .*failing \(it needs the npm registry, /);
  assert.match(out, /registry/);
  assert.throws(() => ensureInstalled({ dir: pkg, npm: join(pkg, 'no-such-npm'), quiet: true }), /npm ci could not run .*install by hand/);
});
