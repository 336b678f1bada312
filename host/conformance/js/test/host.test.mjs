// The host against a real policy component, $TETHER_POLICY_WASM (skipped when it is unset), one
// of contract 0.2.0, $TETHER_PREVIOUS_MINOR_POLICY_WASM (Tether's guest/test-policies/previous-minor;
// skipped when unset), and the import check.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';

import { HERE } from '../install.mjs';
import { importsOfWit, offered } from '../policy-host.mjs';
import { parse, stringify } from '../wit-json.mjs';

const COMPONENT = process.env.TETHER_POLICY_WASM || null;
const skip = COMPONENT ? false : 'no policy component: set TETHER_POLICY_WASM';
if (COMPONENT && !existsSync(COMPONENT)) throw new Error(`TETHER_POLICY_WASM=${COMPONENT}: no such file`);
const PREVIOUS_MINOR = process.env.TETHER_PREVIOUS_MINOR_POLICY_WASM || null;
if (PREVIOUS_MINOR && !existsSync(PREVIOUS_MINOR)) throw new Error(`TETHER_PREVIOUS_MINOR_POLICY_WASM=${PREVIOUS_MINOR}: no such file`);
const NAMING_SCENARIOS = join(HERE, 'test', 'naming-scenarios');
const cli = (...args) => spawnSync(process.execPath, [join(HERE, 'conformance.mjs'), ...args], { encoding: 'utf8' });

test('the sandbox offers WASI 0.2 and the contract, nothing else', () => {
  for (const name of ['wasi:cli/environment@0.2.6', 'wasi:sockets/tcp@0.2.0', 'tether:policy/log@0.2.0', 'tether:policy/types@0.2.3']) {
    assert.equal(offered(name), true, name);
  }
  for (const name of ['wasi:http/types@0.2.3', 'wasi:cli/environment@0.3.0', 'wasi:cli/environment', 'acme:x/y@0.2.0', 'wasi:keyvalue/store@0.2.0']) {
    assert.equal(offered(name), false, name);
  }
});

test('imports are read from the world jco prints, not from inline interfaces', () => {
  const wit = `package root:component;

world root {
  import tether:policy/log@0.2.0;
  import wasi:http/types@0.2.10;
  import %custom: interface {
    import-thing: func();
  }
  import now: func() -> u64;

  export tether:policy/policy@0.2.0;
}
`;
  assert.deepEqual(importsOfWit(wit), ['tether:policy/log@0.2.0', 'wasi:http/types@0.2.10', 'custom', 'now']);
});

