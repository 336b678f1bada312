// conformance.mjs's per-call deadline (--call-timeout) against a policy that loops:
// $TETHER_HOSTILE_POLICY_WASM is Tether's hostile test policy (guest/test-policies/hostile, built by
// `cargo test`, which sets the variable), whose setting {"hostile":{"loop_on_event":N}} makes an
// instance loop forever on its Nth `handle`. Skipped without it, or when the dependencies are not
// installed (no npm in tests).

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';

import { HERE } from '../install.mjs';

const HOSTILE = process.env.TETHER_HOSTILE_POLICY_WASM;
const skip = !HOSTILE
  ? 'no hostile policy component (set TETHER_HOSTILE_POLICY_WASM)'
  : existsSync(join(HERE, 'node_modules', '@bytecodealliance', 'jco'))
    ? false
    : 'dependencies not installed (npm ci in host/conformance/js)';

const dir = mkdtempSync(join(tmpdir(), 'tether-host-js-timeout-'));
after(() => rmSync(dir, { recursive: true, force: true }));

test('a call that loops fails its scenario after --call-timeout, and the run goes on', { skip }, () => {
  const transcripts = join(dir, 'transcripts');
  const settings = '{"hostile":{"loop_on_event":2}}';
  const started = Date.now();
  const r = spawnSync(
    process.execPath,
    [
      join(HERE, 'conformance.mjs'), HOSTILE,
      '--settings', settings,
      '--call-timeout', '2',
      '--only', 'session-publishes-usable-tool-names',
      '--only', 'tools-are-withdrawn-exactly-once',
      '--only', 'configured-server-connects',
      '--transcripts', transcripts,
    ],
    { encoding: 'utf8', timeout: 120_000 },
  );
  assert.equal(r.signal, null, `killed: the run did not end\n${r.stdout}${r.stderr}`);
  assert.equal(r.status, 1, r.stdout + r.stderr);
  assert.match(r.stdout, /^FAIL session-publishes-usable-tool-names: at step 2 \(files\.v2 connected\): no answer within 2 s \(the policy may loop\)$/m);
  assert.match(r.stdout, /^FAIL tools-are-withdrawn-exactly-once: at step 2 \(alpha connected\): no answer within 2 s \(the policy may loop\)$/m);
  // A fresh worker (a fresh instance) for each scenario after a stopped one.
  assert.match(r.stdout, /^pass configured-server-connects$/m);
  assert.match(r.stdout, /^1 passed, 2 failed$/m);
  assert.ok(Date.now() - started >= 4000, 'each stopped call waited its 2 s');
  // The transcript so far: init and the one call that answered.
  const lines = readFileSync(join(transcripts, 'session-publishes-usable-tool-names.jsonl'), 'utf8').split('\n');
  assert.equal(lines.length, 3, lines.join('\n'));
  assert.equal(lines[0], `{"do":"init","settings":${JSON.stringify(settings)}}`);
  assert.match(lines[1], /^\{"do":"handle","event":\{"now":1000,"kind":\{"tag":"server-configured"/);
  assert.equal(lines[2], '');
});

test('--call-timeout must be a number of seconds above 0', () => {
  // The arguments are checked before the component is read: any path will do.
  for (const bad of ['0', '-1', 'soon', '1e3', '9999999']) {
    const r = spawnSync(process.execPath, [join(HERE, 'conformance.mjs'), 'no-such-policy.wasm', '--call-timeout', bad], { encoding: 'utf8' });
    assert.equal(r.status, 2, bad + ': ' + r.stderr);
    assert.match(r.stderr, /^conformance\.mjs: --call-timeout: .* is not a number of seconds above 0/m);
  }
});
