// The scenario interpreter and its predicates, against a policy written here in JavaScript
// (speaking the JSON encoding, as a PolicyHost does): every step kind, every predicate, the
// transcript lines, and how failures read.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { holds, runScenario } from '../scenario.mjs';
import { parse, stringify } from '../wit-json.mjs';

const TOKEN_BASE = 2n ** 63n; // tokens beyond 2^53: must stay exact

/** A small policy: connects on configure, backs off on failure (parks after 3), publishes. */
class FakePolicy {
  constructor(options = {}) {
    this.options = options;
  }
  init(settings) {
    const s = JSON.parse(settings);
    if (s.refuse) throw new Error('unknown setting `refuse`');
    this.servers = new Map();
    this.tokens = 0n;
  }
  #wake(server, at) {
    this.tokens++;
    const token = TOKEN_BASE + this.tokens + (this.options.nondeterministic ? BigInt(FakePolicy.global++) : 0n);
    return { tag: 'wake-at', val: { server, at, token } };
  }
  #publish(name, tools) {
    return {
      tag: 'publish-tools',
      val: { server: name, tools: tools.map((t) => ({ advertised: `${name}__${t.name}`, original: t.name, 'read-only': t['read-only'] })) },
    };
  }
  handle({ now, kind }) {
    const v = kind.val;
    if (this.options.trapOn === kind.tag) throw new Error('RuntimeError: unreachable');
    if (this.options.answers?.[kind.tag]) return this.options.answers[kind.tag](v, now);
    const server = (name) => this.servers.get(name);
    switch (kind.tag) {
      case 'server-configured':
        this.servers.set(v.name, { state: 'connecting', failures: 0, since: now, tools: [], session: false });
        return [{ tag: 'state-changed', val: { server: v.name, state: 'connecting', detail: 'configured' } }, { tag: 'connect', val: v.name }];
      case 'connect-failed': {
        const s = server(v.server);
        s.failures++;
        s.state = s.failures >= 3 ? 'parked' : 'backing-off';
        s.since = now;
        return [this.#wake(v.server, now + 100n * BigInt(s.failures))];
      }
      case 'timer':
        server(v.server).state = 'connecting';
        return [{ tag: 'connect', val: v.server }];
      case 'connected': {
        const s = server(v.server);
        Object.assign(s, { state: 'connected', session: true, tools: v.tools, since: now });
        if (this.options.publishGhost) return [this.#publish(v.server, [...v.tools, { name: 'ghost', 'read-only': false }])];
        if (this.options.manyActions) return Array.from({ length: 10001 }, () => ({ tag: 'connect', val: v.server }));
        return [this.#publish(v.server, v.tools)];
      }
      case 'disconnected': {
        const s = server(v.server);
        s.session = false;
        s.state = 'backing-off';
        return [{ tag: 'withdraw-tools', val: v.server }, this.#wake(v.server, now + 50n)];
      }
      case 'server-removed':
        this.servers.delete(v);
        return [{ tag: 'withdraw-tools', val: v }, { tag: 'disconnect', val: v }];
      case 'shutdown':
        return [...this.servers.keys()].map((name) => ({ tag: 'withdraw-tools', val: name }));
      default:
        return [];
    }
  }
  admit(request) {
    if (this.options.admit) return this.options.admit(request);
    const s = this.servers.get(request.server);
    if (!s) return { tag: 'reject', val: `unknown server ${request.server}` };
    if (!s.session) return { tag: 'hold', val: { 'wait-ms': 500n, message: `${request.server} is reconnecting` } };
    if (request.tool === 'probe-me') return { tag: 'probe' };
    if (request.tool === 'reconnect-me') return { tag: 'reconnect', val: `${request.server} must reconnect` };
    return { tag: 'allow' };
  }
  status() {
    const all = [...this.servers.entries()];
    if (this.options.reorder && this.restored) all.reverse();
    return all.map(([name, s]) => ({
      server: name,
      state: s.state,
      breaker: 'closed',
      failures: s.failures,
      'breaker-failures': 0,
      'tool-errors': 0,
      'last-fault': null,
      since: s.since,
      'published-tools': s.session ? s.tools.length : 0,
      'next-attempt-at': null,
      'breaker-until': null,
    }));
  }
  snapshot() {
    const state = [...this.servers.entries()].map(([n, s]) => [n, { ...s, failures: this.options.lossy ? 0 : s.failures }]);
    return new TextEncoder().encode(stringify({ state, tokens: this.tokens }));
  }
  restore(bytes) {
    const { state, tokens } = parse(new TextDecoder().decode(bytes));
    this.servers = new Map(state.map(([n, s]) => [n, { ...s, since: BigInt(s.since) }]));
    this.tokens = BigInt(tokens);
    this.restored = true;
  }
  takeOver(handover) {
    if (this.options.takeOver) return this.options.takeOver(handover);
    if (handover.servers.length === 0) throw new Error('nothing to take over');
    const actions = [];
    for (const sh of handover.servers) {
      this.servers.set(sh.config.name, { state: sh.state, failures: sh.failures, since: handover.now, tools: sh.session?.tools ?? [], session: !!sh.session });
      if (sh.session) actions.push(this.#publish(sh.config.name, sh.session.tools));
      else actions.push(this.#wake(sh.config.name, handover.now + 10n));
    }
    return actions;
  }
}
FakePolicy.global = 0;

const run = (steps, options = {}, settings = '{}') =>
  runScenario({ name: 't', level: 'contract', steps }, { newInstance: async () => new FakePolicy(options), settings });

const tool = (name) => ({ name, 'read-only': false, revision: 18446744073709551557n });
const configure = (name) => ({ do: 'event', kind: { tag: 'server-configured', val: { name, transport: 'stdio', include: [], exclude: [], settings: '' } } });
const connected = (server, tools = ['echo']) => ({ do: 'event', kind: { tag: 'connected', val: { server, 'server-info': 'fake 1', tools: tools.map(tool) } } });
const failed = (server) => ({ do: 'event', kind: { tag: 'connect-failed', val: { server, fault: { tag: 'handshake-timed-out' } } } });
const expect = (that, message = 'nope') => ({ do: 'expect', that, else: message });

describe('predicates', () => {
  const publish = (server, tools) => ({ tag: 'publish-tools', val: { server, tools: tools.map(([a, o]) => ({ advertised: a, original: o, 'read-only': false })) } });
  const state = {
    now: 100n,
    wakes: new Map([['a', { at: 100n, token: 1n }], ['b', { at: 99n, token: 2n }]]),
    actions: [
      { tag: 'connect', val: 'a' },
      { tag: 'disconnect', val: 'b' },
      { tag: 'withdraw-tools', val: 'b' },
      { tag: 'withdraw-tools', val: 'b' },
      publish('a', [['bad name', 'x']]),
      publish('a', [['a_x', 'x'], ['a_y', 'y']]),
      publish('c', [['dup', 'x'], ['dup', 'y']]),
      publish('d', [['d_1', 'x'], ['d_2', 'x']]),
    ],
    admission: { tag: 'hold', val: { 'wait-ms': 5n, message: 'alpha is reconnecting' } },
    status: [{ server: 'a', state: 'parked' }],
  };
  const cases = [
    [{ connects: 'a' }, true],
    [{ connects: 'b' }, false],
    [{ disconnects: 'b' }, true],
    [{ disconnects: 'a' }, false],
    [{ withdraws: { server: 'b', times: 2 } }, true],
    [{ withdraws: { server: 'b', times: 1 } }, false],
    [{ withdraws: { server: 'a', times: 0 } }, true],
    [{ publishes: 'a' }, true],
    [{ publishes: 'b' }, false],
    [{ 'publishes-originals': { server: 'a', originals: ['y', 'x'] } }, true],
    [{ 'publishes-originals': { server: 'a', originals: ['x'] } }, false],
    [{ 'publishes-originals': { server: 'a', originals: ['x', 'y', 'z'] } }, false],
    [{ 'publishes-originals': { server: 'd', originals: ['x'] } }, false], // an original twice
    [{ 'publishes-originals': { server: 'b', originals: [] } }, false],
    [{ 'publishes-usable-names': 'a' }, true], // the last publication counts
    [{ 'publishes-usable-names': 'c' }, false], // duplicates
    [{ 'publishes-usable-names': 'b' }, false], // none
    [{ 'timer-armed': 'a' }, true],
    [{ 'timer-armed': 'z' }, false],
    [{ 'timer-not-in-the-past': 'a' }, true],
    [{ 'timer-not-in-the-past': 'b' }, false],
    [{ 'timer-not-in-the-past': 'z' }, false],
    [{ admission: 'hold' }, true],
    [{ admission: 'allow' }, false],
    [{ 'refused-naming': 'alpha' }, true],
    [{ 'refused-naming': 'beta' }, false],
    [{ lists: 'a' }, true],
    [{ lists: 'b' }, false],
    [{ state: { server: 'a', in: ['connected', 'parked'] } }, true],
    [{ state: { server: 'a', in: ['healthy'] } }, false],
    [{ not: { connects: 'a' } }, false],
    [{ not: { not: { connects: 'a' } } }, true],
  ];
  for (const [predicate, expected] of cases) {
    test(`${stringify(predicate)} is ${expected}`, () => assert.equal(holds(predicate, state), expected));
  }
  test('refused-naming reads reject and reconnect messages, never allow', () => {
    assert.equal(holds({ 'refused-naming': 'a' }, { admission: { tag: 'reject', val: 'a is gone' } }), true);
    assert.equal(holds({ 'refused-naming': 'a' }, { admission: { tag: 'reconnect', val: 'a!' } }), true);
    assert.equal(holds({ 'refused-naming': 'a' }, { admission: { tag: 'allow' } }), false);
    assert.equal(holds({ 'refused-naming': 'a' }, { admission: null }), false);
  });
  test('state of a server status lacks fails, naming it, even under not', () => {
    assert.throws(() => holds({ state: { server: 'q', in: ['parked'] } }, state), /status\(\) does not list q/);
    assert.throws(() => holds({ not: { state: { server: 'q', in: ['parked'] } } }, state), /does not list q/);
  });
  test('malformed and unknown predicates fail', () => {
    assert.throws(() => holds({ connects: 'a', disconnects: 'b' }, state), /exactly one key/);
    assert.throws(() => holds({ sings: 'a' }, state), /unknown predicate/);
    assert.throws(() => holds({ withdraws: { server: 'a' } }, state), /"times"/);
  });
});

describe('steps and transcripts', () => {
  test('event, admit, status: one exact line per call', async () => {
    const r = await run([configure('alpha'), connected('alpha'), { do: 'admit', server: 'alpha', tool: 'echo', name: null }, { do: 'status' }]);
    assert.equal(r.failure, null);
    assert.deepEqual(r.transcript, [
      '{"do":"init","settings":"{}"}',
      '{"do":"handle","event":{"now":1000,"kind":{"tag":"server-configured","val":{"name":"alpha","transport":"stdio","include":[],"exclude":[],"settings":""}}},"actions":[{"tag":"state-changed","val":{"server":"alpha","state":"connecting","detail":"configured"}},{"tag":"connect","val":"alpha"}]}',
      '{"do":"handle","event":{"now":1000,"kind":{"tag":"connected","val":{"server":"alpha","server-info":"fake 1","tools":[{"name":"echo","read-only":false,"revision":18446744073709551557}]}}},"actions":[{"tag":"publish-tools","val":{"server":"alpha","tools":[{"advertised":"alpha__echo","original":"echo","read-only":false}]}}]}',
      '{"do":"admit","request":{"now":1000,"call-id":1,"server":"alpha","tool":"echo"},"admission":{"tag":"allow"}}',
      '{"do":"status","now":1000,"status":[{"server":"alpha","state":"connected","breaker":"closed","failures":0,"breaker-failures":0,"tool-errors":0,"last-fault":null,"since":1000,"published-tools":1,"next-attempt-at":null,"breaker-until":null}]}',
    ]);
  });

  test('an event given out of WIT order is recorded in WIT order', async () => {
    const r = await run([{ do: 'event', kind: { val: { settings: '', exclude: [], include: [], transport: 'sse', name: 'z' }, tag: 'server-configured' } }]);
    assert.match(r.transcript[1], /^\{"do":"handle","event":\{"now":1000,"kind":\{"tag":"server-configured","val":\{"name":"z","transport":"sse","include":\[\],"exclude":\[\],"settings":""\}\}\}/);
  });

  test('fire-timer moves time to the timer and sends its exact token; advance moves time', async () => {
    const r = await run([
      configure('a'),
      failed('a'),
      expect({ 'timer-armed': 'a' }),
      expect({ 'timer-not-in-the-past': 'a' }),
      { do: 'fire-timer', server: 'a', optional: false },
      expect({ not: { 'timer-armed': 'a' } }),
      expect({ connects: 'a' }),
      { do: 'fire-timer', server: 'a', optional: true },
      { do: 'advance', ms: 5 },
      { do: 'status' },
    ]);
    assert.equal(r.failure, null);
    assert.equal(r.transcript.length, 5);
    assert.equal(r.transcript[3], '{"do":"handle","event":{"now":1100,"kind":{"tag":"timer","val":{"server":"a","token":9223372036854775809}}},"actions":[{"tag":"connect","val":"a"}]}');
    assert.match(r.transcript[4], /^\{"do":"status","now":1105,/);
  });

  test('a timer in the past leaves time as it is', async () => {
    const r = await run([configure('a'), failed('a'), { do: 'advance', ms: 1000 }, { do: 'fire-timer', server: 'a', optional: false }]);
    assert.match(r.transcript[3], /"now":2000,/);
  });

  test('fire-timer without a timer fails unless optional', async () => {
    const r = await run([configure('a'), { do: 'fire-timer', server: 'a', optional: false }]);
    assert.equal(r.failure, 'at step 1 (configure a): expected a timer armed for a, none is');
  });

  test('admit numbers calls; finish reports the named or the latest; call finishes only what it may make', async () => {
    const r = await run([
      configure('a'),
      connected('a'),
      { do: 'admit', server: 'a', tool: 'one', name: 'first' },
      { do: 'admit', server: 'a', tool: 'two', name: null },
      { do: 'finish', server: 'a', call: 'first', outcome: { tag: 'ok' } },
      { do: 'finish', server: 'a', call: null, outcome: { tag: 'transport-error', val: { tag: 'process-exited', val: null } } },
      { do: 'call', server: 'a', tool: 'probe-me', outcome: { tag: 'timeout' } },
      expect({ admission: 'probe' }),
      { do: 'call', server: 'b', tool: 'x', outcome: { tag: 'ok' } },
      expect({ admission: 'reject' }),
      expect({ 'refused-naming': 'b' }),
      { do: 'call', server: 'a', tool: 'reconnect-me', outcome: { tag: 'ok' } },
      expect({ admission: 'reconnect' }),
    ]);
    assert.equal(r.failure, null);
    const lines = r.transcript.map(parse);
    assert.deepEqual(lines.map((l) => l.do), ['init', 'handle', 'handle', 'admit', 'admit', 'handle', 'handle', 'admit', 'handle', 'admit', 'admit']);
    assert.deepEqual(lines.filter((l) => l.do === 'admit').map((l) => l.request['call-id']), [1, 2, 3, 4, 5]);
    const reports = lines.filter((l) => l.event?.kind.tag === 'call-finished').map((l) => l.event.kind.val);
    assert.deepEqual(reports.map((x) => [x['call-id'], x.outcome.tag, x['duration-ms']]), [[1, 'ok', 5], [2, 'transport-error', 5], [3, 'timeout', 5]]);
    assert.equal(r.transcript[6], '{"do":"handle","event":{"now":1000,"kind":{"tag":"call-finished","val":{"server":"a","call-id":2,"outcome":{"tag":"transport-error","val":{"tag":"process-exited","val":null}},"duration-ms":5}}},"actions":[]}');
  });

  test('finish of an unknown call fails', async () => {
    const r = await run([configure('a'), { do: 'finish', server: 'a', call: 'nope', outcome: { tag: 'ok' } }]);
    assert.equal(r.failure, 'at step 1 (configure a): no call named nope was admitted');
  });

  test('snapshot-restore: one line, the state moves, the fresh instance goes on', async () => {
    const r = await run([configure('a'), failed('a'), { do: 'snapshot-restore' }, failed('a'), { do: 'status' }, expect({ state: { server: 'a', in: ['backing-off'] } })]);
    assert.equal(r.failure, null);
    assert.equal(r.transcript[3], '{"do":"snapshot-restore"}');
    assert.match(r.transcript[5], /"failures":2,/);
  });

  test('snapshot-restore fails when the status changes', async () => {
    const r = await run([configure('a'), failed('a'), { do: 'snapshot-restore' }], { lossy: true });
    assert.match(r.failure, /^at step 3 \(snapshot and restore into a fresh instance\): status changed across snapshot\/restore: \[.*"failures":1,.*\] -> \[.*"failures":0,/);
  });

  test('snapshot-restore with steps: the restored instance must answer them as the original did', async () => {
    const steps = [
      configure('a'),
      failed('a'),
      { do: 'snapshot-restore', steps: [{ do: 'fire-timer', server: 'a', optional: false }, expect({ connects: 'a' }), failed('a')] },
      expect({ 'timer-armed': 'a' }, 'the restored instance goes on'),
    ];
    const r = await run(steps);
    assert.equal(r.failure, null);
    assert.equal(r.transcript.length, 3 + 2 + 1 + 2);
    assert.equal(r.transcript[5], '{"do":"snapshot-restore"}');
    assert.deepEqual(r.transcript.slice(3, 5), r.transcript.slice(6, 8), 'the same time, tokens and answers');
    // A restore that loses the token counter answers the same failure with another timer.
    const forgets = await runScenario(
      { name: 't', level: 'contract', steps },
      {
        newInstance: async () =>
          Object.assign(new FakePolicy(), {
            restore(bytes) {
              FakePolicy.prototype.restore.call(this, bytes);
              this.tokens = 0n;
            },
          }),
      },
    );
    assert.match(
      forgets.failure,
      /^at step 8 \(a failed to connect \(MCP handshake timed out\)\): the restored instance answered otherwise than the original \(line 2 of the block's transcript\): /,
    );
    // A status that changes is found at the restore, before the steps run again.
    const lossy = await run(steps, { lossy: true });
    assert.match(lossy.failure, /^at step 6 \(restore the snapshot into a fresh instance\): status changed across snapshot\/restore: /);
  });

  test('published, redundant and attempting: what the host shows, what it absorbs, what is in flight', async () => {
    const noisy = {
      // Publishes again on a keepalive (in another order), withdraws on every failure.
      'keepalive-ok': (server) => [
        { tag: 'publish-tools', val: { server, tools: ['y', 'x'].map((t) => ({ advertised: `${server}__${t}`, original: t, 'read-only': false })) } },
        { tag: 'withdraw-tools', val: 'b' },
      ],
      'connect-failed': (v) => [{ tag: 'withdraw-tools', val: v.server }],
    };
    const ev = (tag, val) => ({ do: 'event', kind: { tag, val } });
    const r = await run(
      [
        configure('a'),
        expect({ attempting: 'a' }),
        configure('b'),
        expect({ not: { published: 'a' } }),
        connected('a', ['x', 'y']),
        expect({ not: { attempting: 'a' } }),
        expect({ published: 'a' }),
        expect({ not: { redundant: 'a' } }),
        ev('keepalive-ok', 'a'),
        expect({ redundant: 'a' }, 'the same tools in another order'),
        expect({ redundant: 'b' }, 'a withdrawal of nothing'),
        // Another revision of a tool is another publication.
        ev('connected', { server: 'a', 'server-info': 'f', tools: [{ ...tool('x'), revision: 1 }, tool('y')] }),
        expect({ not: { redundant: 'a' } }),
        ev('disconnected', { server: 'a', fault: { tag: 'session-expired' } }),
        expect({ not: { published: 'a' } }),
        expect({ not: { redundant: 'a' } }),
        { do: 'fire-timer', server: 'a', optional: false },
        failed('a'),
        expect({ redundant: 'a' }),
      ],
      { answers: noisy },
    );
    assert.equal(r.failure, null, r.transcript.join('\n'));
    // `twice` starts its second run from what the host showed before it: there, the
    // publication is new again.
    const twice = await run(
      [
        {
          do: 'twice',
          steps: [configure('a'), configure('b'), connected('a', ['x', 'y']), expect({ not: { redundant: 'a' } }), ev('keepalive-ok', 'a'), expect({ redundant: 'a' })],
        },
        expect({ published: 'b' }, 'b shows nothing'),
      ],
      { answers: { 'keepalive-ok': noisy['keepalive-ok'] } },
    );
    assert.equal(twice.failure, 'at step 8 (a answered a keepalive): b shows nothing; the host holds publications of ["a"]');
  });

  test('take-over: a fresh instance, its init line, then the handover and its actions', async () => {
    const handover = {
      now: 1000,
      servers: [
        {
          config: { name: 'a', transport: 'stdio', include: [], exclude: [], settings: '' },
          session: { 'server-info': 'x', tools: [tool('work')], proven: true },
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
      previous: { name: 'other', version: '1' },
    };
    const r = await run([configure('z'), { do: 'take-over', handover }, expect({ publishes: 'a' }), expect({ not: { connects: 'a' } }), { do: 'status' }, expect({ not: { lists: 'z' } })]);
    assert.equal(r.failure, null);
    assert.equal(r.transcript[2], '{"do":"init","settings":"{}"}');
    assert.equal(
      r.transcript[3],
      '{"do":"take-over","handover":' + stringify(handover) +
        ',"actions":[{"tag":"publish-tools","val":{"server":"a","tools":[{"advertised":"a__work","original":"work","read-only":false}]}}]}',
    );
    const refused = await run([{ do: 'take-over', handover: { ...handover, servers: [] } }]);
    assert.equal(refused.failure, 'at step 1 (take over from other): the handover was refused: nothing to take over');
  });

  test('twice: runs again in a fresh instance from the same clock; its init line between', async () => {
    const steps = [configure('a'), failed('a'), { do: 'fire-timer', server: 'a', optional: false }, { do: 'admit', server: 'a', tool: 't', name: 'x' }];
    const r = await run([{ do: 'advance', ms: 7 }, { do: 'twice', steps }, { do: 'finish', server: 'a', call: 'x', outcome: { tag: 'ok' } }]);
    assert.equal(r.failure, null);
    assert.equal(r.transcript.length, 1 + 4 + 1 + 4 + 1);
    assert.deepEqual(r.transcript.slice(1, 5), r.transcript.slice(6, 10));
    assert.equal(r.transcript[5], '{"do":"init","settings":"{}"}');
    assert.match(r.transcript[10], /"call-id":1,/); // the name refers to the second run's call
  });

  test('twice fails when the second run differs', async () => {
    const r = await run([{ do: 'twice', steps: [configure('a'), failed('a')] }], { nondeterministic: true });
    assert.match(r.failure, /^at step 4 \(a failed to connect \(MCP handshake timed out\)\): the same inputs gave other outputs in a fresh instance \(line 2 of the block's transcript\): .* vs /);
  });

  test('repeat ends at stop-if; else fails only when every round ran', async () => {
    const parks = [configure('a'), { do: 'repeat', times: 5, steps: [failed('a'), { do: 'status' }, { do: 'stop-if', that: { state: { server: 'a', in: ['parked'] } } }, { do: 'fire-timer', server: 'a', optional: false }], else: 'never parked' }];
    const ok = await run(parks);
    assert.equal(ok.failure, null);
    assert.equal(ok.transcript.filter((l) => l.includes('connect-failed')).length, 3);
    const short = structuredClone(parks);
    short[1].times = 2;
    const failing = await run(short);
    assert.equal(failing.failure, 'at step 5 (timer for a): never parked');
    short[1].else = null;
    assert.equal((await run(short)).failure, null);
  });

  test('expect fails with its message and what the predicate looked at', async () => {
    const r = await run([configure('a'), expect({ not: { connects: 'a' } }, 'must not connect')]);
    assert.equal(r.failure, 'at step 1 (configure a): must not connect; the actions were [{"tag":"state-changed","val":{"server":"a","state":"connecting","detail":"configured"}},{"tag":"connect","val":"a"}]');
    const timers = await run([configure('a'), failed('a'), expect({ 'timer-armed': 'b' }, 'no timer')]);
    assert.equal(timers.failure, 'at step 2 (a failed to connect (MCP handshake timed out)): no timer; at 1000 the timers were {"a": (1100, 9223372036854775809)}');
    const admission = await run([expect({ admission: 'allow' }, 'no')]);
    assert.equal(admission.failure, 'at step 0 (start): no; no call was admitted');
    const status = await run([{ do: 'status' }, expect({ lists: 'a' }, 'no')]);
    assert.equal(status.failure, 'at step 0 (start): no; the status was []');
  });

  test('publishing a tool the server does not offer is invalid output', async () => {
    const r = await run([configure('alpha'), connected('alpha')], { publishGhost: true });
    assert.equal(r.failure, 'at step 2 (alpha connected): policy under test failed during handle: returned invalid output: published alpha__ghost as "ghost", which server "alpha" does not offer');
    assert.equal(r.transcript.length, 2);
    const many = await run([configure('alpha'), connected('alpha')], { manyActions: true });
    assert.match(many.failure, /returned invalid output: returned 10001 actions for one event \(limit 10000\)$/);
  });

  test('the host knows the tools of live sessions only', async () => {
    const { Ledger } = await import('../scenario.mjs');
    const ledger = new Ledger();
    const ev = (kind) => ledger.noteEvent({ now: 1n, kind });
    const pub = (original) => [{ tag: 'publish-tools', val: { server: 'a', tools: [{ advertised: 'x', original, 'read-only': false }] } }];
    ev({ tag: 'connected', val: { server: 'a', 'server-info': '', tools: [tool('t')] } });
    assert.match(ledger.invalid(pub('t'), 'x'), /does not offer/, 'not configured: not known');
    ev({ tag: 'server-configured', val: { name: 'a' } });
    ev({ tag: 'connected', val: { server: 'a', 'server-info': '', tools: [tool('t')] } });
    assert.equal(ledger.invalid(pub('t'), 'x'), null);
    ev({ tag: 'tools-changed', val: { server: 'a', tools: [tool('u')] } });
    assert.match(ledger.invalid(pub('t'), 'x'), /does not offer/);
    assert.equal(ledger.invalid([{ tag: 'connect', val: 'a' }, ...pub('u')], 'x'), null, 'checked before the actions are taken');
    ledger.noteActions([{ tag: 'connect', val: 'a' }]);
    assert.match(ledger.invalid(pub('u'), 'x'), /does not offer/, 'a connect tears the session down');
    ledger.noteHandover({ servers: [{ config: { name: 'a' }, session: { tools: [tool('h')] } }] });
    assert.equal(ledger.invalid(pub('h'), 'x'), null);
  });

  test('a trap fails the scenario; the lines before it stay', async () => {
    const r = await run([configure('a'), failed('a')], { trapOn: 'connect-failed' });
    assert.equal(r.failure, 'at step 2 (a failed to connect (MCP handshake timed out)): RuntimeError: unreachable');
    assert.equal(r.transcript.length, 2);
  });

  test('settings refused by the first instance: the component is unusable', async () => {
    const r = await run([configure('a')], {}, '{"refuse":true}');
    assert.equal(r.unusable, 'policy under test refused the settings {"refuse":true}: unknown setting `refuse`');
    assert.deepEqual(r.transcript, []);
  });

  test('the settings are recorded as given', async () => {
    const r = await run([], {}, ' { } ');
    assert.deepEqual(r.transcript, ['{"do":"init","settings":" { } "}']);
  });

  test('malformed steps: the scenario file is wrong, said without a stack', async () => {
    for (const [steps, why] of [
      [[{ do: 'dance' }], /unknown step "dance"/],
      [[{ do: 'advance' }], /"ms" must be an integer/],
      [[{ do: 'event', kind: { tag: 'nope' } }], /^at step 0 \(start\): malformed event .*no case "nope"/],
      [[{ do: 'expect', that: { sings: 'a' }, else: 'x' }], /unknown predicate "sings"/],
      [[{ do: 'take-over', handover: { now: 1 } }], /malformed handover/],
      [[{ do: 'snapshot-restore', steps: 5 }], /"steps" must be a list of steps/],
      [[{ do: 'snapshot-restore', steps: [{ do: 'dance' }] }], /unknown step "dance"/],
    ]) {
      const r = await run(steps);
      assert.match(r.malformed ?? '', why, stringify(steps));
      assert.equal(r.failure, r.malformed);
      assert.doesNotMatch(r.malformed, /\n\s+at /);
    }
  });
});

describe('invalid output, as Tether refuses it (host/src/policy/outputs.rs)', () => {
  const pub = (server, tools) => ({ tag: 'publish-tools', val: { server, tools: tools.map(([advertised, original]) => ({ advertised, original, 'read-only': false })) } });
  const onConnected = (actions) => ({ answers: { connected: () => actions } });
  const prefix = 'at step 2 (alpha connected): policy under test failed during handle: returned invalid output: ';

  test('handle: an action about a server the host never configured, of any kind', async () => {
    for (const action of [
      { tag: 'connect', val: 'ghost' },
      { tag: 'disconnect', val: 'ghost' },
      { tag: 'withdraw-tools', val: 'ghost' },
      { tag: 'wake-at', val: { server: 'ghost', at: 5, token: 1 } },
      { tag: 'state-changed', val: { server: 'ghost', state: 'parked', detail: '' } },
    ]) {
      const r = await run([configure('alpha'), connected('alpha')], onConnected([action]));
      assert.equal(r.failure, prefix + 'acted on a server the host never configured: "ghost"', action.tag);
      assert.equal(r.transcript.length, 2, 'no line for a refused answer');
    }
  });

  test('handle: unusable, duplicate and empty names in a publication', async () => {
    const cases = [
      [[['bad name', 'echo']], 'published an unusable tool name "bad name"'],
      [[['x'.repeat(65), 'echo']], `published an unusable tool name "${'x'.repeat(65)}"`],
      [[['', 'echo']], 'published an unusable tool name ""'],
      [[['a\nb', 'echo']], 'published an unusable tool name "a\\nb"'],
      [[['e', 'echo'], ['e', 'echo']], 'published e twice'],
      [[['e', 'echo'], ['f', '']], 'published f as "", which server "alpha" does not offer'],
    ];
    for (const [tools, why] of cases) {
      const r = await run([configure('alpha'), connected('alpha')], onConnected([pub('alpha', tools)]));
      assert.equal(r.failure, prefix + why, JSON.stringify(tools));
    }
    // An empty original the server offers (a tool named "") is still refused.
    const empty = await run([configure('alpha'), connected('alpha', [''])], onConnected([pub('alpha', [['e', '']])]));
    assert.equal(empty.failure, prefix + 'published e without its original name');
    // Two advertised names in two publications are fine; so is the same original twice.
    const ok = await run([configure('alpha'), connected('alpha')], onConnected([pub('alpha', [['e', 'echo'], ['f', 'echo']]), pub('alpha', [['e', 'echo']])]));
    assert.equal(ok.failure, null);
  });

  test('handle: an unknown original is found before an unknown server (the order of the checks)', async () => {
    const r = await run([configure('alpha'), connected('alpha')], onConnected([{ tag: 'connect', val: 'ghost' }, pub('alpha', [['g', 'ghost']])]));
    assert.equal(r.failure, prefix + 'published g as "ghost", which server "alpha" does not offer');
  });

  test('server-removed: the host hears it after the answer, so the policy may still act on it', async () => {
    const ok = await run([configure('a'), { do: 'event', kind: { tag: 'server-removed', val: 'a' } }, expect({ disconnects: 'a' })]);
    assert.equal(ok.failure, null);
    const late = await run([configure('a'), { do: 'event', kind: { tag: 'server-removed', val: 'a' } }, { do: 'event', kind: { tag: 'shutdown' } }], {
      answers: { shutdown: () => [{ tag: 'withdraw-tools', val: 'a' }] },
    });
    assert.equal(late.failure, 'at step 3 (shutdown): policy under test failed during handle: returned invalid output: acted on a server the host never configured: "a"');
  });

  test('admit: a hold over 60 s, an empty or oversized message are refused before they are recorded', async () => {
    const hold = (ms, message = 'wait') => ({ tag: 'hold', val: { 'wait-ms': ms, message } });
    const cases = [
      [hold(60001n), 'held a call for 60001 ms (limit 60000)'],
      [hold(18446744073709551615n), 'held a call for 18446744073709551615 ms (limit 60000)'],
      [hold(5n, ' \t\n'), 'a refusal without a message for the model'],
      [{ tag: 'reject', val: '' }, 'a refusal without a message for the model'],
      [{ tag: 'reconnect', val: '\u3000' }, 'a refusal without a message for the model'],
      [{ tag: 'reject', val: 'é'.repeat(2049) }, 'a refusal message of 4098 bytes (limit 4096)'],
    ];
    for (const [admission, why] of cases) {
      const r = await run([configure('a'), { do: 'admit', server: 'a', tool: 't', name: null }], { admit: () => admission });
      assert.equal(r.failure, `at step 2 (admit a call to a/t): policy under test failed during admit: returned invalid output: ${why}`);
      assert.equal(r.transcript.length, 2, 'the admission is not recorded');
    }
    for (const admission of [hold(60000n), { tag: 'reject', val: 'x'.repeat(4096) }, { tag: 'reject', val: '\ufeff' }]) {
      const r = await run([configure('a'), { do: 'admit', server: 'a', tool: 't', name: null }], { admit: () => admission });
      assert.equal(r.failure, null, stringify(admission));
    }
  });

  const handover = (servers) => ({
    now: 1000,
    servers: servers.map(([name, session, connecting]) => ({
      config: { name, transport: 'stdio', include: [], exclude: [], settings: '' },
      session: session ? { 'server-info': 'x', tools: [tool('work')], proven: true } : null,
      connecting,
      state: 'connecting',
      breaker: 'closed',
      'breaker-until': null,
      failures: 0,
      'breaker-failures': 0,
      'tool-errors': 0,
      'last-fault': null,
      since: 3,
      'next-attempt-at': null,
    })),
    previous: { name: 'other', version: '1' },
  });

  test('take-over: connect or disconnect of a server whose session or attempt the host keeps', async () => {
    const h = handover([['live', true, false], ['dialing', false, true], ['idle', false, false]]);
    for (const [tag, server, why] of [
      ['connect', 'live', 'asked to connect or disconnect "live", whose session (or attempt) the host keeps'],
      ['disconnect', 'dialing', 'asked to connect or disconnect "dialing", whose session (or attempt) the host keeps'],
      ['connect', 'nobody', 'acted on a server the host never configured: "nobody"'],
    ]) {
      const r = await run([{ do: 'take-over', handover: h }], { takeOver: () => [{ tag, val: server }] });
      assert.equal(r.failure, `at step 1 (take over from other): policy under test failed during take-over: returned invalid output: ${why}`);
      assert.equal(r.transcript.length, 2, 'init lines only');
    }
    const ok = await run([{ do: 'take-over', handover: h }], { takeOver: () => [{ tag: 'connect', val: 'idle' }, { tag: 'disconnect', val: 'idle' }] });
    assert.equal(ok.failure, null);
    // An unknown original is Tether's conversion of the answer: a refused handover.
    const ghost = await run([{ do: 'take-over', handover: h }], { takeOver: () => [pub('live', [['g', 'ghost']])] });
    assert.match(ghost.failure, /: the handover was refused: policy under test failed during take-over: returned invalid output: published g as "ghost"/);
  });

  test('snapshot-restore compares the statuses server by server', async () => {
    const steps = [configure('b'), configure('a'), failed('a'), { do: 'snapshot-restore' }];
    assert.equal((await run(steps, { reorder: true })).failure, null);
    const lossy = await run(steps, { reorder: true, lossy: true });
    assert.match(lossy.failure, /status changed across snapshot\/restore: \[\{"server":"a",.*"failures":1,.*\{"server":"b".*\] -> \[\{"server":"a",.*"failures":0,/);
  });

  test('the ledger: attempts in flight and sessions', async () => {
    const { Ledger } = await import('../scenario.mjs');
    const ledger = new Ledger();
    const ev = (tag, val) => ledger.noteEvent({ now: 1n, kind: { tag, val } });
    ev('server-configured', { name: 'a' });
    assert.equal(ledger.isLive('a'), false);
    ledger.noteActions([{ tag: 'connect', val: 'a' }]);
    assert.equal(ledger.isLive('a'), true, 'an attempt in flight');
    assert.equal(ledger.isConnecting('a'), true);
    ev('connected', { server: 'a', tools: [tool('t')] });
    assert.equal(ledger.isLive('a'), true, 'a session');
    ledger.noteActions([{ tag: 'connect', val: 'a' }]);
    ev('disconnected', { server: 'a', fault: { tag: 'session-expired' } });
    assert.equal(ledger.isLive('a'), true, 'a disconnect leaves the attempt asked for since');
    ev('connect-failed', { server: 'a', fault: { tag: 'handshake-timed-out' } });
    assert.equal(ledger.isLive('a'), false);
    ledger.noteActions([{ tag: 'connect', val: 'a' }, { tag: 'disconnect', val: 'a' }]);
    assert.equal(ledger.isLive('a'), false, 'disconnect ends the attempt');
    assert.equal(ledger.checkActions([{ tag: 'connect', val: 'a' }]), null);
    ev('server-removed', 'a');
    assert.match(ledger.checkActions([{ tag: 'connect', val: 'a' }]), /never configured/);
    assert.equal(ledger.isConnecting('a'), false, 'a removed server has no attempt');
  });
});
