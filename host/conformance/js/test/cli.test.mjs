// conformance.mjs's arguments, checked before anything is installed or loaded (no component
// needed).

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';

import { HERE } from '../install.mjs';

const dir = mkdtempSync(join(tmpdir(), 'tether-host-js-cli-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const cli = (...args) => spawnSync(process.execPath, [join(HERE, 'conformance.mjs'), ...args], { encoding: 'utf8' });

test('a missing component is reported before any install, with exit 2', () => {
  const r = cli(join(dir, 'nowhere.wasm'));
  assert.equal(r.status, 2, r.stderr);
  assert.equal(r.stderr, `error: cannot read policy ${join(dir, 'nowhere.wasm')}: no such file\n`);
  assert.doesNotMatch(r.stderr, /npm|installing/);
});

test('--transcripts naming a file: a clear error, exit 2', () => {
  const component = join(dir, 'c.wasm');
  const file = join(dir, 'a-file');
  writeFileSync(component, 'x');
  writeFileSync(file, 'x');
  for (const target of [file, join(file, 'below')]) {
    const r = cli(component, '--transcripts', target);
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr, /^conformance\.mjs: --transcripts .*: cannot write transcripts there: it is not a directory$/m);
    assert.doesNotMatch(r.stderr, /\n\s+at /);
  }
});

test('a scenario file that is not JSON, or lacks its steps: exit 2, no stack', () => {
  const component = join(dir, 'c.wasm');
  writeFileSync(component, 'x');
  const scenarios = join(dir, 'scenarios');
  rmSync(scenarios, { recursive: true, force: true });
  spawnSync('mkdir', ['-p', scenarios]);
  writeFileSync(join(scenarios, 'index.json'), '["a"]');
  for (const [text, why] of [
    ['{"name": "a", "steps": [', /is not JSON/],
    ['{"name": "a"}', /a\.json has no steps/],
    ['null', /a\.json names the scenario undefined/],
  ]) {
    writeFileSync(join(scenarios, 'a.json'), text);
    const r = cli(component, '--scenarios', scenarios);
    assert.equal(r.status, 2, r.stderr);
    assert.match(r.stderr, why);
    assert.doesNotMatch(r.stderr, /\n\s+at /);
  }
});
