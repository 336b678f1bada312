// Installs this package's dependencies (jco, preview2-shim) on first use: `npm ci` in host/js
// when host/js/node_modules lacks them. No dependencies itself.

import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const HERE = dirname(fileURLToPath(import.meta.url));

const REQUIRED = ['@bytecodealliance/jco/package.json', '@bytecodealliance/preview2-shim/package.json'];

/** Whether host/js/node_modules holds what the host imports. */
export function installed() {
  return REQUIRED.every((p) => existsSync(join(HERE, 'node_modules', p)));
}

/** Runs `npm ci` in host/js when the dependencies are missing; throws when it fails. */
export function ensureInstalled({ quiet = false } = {}) {
  if (installed()) return false;
  if (!quiet) process.stderr.write('installing jco into host/js/node_modules (npm ci)...\n');
  const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';
  const run = spawnSync(npm, ['ci', '--no-audit', '--no-fund', '--silent'], {
    cwd: HERE,
    stdio: ['ignore', 2, 2], // npm's output goes to stderr: stdout is the report
  });
  if (run.error) throw new Error(`npm ci could not run: ${run.error.message}`);
  if (run.status !== 0 || !installed()) {
    throw new Error(`npm ci in ${HERE} failed (exit ${run.status ?? run.signal})`);
  }
  return true;
}