describe('a real component', { skip }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'tether-host-js-test-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  test('PolicyHost drives it with the JSON encoding', async () => {
    const { PolicyHost, PolicyError } = await import('../policy-host.mjs');
    const policy = await PolicyHost.load(COMPONENT, { log: 'off' });
    assert.equal(typeof policy.info().name, 'string');
    assert.throws(() => policy.init('{"no-such-setting":1}'), (e) => e instanceof PolicyError && e.kind === 'refused');
    policy.init('{}');
    const configure = '{"now":1000,"kind":{"tag":"server-configured","val":{"name":"alpha","transport":"stdio","include":[],"exclude":[],"settings":""}}}';
    const actions = policy.handle(configure);
    assert.ok(actions.some((a) => a.tag === 'connect' && a.val === 'alpha'), stringify(actions));
    const published = policy.handle({
      now: 1001,
      kind: { tag: 'connected', val: { server: 'alpha', 'server-info': 'test', tools: [{ name: 'echo', 'read-only': true, revision: 18446744073709551615n }] } },
    });
    assert.ok(published.some((a) => a.tag === 'publish-tools'), stringify(published));
    assert.deepEqual(policy.admit({ now: 1002, 'call-id': 1, server: 'alpha', tool: 'echo' }), { tag: 'allow' });
    const status = policy.status(1003);
    assert.equal(status[0].server, 'alpha');
    assert.equal(typeof status[0].since, 'bigint');
    const snapshot = policy.snapshot();
    assert.ok(snapshot instanceof Uint8Array);
    const twin = await policy.fresh();
    twin.init('{}');
    twin.restore(Buffer.from(snapshot).toString('base64'));
    assert.equal(stringify(twin.status(1003)), stringify(status));
    assert.throws(() => twin.restore(new Uint8Array([1, 2, 3])), (e) => e instanceof PolicyError);
    assert.throws(() => policy.handle({ now: 1, kind: { tag: 'nope' } }), TypeError);
  });

  test('the operator\'s naming, whichever contract it speaks', async () => {
    const { PolicyHost, PolicyError } = await import('../policy-host.mjs');
    const policy = await PolicyHost.load(COMPONENT, { log: 'off' });
    policy.init('{}');
    if (!policy.naming) {
      assert.equal(policy.contract, '0.2.0');
      assert.throws(() => policy.setNaming({ server: 'alpha', prefix: '' }), (e) => e instanceof PolicyError && e.kind === 'unsupported');
      return;
    }
    assert.equal(policy.contract, '0.2.1');
    policy.setNaming({ server: 'alpha', prefix: '' });
    policy.setNaming('{"server": "beta", "prefix": null}');
    policy.handle({ now: 1000, kind: { tag: 'server-configured', val: { name: 'alpha', transport: 'stdio', include: [], exclude: [], settings: '' } } });
    const actions = policy.handle({
      now: 1001,
      kind: { tag: 'connected', val: { server: 'alpha', 'server-info': 'test', tools: [{ name: 'echo', 'read-only': true, revision: 1 }] } },
    });
    const published = actions.filter((a) => a.tag === 'publish-tools').map((a) => a.val.tools);
    assert.deepEqual(published, [[{ advertised: 'echo', original: 'echo', 'read-only': true }]]);
    const before = policy.snapshot();
    assert.deepEqual(policy.namePrompts('alpha', ['ask']), [{ advertised: 'ask', original: 'ask' }]);
    assert.deepEqual(policy.snapshot(), before, 'name-prompts changes nothing');
    const twin = await policy.fresh();
    twin.init('{}');
    twin.restore(before);
    assert.deepEqual(twin.namePrompts('alpha', ['ask']), [{ advertised: 'ask', original: 'ask' }]);
  });

  test('conformance.mjs: a scenario of 0.2.1 runs, or is not applicable and writes no transcript', async () => {
    const { PolicyHost } = await import('../policy-host.mjs');
    const naming = (await PolicyHost.load(COMPONENT, { log: 'off' })).naming;
    const transcripts = join(dir, 'naming-transcripts');
    const r = cli(COMPONENT, '--scenarios', NAMING_SCENARIOS, '--transcripts', transcripts);
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.match(r.stdout, naming ? /^pass names-follow-the-operators-naming$/m : /^n\/a  names-follow-the-operators-naming \(needs contract 0\.2\.1/m);
    assert.match(r.stdout, /^2 passed, 0 failed$/m);
    const written = ['takes-over-another-policy-keeping-sessions.jsonl'];
    if (naming) written.unshift('names-follow-the-operators-naming.jsonl');
    assert.deepEqual(readdirSync(transcripts).sort(), written);
  });

  const scenarios = join(dir, 'scenarios');
  const writeScenarios = () => {
    const configure = { do: 'event', kind: { tag: 'server-configured', val: { name: 'alpha', transport: 'stdio', include: [], exclude: [], settings: '' } } };
    const all = [
      { name: 'connects', level: 'invariant', summary: 's', steps: [configure, { do: 'expect', that: { connects: 'alpha' }, else: 'no connect' }] },
      { name: 'impossible', level: 'contract', summary: 's', steps: [configure, { do: 'expect', that: { disconnects: 'alpha' }, else: 'it did not disconnect' }] },
    ];
    rmSync(scenarios, { recursive: true, force: true });
    mkdirSync(scenarios, { recursive: true });
    for (const s of all) writeFileSync(join(scenarios, `${s.name}.json`), JSON.stringify(s, null, 2));
    writeFileSync(join(scenarios, 'index.json'), JSON.stringify(all.map((s) => s.name)));
  };

  test('conformance.mjs: 0 when all pass, 1 when one fails, transcripts written', () => {
    writeScenarios();
    const transcripts = join(dir, 'transcripts');
    const ok = cli(COMPONENT, '--scenarios', scenarios, '--only', 'connects', '--transcripts', transcripts);
    assert.equal(ok.status, 0, ok.stdout + ok.stderr);
    assert.match(ok.stdout, /^pass connects$/m);
    assert.match(ok.stdout, /^1 passed, 0 failed$/m);
    const lines = readFileSync(join(transcripts, 'connects.jsonl'), 'utf8').split('\n');
    assert.equal(lines[0], '{"do":"init","settings":"{}"}');
    assert.equal(lines.at(-1), '');
    assert.equal(parse(lines[1]).do, 'handle');
    const bad = cli(COMPONENT, '--scenarios', scenarios);
    assert.equal(bad.status, 1, bad.stdout + bad.stderr);
    assert.match(bad.stdout, /^FAIL impossible: at step 1 \(configure alpha\): it did not disconnect; the actions were \[/m);
    assert.match(bad.stdout, /^1 passed, 1 failed$/m);
  });

  test('conformance.mjs: 2 when the component cannot be used', () => {
    writeScenarios();
    const notWasm = join(dir, 'not.wasm');
    writeFileSync(notWasm, 'hello');
    const r = cli(notWasm, '--scenarios', scenarios);
    assert.equal(r.status, 2, r.stdout + r.stderr);
    assert.match(r.stderr, /^error: .*not\.wasm/m);
    const refused = cli(COMPONENT, '--scenarios', scenarios, '--settings', '{"no-such-setting":1}');
    assert.equal(refused.status, 2, refused.stdout + refused.stderr);
    assert.match(refused.stderr, /refused the settings \{"no-such-setting":1\}/);
    assert.equal(cli('--bogus').status, 2);
  });

  test('conformance.mjs: 2, without a stack, when a scenario file is malformed', () => {
    const bad = join(dir, 'malformed');
    mkdirSync(bad, { recursive: true });
    writeFileSync(join(bad, 'index.json'), '["odd"]');
    writeFileSync(join(bad, 'odd.json'), JSON.stringify({ name: 'odd', level: 'contract', summary: 's', steps: [{ do: 'event', kind: { tag: 'nope' } }] }));
    const r = cli(COMPONENT, '--scenarios', bad);
    assert.equal(r.status, 2, r.stdout + r.stderr);
    assert.match(r.stderr, /^error: the scenario file .*odd\.json is malformed: at step 0 \(start\): malformed event .*no case "nope"/m);
    assert.doesNotMatch(r.stderr, /\n\s+at /);
  });
});

describe('a component of contract 0.2.0', { skip: PREVIOUS_MINOR ? false : 'set TETHER_PREVIOUS_MINOR_POLICY_WASM' }, () => {
  test('is told by what it exports: no set-naming, no name-prompts; the 0.2.1 scenario is not applicable', async () => {
    const { PolicyHost, PolicyError } = await import('../policy-host.mjs');
    const policy = await PolicyHost.load(PREVIOUS_MINOR, { log: 'off' });
    assert.equal(policy.naming, false);
    assert.equal(policy.contract, '0.2.0');
    policy.init('{}');
    for (const call of [() => policy.setNaming({ server: 'a', prefix: '' }), () => policy.namePrompts('a', ['p'])]) {
      assert.throws(call, (e) => e instanceof PolicyError && e.kind === 'unsupported' && /\(contract 0\.2\.0\)/.test(e.message));
    }
    const r = cli(PREVIOUS_MINOR, '--scenarios', NAMING_SCENARIOS, '--only', 'names-follow-the-operators-naming');
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.match(r.stdout, /contract 0\.2\.0\)$/m);
    assert.match(r.stdout, /^n\/a  names-follow-the-operators-naming /m);
  });
});
