// Contract 0.2.1 in the interpreter: `since`, the steps `set-naming` and `name-prompts`, the
// `namings` of `take-over`, the predicates `publishes-advertised` and `names-prompts`, the
// invalid outputs of `name-prompts` and the transcript lines, against fake policies of 0.2.1
// and 0.2.0. (`naming-scenarios/` holds a copy of Tether's 0.2.1 scenario and a scenario of
// before, as an export of 0.2.1 writes them.)

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { holds, invalidPromptNames, runScenario } from '../scenario.mjs';
import { parse, stringify } from '../wit-json.mjs';

const SCENARIOS = join(fileURLToPath(new URL('.', import.meta.url)), 'naming-scenarios');

/** A small policy of contract 0.2.1: publishes `<prefix><tool>` (default `<server>__`), names prompts alike. */
class NamingPolicy {
  naming = true;
  label = 'fake.wasm';
  constructor(options = {}) {
    this.options = options;
  }
  init() {
    this.servers = new Map(); // server -> its tools
    this.states = new Map();
    this.namings = new Map();
  }
  name(server, original) {
    return `${this.namings.get(server) ?? `${server}__`}${original.replace(/ /g, '_')}`;
  }
  publish(server, tools) {
    const shown = tools.map((t) => ({ advertised: this.name(server, t.name), original: t.name, 'read-only': false }));
    return { tag: 'publish-tools', val: { server, tools: shown } };
  }
  setNaming({ server, prefix }) {
    if (prefix === null) this.namings.delete(server);
    else this.namings.set(server, prefix);
  }
  namePrompts(server, originals) {
    if (this.options.answer) return this.options.answer;
    return [...new Set(originals)].map((original) => ({ advertised: this.name(server, original), original }));
  }
  handle({ kind: { tag, val } }) {
    switch (tag) {
      case 'server-configured':
        this.servers.set(val.name, []);
        this.states.set(val.name, 'connecting');
        return [{ tag: 'connect', val: val.name }];
      case 'connected':
      case 'tools-changed':
        this.servers.set(val.server, val.tools);
        this.states.set(val.server, 'connected');
        return [this.publish(val.server, val.tools)];
      case 'server-removed':
        this.namings.delete(val);
        return [{ tag: 'disconnect', val }];
      default:
        return [];
    }
  }
  admit() {
    return { tag: 'allow' };
  }
  status() {
    return [...this.states].map(([server, state]) => ({
      server,
      state,
      breaker: 'closed',
      failures: 0,
      'breaker-failures': 0,
      'tool-errors': 0,
      'last-fault': null,
      since: 0n,
      'published-tools': 0,
      'next-attempt-at': null,
      'breaker-until': null,
    }));
  }
  snapshot() {
    const state = { servers: [...this.servers], states: [...this.states], namings: [...this.namings] };
    return new TextEncoder().encode(stringify(state));
  }
  restore(bytes) {
    const { servers, states, namings } = parse(new TextDecoder().decode(bytes));
    this.servers = new Map(servers);
    this.states = new Map(states);
    this.namings = new Map(namings);
  }
  takeOver(handover) {
    for (const s of handover.servers) this.states.set(s.config.name, s.state);
    return handover.servers.filter((s) => s.session).map((s) => this.publish(s.config.name, s.session.tools));
  }
}

/** The same policy as of contract 0.2.0: no set-naming, no name-prompts. */
class PreviousMinor extends NamingPolicy {
  naming = false;
}

const run = (steps, { policy = NamingPolicy, options, since = null } = {}) =>
  runScenario({ name: 't', level: 'contract', since, steps }, { newInstance: async () => new policy(options) });

const configure = (name) => ({ do: 'event', kind: { tag: 'server-configured', val: { name, transport: 'stdio', include: [], exclude: [], settings: '' } } });
const connected = (server, tools) => ({
  do: 'event',
  kind: { tag: 'connected', val: { server, 'server-info': 'fake 1', tools: tools.map((name) => ({ name, 'read-only': false, revision: 1 })) } },
});
const expect = (that, message = 'nope') => ({ do: 'expect', that, else: message });
const naming = (server, prefix) => ({ do: 'set-naming', naming: { server, prefix } });
const prompts = (server, ...originals) => ({ do: 'name-prompts', server, originals });
const advertised = (server, ...names) => ({ 'publishes-advertised': { server, names } });
const handover = {
  now: 1000,
  previous: { name: 'p', version: '1' },
  servers: [
    {
      config: { name: 'a', transport: 'stdio', include: [], exclude: [], settings: '' },
      session: { 'server-info': 't', tools: [{ name: 'w', 'read-only': false, revision: 1 }], proven: true },
      connecting: false,
      state: 'healthy',
      breaker: 'closed',
      'breaker-until': null,
      failures: 0,
      'breaker-failures': 0,
      'tool-errors': 0,
      'last-fault': null,
      since: 3,
      'next-attempt-at': null,
    },
  ],
};

async function passes(steps, options) {
  const result = await run(steps, options);
  assert.equal(result.failure, null, result.transcript.join('\n'));
  return result;
}

