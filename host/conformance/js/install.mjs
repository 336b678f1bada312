// Installs this package's dependencies (jco, preview2-shim) on first use: `npm ci` in host/conformance/js
// when host/conformance/js/node_modules does not hold what package-lock.json says. No dependencies itself.
//
// Concurrent first runs are safe: the install holds an exclusive lock (a directory made with
// mkdir, which only one process can create), and checks again once it holds it.

import { spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const HERE = dirname(fileURLToPath(import.meta.url));

/** How long to wait for another process's install, and when its lock counts as abandoned. */
const LOCK_WAIT_MS = 10 * 60 * 1000;
const LOCK_STALE_MS = 10 * 60 * 1000;

function readJson(path) {
  try {
    return JSON.parse(readFileSync(path, 'utf8'));
  } catch {
    return null;
  }
}

/**
 * Whether `installedLock` (npm's node_modules/.package-lock.json, what the last install put
 * there) matches `lock` (package-lock.json): every package installed is the one the lock names,
 * byte for byte in its entry, and every package the lock does not mark optional is installed
 * (optional ones are those of other platforms).
 */
export function lockMatches(lock, installedLock) {
  if (!lock?.packages || !installedLock?.packages) return false;
  if (lock.lockfileVersion !== installedLock.lockfileVersion) return false;
  const want = lock.packages;
  const have = installedLock.packages;
  for (const [path, entry] of Object.entries(have)) {
    if (path === '') continue;
    if (JSON.stringify(want[path]) !== JSON.stringify(entry)) return false;
  }
  for (const [path, entry] of Object.entries(want)) {
    if (path === '' || entry.optional) continue;
    if (!(path in have)) return false;
  }
  return true;
}

/** Whether host/conformance/js/node_modules holds what host/conformance/js/package-lock.json says. */
export function installed(dir = HERE) {
  return lockMatches(readJson(join(dir, 'package-lock.json')), readJson(join(dir, 'node_modules', '.package-lock.json')));
}

const sleep = (ms) => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);

/**
 * Holds the lock `path` (a directory) while `fn` runs. Waits while another process holds it;
 * takes over a lock older than `staleMs` (its holder died).
 */
export function withLock(path, fn, { waitMs = LOCK_WAIT_MS, staleMs = LOCK_STALE_MS, onWait } = {}) {
  const started = Date.now();
  let told = false;
  for (;;) {
    try {
      mkdirSync(path);
      break;
    } catch (e) {
      if (e.code !== 'EEXIST') throw new Error(`cannot create the lock ${path}: ${e.message}`);
    }
    let age = 0;
    try {
      age = Date.now() - statSync(path).mtimeMs;
    } catch {
      continue; // released meanwhile
    }
    if (age > staleMs) {
      rmSync(path, { recursive: true, force: true });
      continue;
    }
    if (Date.now() - started > waitMs) {
      throw new Error(`another install has held ${path} for ${Math.round(age / 1000)} s; remove it if no install runs`);
    }
    if (!told) onWait?.();
    told = true;
    sleep(200);
  }
  try {
    return fn();
  } finally {
    rmSync(path, { recursive: true, force: true });
  }
}

/** Runs `npm ci` in host/conformance/js when the dependencies are missing or stale; throws when it fails. */
export function ensureInstalled({ quiet = false, dir = HERE, npm = process.platform === 'win32' ? 'npm.cmd' : 'npm' } = {}) {
  if (installed(dir)) return false;
  const say = (text) => quiet || process.stderr.write(text);
  return withLock(
    join(dir, '.install.lock'),
    () => {
      // Another process may have installed while this one waited.
      if (installed(dir)) return false;
      say(`installing jco into ${join(dir, 'node_modules')} (npm ci)...\n`);
      const run = spawnSync(npm, ['ci', '--no-audit', '--no-fund', '--loglevel=error'], {
        cwd: dir,
        stdio: ['ignore', 2, 2], // npm's output goes to stderr: stdout is the report
      });
      const registry = process.env.npm_config_registry || 'https://registry.npmjs.org/ (or your npm config)';
      const byHand = `install by hand with \`npm ci\` in ${dir} (it needs the npm registry, ${registry})`;
      if (run.error) throw new Error(`npm ci could not run (${run.error.message}): ${byHand}`);
      if (run.status !== 0 || !installed(dir)) {
        throw new Error(`npm ci in ${dir} failed (exit ${run.status ?? run.signal}): ${byHand}`);
      }
      return true;
    },
    { onWait: () => say('waiting for another process installing jco...\n') },
  );
}