describe('steps of contract 0.2.1', () => {
  test('set-naming and its transcript line', async () => {
    const { transcript } = await passes([
      naming('a', ''),
      configure('a'),
      connected('a', ['read file']),
      expect(advertised('a', ['read file', 'read_file'])),
      naming('b', null),
      configure('b'),
      connected('b', ['w']),
      expect(advertised('b', ['w', 'b__w'])),
    ]);
    assert.equal(transcript[1], '{"do":"set-naming","naming":{"server":"a","prefix":""}}');
    assert.equal(transcript[4], '{"do":"set-naming","naming":{"server":"b","prefix":null}}');
  });

  test('name-prompts, its line and names-prompts', async () => {
    const { transcript } = await passes([
      naming('a', 'x-'),
      prompts('a', 'ask', 'tell'),
      expect({ 'names-prompts': [['tell', 'x-tell'], ['ask', 'x-ask']] }),
      expect({ not: { 'names-prompts': [['ask', 'x-ask']] } }, 'exactly these'),
      prompts('b'),
      expect({ 'names-prompts': [] }),
    ]);
    assert.equal(
      transcript[2],
      '{"do":"name-prompts","server":"a","originals":["ask","tell"],"named":[{"advertised":"x-ask","original":"ask"},{"advertised":"x-tell","original":"tell"}]}',
    );
    const failed = await run([naming('a', 'x-'), prompts('a', 'ask'), expect({ 'names-prompts': [['ask', 'ask']] }, 'own names')]);
    assert.equal(failed.failure, 'at step 2 (name the prompts of a): own names; the prompt names were [{"advertised":"x-ask","original":"ask"}]');
    // As in Tether's interpreter, nothing named yet is the empty list.
    assert.equal((await run([expect({ 'names-prompts': [] })])).failure, null);
  });

  test('publishes-advertised', async () => {
    await passes([
      naming('a', 'x-'),
      configure('a'),
      connected('a', ['r', 'w']),
      expect(advertised('a', ['w', 'x-w'], ['r', 'x-r'])),
      expect({ not: advertised('a', ['r', 'x-r']) }, 'all pairs'),
      expect({ not: advertised('a', ['r', 'a__r'], ['w', 'a__w']) }, 'these names'),
      expect({ not: advertised('b', ['r', 'x-r']) }, 'no publication: does not hold'),
    ]);
    const failed = await run([configure('a'), connected('a', ['r']), expect(advertised('a', ['r', 'r']), 'own')]);
    assert.match(failed.failure, /^at step 2 \(a connected\): own; the actions were \[\{/);
  });

  test('take-over gives its namings first; a 0.2.0 policy none', async () => {
    const steps = [{ do: 'take-over', handover, namings: [{ server: 'a', prefix: '' }] }, expect(advertised('a', ['w', 'w']))];
    const does = (r) => r.transcript.map((l) => JSON.parse(l).do);
    assert.deepEqual(does(await passes(steps)), ['init', 'init', 'set-naming', 'take-over']);
    steps[1] = expect(advertised('a', ['w', 'a__w']));
    assert.deepEqual(does(await passes(steps, { policy: PreviousMinor })), ['init', 'init', 'take-over']);
    // Exports before 0.2.1 have no `namings`; null is none.
    for (const step of [{ do: 'take-over', handover }, { do: 'take-over', handover, namings: null }]) {
      await passes([step, expect(advertised('a', ['w', 'a__w']))]);
    }
  });

  test('the step counts and names the calls; a take-over is one', async () => {
    let r = await run([naming('a', ''), prompts('a', 'p'), expect({ connects: 'a' }, 'none')]);
    assert.match(r.failure, /^at step 2 \(name the prompts of a\): none;/);
    r = await run([naming('a', ''), expect({ connects: 'a' }, 'none')]);
    assert.match(r.failure, /^at step 1 \(set the naming of a\): none;/);
    r = await run([{ do: 'take-over', handover, namings: [{ server: 'a', prefix: '' }] }, expect({ connects: 'a' }, 'none')]);
    assert.match(r.failure, /^at step 1 \(take over from p\): none;/);
  });

  test('a policy of 0.2.0 has neither', async () => {
    let r = await run([naming('a', '')], { policy: PreviousMinor });
    assert.equal(r.failure, 'at step 1 (set the naming of a): the policy has no set-naming (contract 0.2.0)');
    r = await run([prompts('a', 'p')], { policy: PreviousMinor });
    assert.equal(r.failure, 'at step 1 (name the prompts of a): the policy has no name-prompts (contract 0.2.0)');
  });

  test('malformed steps and predicates', async () => {
    const malformed = async (steps, pattern) => {
      const r = await run(steps);
      assert.ok(r.malformed, `${stringify(steps)}: ${r.failure}`);
      assert.match(r.malformed, pattern);
    };
    await malformed([{ do: 'set-naming', naming: { server: 'a' } }], /malformed naming .*lacks the field "prefix"/);
    await malformed([{ do: 'set-naming', naming: { server: 'a', prefix: '', x: 1 } }], /no field "x"/);
    await malformed([naming('a', 5)], /expected option<string>|expected string/);
    await malformed([{ do: 'set-naming' }], /"naming" must be a naming/);
    await malformed([{ do: 'name-prompts', server: 'a', originals: [1] }], /malformed originals/);
    await malformed([{ do: 'take-over', handover, namings: [{ server: 1, prefix: null }] }], /malformed naming/);
    await malformed([{ do: 'take-over', handover, namings: { server: 'a', prefix: null } }], /"namings" must be a list/);
    await malformed([expect({ 'publishes-advertised': { server: 'a', names: [['a']] } })], /"names" must be a list of \[original, advertised\] pairs/);
    await malformed([expect({ 'names-prompts': [['a', 1]] })], /expected a list of \[original, advertised\] pairs/);
    const r = await runScenario({ name: 't', level: 'contract', since: 21, steps: [] }, { newInstance: async () => new NamingPolicy() });
    assert.match(r.malformed, /"since" must be a contract version or null/);
  });
});

describe('since', () => {
  test('what a component predates passes without running, and has no transcript', async () => {
    const steps = [naming('a', ''), prompts('a', 'p')];
    let r = await run(steps, { policy: PreviousMinor, since: '0.2.1' });
    assert.deepEqual([r.failure, r.applicable, r.transcript], [null, false, []]);
    r = await run(steps, { since: '0.2.1' });
    assert.deepEqual([r.failure, r.applicable, r.transcript.length], [null, undefined, 3]);
    // A version this host does not know is not implemented (as Tether's host decides).
    r = await run(steps, { since: '0.2.7' });
    assert.deepEqual([r.failure, r.applicable, r.transcript], [null, false, []]);
    // No `since`: every component runs it, and a 0.2.0 one fails where it lacks a function.
    assert.notEqual((await run(steps, { policy: PreviousMinor })).failure, null);
  });

  test('the exported scenarios of 0.2.1', async () => {
    const read = (name) => parse(readFileSync(join(SCENARIOS, `${name}.json`), 'utf8'));
    const scenarios = parse(readFileSync(join(SCENARIOS, 'index.json'), 'utf8')).map(read);
    assert.deepEqual(
      scenarios.map((s) => [s.name, s.since]),
      [
        ['takes-over-another-policy-keeping-sessions', null],
        ['names-follow-the-operators-naming', '0.2.1'],
      ],
    );
    for (const [policy, applicable] of [
      [NamingPolicy, [undefined, undefined]],
      [PreviousMinor, [undefined, false]],
    ]) {
      const results = [];
      for (const s of scenarios) results.push(await runScenario(s, { newInstance: async () => new policy() }));
      assert.deepEqual(
        results.map((r) => [r.failure, r.applicable]),
        applicable.map((a) => [null, a]),
        results.map((r) => r.transcript.join('\n')).join('\n\n'),
      );
    }
    const { transcript } = await runScenario(scenarios[1], { newInstance: async () => new NamingPolicy() });
    assert.deepEqual(transcript.slice(-3).map((l) => JSON.parse(l).do), ['init', 'set-naming', 'take-over']);
  });
});

describe('invalid prompt names (outputs.rs check_prompt_names)', () => {
  const named = (advertised, original) => ({ advertised, original });
  const cases = [
    [[named('a b', 'a')], 'named a prompt with an unusable name "a b"'],
    [[named('', 'a')], 'named a prompt with an unusable name ""'],
    [[named('x'.repeat(65), 'a')], `named a prompt with an unusable name "${'x'.repeat(65)}"`],
    [[named('c', 'c')], 'named a prompt it was not asked about: "c"'],
    [[named('a', 'a'), named('a2', 'a')], 'named prompt "a" twice'],
    [[named('p', 'a'), named('p', 'b')], 'gave two prompts the name p'],
  ];
  for (const [answer, why] of cases) {
    test(why, async () => {
      const r = await run([prompts('s', 'a', 'b')], { options: { answer } });
      assert.equal(r.failure, `at step 1 (name the prompts of s): policy fake.wasm failed during name-prompts: returned invalid output: ${why}`);
      assert.deepEqual(r.transcript, ['{"do":"init","settings":"{}"}'], 'the call writes no line');
    });
  }
  test('what may be answered', () => {
    assert.equal(invalidPromptNames(['a', 'b'], []), null); // a prompt left out is not shown
    assert.equal(invalidPromptNames(['a', 'a'], [named('x', 'a')]), null);
  });
  test('the predicates read the state', () => {
    const state = { actions: [], promptNames: [named('x-a', 'a')] };
    assert.equal(holds({ 'names-prompts': [['a', 'x-a']] }, state), true);
    assert.equal(holds({ 'names-prompts': [['a', 'x-a'], ['b', 'x-b']] }, state), false);
    assert.equal(holds({ 'names-prompts': [['a', 'x-a']] }, { actions: [] }), false);
  });
});
