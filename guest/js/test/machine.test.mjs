import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { WindowPolicy } from '../src/machine.js';
import { DEFAULTS } from '../src/settings.js';
import { Driver, count, faults, has, publication, tool, transport } from './driver.mjs';

const USABLE = /^[A-Za-z0-9_-]{1,64}$/;

describe('connecting and backing off', () => {
  test('a configured server connects at once', () => {
    const d = new Driver();
    const actions = d.configure('alpha');
    assert.ok(has(actions, 'connect', 'alpha'));
    assert.equal(d.state('alpha'), 'connecting');
  });

  test('a failed attempt is retried after a backoff, never at once', () => {
    const d = new Driver();
    d.configure('alpha');
    const actions = d.connectFailed('alpha', faults.closed);
    assert.ok(!has(actions, 'connect', 'alpha'));
    assert.equal(d.state('alpha'), 'backing-off');
    const wake = d.wakes.get('alpha');
    assert.ok(wake.at > d.now);
    assert.equal(d.status('alpha').nextAttemptAt, wake.at);
    assert.ok(has(d.fire('alpha'), 'connect', 'alpha'));
  });

  test('the backoff depends on the fault class: a handshake timeout waits longer', () => {
    const delay = (fault) => {
      const d = new Driver('{"jitter": 0}');
      d.configure('alpha');
      d.connectFailed('alpha', fault);
      return d.wakes.get('alpha').at - d.now;
    };
    assert.equal(delay(faults.closed), DEFAULTS.backoff.network.base_ms);
    assert.equal(delay(faults.exited), DEFAULTS.backoff.crash.base_ms);
    assert.equal(delay(faults.timedOut), DEFAULTS.backoff.handshake.base_ms);
    assert.ok(delay(faults.timedOut) > delay(faults.closed));
  });

  test('the backoff doubles per failure up to the class cap; jitter only shortens it', () => {
    const d = new Driver('{"jitter": 0, "window": {"failures": 20, "ms": 3600000}}');
    d.configure('alpha');
    const delays = [];
    for (let i = 0; i < 8; i += 1) {
      d.connectFailed('alpha', faults.closed);
      delays.push(d.wakes.get('alpha').at - d.now);
      d.fire('alpha');
    }
    assert.deepEqual(delays, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
    const j = new Driver();
    j.configure('alpha');
    j.connectFailed('alpha', faults.closed);
    const jittered = j.wakes.get('alpha').at - j.now;
    assert.ok(jittered <= 500 && jittered >= 400, `${jittered}`);
  });

  test('jitter is deterministic and differs between servers', () => {
    const delays = (name) => {
      const d = new Driver('{"seed": 42}');
      d.configure(name);
      d.connectFailed(name, faults.timedOut);
      return d.wakes.get(name).at - d.now;
    };
    assert.equal(delays('alpha'), delays('alpha'));
    const all = new Set(['a', 'b', 'c', 'd', 'e', 'f'].map(delays));
    assert.ok(all.size > 1);
  });
});

describe('the failure window', () => {
  test('window.failures failures within window.ms park the server and arm a self-probe', () => {
    const d = new Driver();
    d.configure('alpha');
    let withdrawn = 0;
    for (let i = 1; i < DEFAULTS.window.failures; i += 1) {
      d.connectFailed('alpha', faults.timedOut);
      assert.equal(d.state('alpha'), 'backing-off', `failure ${i}`);
      withdrawn += count(d.fire('alpha'), 'withdraw-tools', 'alpha');
    }
    const actions = d.connectFailed('alpha', faults.timedOut);
    assert.equal(d.state('alpha'), 'parked');
    assert.equal(d.status('alpha').failures, DEFAULTS.window.failures);
    assert.ok(has(actions, 'wake-at', 'alpha'));
    assert.equal(withdrawn, 0);
    const { admission } = d.admit('alpha');
    assert.equal(admission.tag, 'reject');
    assert.match(admission.val, /"alpha"/);
    assert.match(admission.val, /MCP handshake timed out/);
  });

  test('failures spread wider than the window never park (only failures within it count)', () => {
    const d = new Driver('{"window": {"ms": 1000000, "failures": 3}}');
    d.configure('alpha');
    for (let i = 0; i < 10; i += 1) {
      d.connectFailed('alpha', faults.closed);
      assert.equal(d.state('alpha'), 'backing-off');
      d.now += 600000; // each failure long after the previous one
      d.fire('alpha');
    }
    assert.equal(d.status('alpha').failures, 10, 'the consecutive count still shows them');
  });

  test('a session that initializes and dies at once counts as a failure (respawn storm)', () => {
    const d = new Driver();
    d.configure('flappy');
    for (let i = 1; i <= DEFAULTS.window.failures; i += 1) {
      d.connected('flappy');
      d.disconnected('flappy');
      if (d.state('flappy') === 'parked') {
        assert.equal(i, DEFAULTS.window.failures);
        return;
      }
      d.fire('flappy');
    }
    assert.fail('never parked');
  });

  test('a proven session resets the window: proven sessions never park', () => {
    const d = new Driver();
    d.configure('steady');
    for (let i = 0; i < 50; i += 1) {
      d.connected('steady');
      d.keepaliveOk('steady');
      d.disconnected('steady');
      assert.equal(d.state('steady'), 'backing-off');
      assert.equal(d.status('steady').failures, 1);
      d.fire('steady');
    }
  });

  test('an answered call proves a session too, a tool error included', () => {
    for (const outcome of [{ tag: 'ok' }, { tag: 'tool-error', val: 'bad input' }]) {
      const d = new Driver();
      d.configure('alpha');
      d.connectFailed('alpha');
      d.fire('alpha');
      d.connected('alpha');
      assert.equal(d.state('alpha'), 'connected');
      d.call('alpha', outcome);
      assert.equal(d.state('alpha'), 'healthy');
      assert.equal(d.status('alpha').failures, 0);
    }
  });

  test('permanent faults park at once; the permanent setting decides which', () => {
    for (const fault of [faults.spawn, faults.auth, { tag: 'not-mcp-endpoint', val: 'HTML' }]) {
      const d = new Driver();
      d.configure('alpha');
      d.connectFailed('alpha', fault);
      assert.equal(d.state('alpha'), 'parked', fault.tag);
      assert.ok(d.wakes.has('alpha'));
    }
    const d = new Driver('{"permanent": ["handshake-failed"]}');
    d.configure('alpha');
    d.connectFailed('alpha', faults.spawn);
    assert.equal(d.state('alpha'), 'backing-off');
    d.fire('alpha');
    d.connectFailed('alpha', { tag: 'handshake-failed', val: 'protocol version' });
    assert.equal(d.state('alpha'), 'parked');
  });
});

describe('parked', () => {
  function parked(settings = '') {
    const d = new Driver(settings);
    d.configure('alpha');
    d.connectFailed('alpha', faults.spawn);
    assert.equal(d.state('alpha'), 'parked');
    return d;
  }

  test('the self-probe fires forever, slowing down to its maximum', () => {
    const d = parked('{"jitter": 0}');
    const intervals = [];
    for (let i = 0; i < 8; i += 1) {
      const before = d.now;
      assert.ok(has(d.fire('alpha'), 'connect', 'alpha'));
      intervals.push(d.now - before);
      d.connectFailed('alpha', faults.timedOut);
      assert.equal(d.state('alpha'), 'parked');
    }
    assert.deepEqual(intervals, [60000, 120000, 240000, 480000, 900000, 900000, 900000, 900000]);
    assert.ok(has(d.fire('alpha'), 'connect', 'alpha'));
    assert.ok(publication(d.connected('alpha'), 'alpha'));
  });

  test('a self-probe whose session is not proven parks again when it dies', () => {
    const d = parked();
    d.fire('alpha');
    d.connected('alpha');
    d.disconnected('alpha');
    assert.equal(d.state('alpha'), 'parked');
  });

  test('a proven revival resets everything', () => {
    const d = parked('{"jitter": 0}');
    d.fire('alpha');
    d.connected('alpha');
    d.keepaliveOk('alpha');
    assert.equal(d.state('alpha'), 'healthy');
    assert.equal(d.status('alpha').failures, 0);
    d.disconnected('alpha', faults.closed);
    assert.equal(d.state('alpha'), 'backing-off');
  });

  test('an operator\'s reconnect revives it at once; an agent\'s does not for a permanent fault', () => {
    const d = parked();
    assert.deepEqual(d.reconnect('alpha', 'agent'), []);
    assert.equal(d.state('alpha'), 'parked');
    assert.ok(has(d.reconnect('alpha', 'operator'), 'connect', 'alpha'));
    assert.equal(d.state('alpha'), 'connecting');
    assert.ok(publication(d.connected('alpha'), 'alpha'));
  });

  test('an agent may revive a server parked by retryable faults', () => {
    const d = new Driver();
    d.configure('alpha');
    for (let i = 0; i < DEFAULTS.window.failures; i += 1) {
      d.connectFailed('alpha', faults.closed);
      if (d.state('alpha') !== 'parked') d.fire('alpha');
    }
    assert.equal(d.state('alpha'), 'parked');
    assert.ok(has(d.reconnect('alpha', 'agent'), 'connect', 'alpha'));
  });
});

describe('the circuit breaker', () => {
  function open(d) {
    for (let i = 0; i < DEFAULTS.breaker.threshold; i += 1) assert.equal(d.call('alpha', transport).tag, 'allow');
    assert.equal(d.status('alpha').breaker, 'open');
  }

  test('opens after threshold consecutive transport failures or timeouts and fails fast', () => {
    const d = new Driver();
    d.healthy('alpha');
    d.call('alpha', { tag: 'timeout' });
    d.call('alpha', transport);
    d.call('alpha', { tag: 'timeout' });
    const actions = (() => {
      const { callId } = d.admit('alpha');
      return d.finish('alpha', callId, transport);
    })();
    assert.ok(actions.some((a) => a.tag === 'state-changed' && /circuit breaker open/.test(a.val.detail)));
    const s = d.status('alpha');
    assert.equal(s.breaker, 'open');
    assert.equal(s.breakerFailures, 4);
    assert.equal(s.breakerUntil, d.now + DEFAULTS.breaker.cooldown_ms);
    const { admission } = d.admit('alpha');
    assert.equal(admission.tag, 'reject');
    assert.match(admission.val, /"alpha"/);
  });

  test('status reports half-open at the time asked, before any event', () => {
    const d = new Driver();
    d.healthy('alpha');
    open(d);
    const until = d.status('alpha').breakerUntil;
    assert.equal(d.p.status(until - 1)[0].breaker, 'open');
    assert.equal(d.p.status(until)[0].breaker, 'half-open');
    assert.equal(d.p.status(until)[0].breakerUntil, undefined);
  });

  test('exactly one half-open probe; its answer closes the breaker', () => {
    const d = new Driver();
    d.healthy('alpha');
    open(d);
    d.now += 3600000;
    const probe = d.admit('alpha');
    assert.equal(probe.admission.tag, 'probe');
    const second = d.admit('alpha');
    assert.equal(second.admission.tag, 'reject');
    assert.match(second.admission.val, /"alpha"/);
    d.finish('alpha', probe.callId, { tag: 'ok' });
    assert.equal(d.admit('alpha').admission.tag, 'allow');
  });

  test('a failed probe reopens the breaker for longer', () => {
    const d = new Driver();
    d.healthy('alpha');
    open(d);
    d.now += 3600000;
    const probe = d.admit('alpha');
    d.finish('alpha', probe.callId, transport);
    const s = d.status('alpha');
    assert.equal(s.breaker, 'open');
    assert.equal(s.breakerUntil - d.now, 2 * DEFAULTS.breaker.cooldown_ms);
  });

  test('a probe that finds no session signals a reconnect; the new session closes the breaker', () => {
    const d = new Driver();
    d.healthy('alpha');
    open(d);
    d.disconnected('alpha');
    d.now += 3600000;
    const { admission } = d.admit('alpha');
    assert.equal(admission.tag, 'reconnect');
    assert.match(admission.val, /"alpha"/);
    assert.equal(d.admit('alpha').admission.tag, 'hold', 'the attempt is overdue: later calls wait for it');
    assert.ok(has(d.reconnect('alpha', 'probe'), 'connect', 'alpha'));
    d.connected('alpha');
    assert.equal(d.admit('alpha').admission.tag, 'allow');
  });

  test('tool errors never open the breaker and are counted apart', () => {
    const d = new Driver();
    d.healthy('alpha');
    for (let i = 0; i < 30; i += 1) assert.equal(d.call('alpha', { tag: 'tool-error', val: 'invalid' }).tag, 'allow');
    const s = d.status('alpha');
    assert.equal(s.toolErrors, 30);
    assert.equal(s.breakerFailures, 0);
    d.call('alpha', { tag: 'ok' });
    assert.equal(d.status('alpha').toolErrors, 0);
  });

  test('cancelled calls say nothing; a cancelled probe frees the probe', () => {
    const d = new Driver();
    d.healthy('alpha');
    for (let i = 0; i < 10; i += 1) d.call('alpha', { tag: 'cancelled' });
    assert.equal(d.status('alpha').breakerFailures, 0);
    open(d);
    d.now += 3600000;
    const probe = d.admit('alpha');
    d.finish('alpha', probe.callId, { tag: 'cancelled' });
    assert.equal(d.admit('alpha').admission.tag, 'probe');
  });
});

describe('admission while no session is up', () => {
  test('a call waits for an attempt in flight, or one due within hold_ms', () => {
    const d = new Driver('{"jitter": 0}');
    d.configure('alpha');
    let { admission } = d.admit('alpha');
    assert.equal(admission.tag, 'hold');
    assert.equal(admission.val.waitMs, DEFAULTS.hold_ms);
    assert.match(admission.val.message, /"alpha"/);
    d.connectFailed('alpha', faults.closed); // next attempt in 500 ms
    ({ admission } = d.admit('alpha'));
    assert.equal(admission.tag, 'hold');
    assert.equal(admission.val.waitMs, 500 + DEFAULTS.hold_ms);
    d.fire('alpha');
    d.connectFailed('alpha', faults.timedOut);
    d.fire('alpha');
    d.connectFailed('alpha', faults.timedOut); // next attempt in 20 s
    ({ admission } = d.admit('alpha'));
    assert.equal(admission.tag, 'reject');
    assert.match(admission.val, /Retry in about 20 s/);
  });

  test('hold_ms 0 never holds', () => {
    const d = new Driver('{"hold_ms": 0}');
    d.configure('alpha');
    assert.equal(d.admit('alpha').admission.tag, 'reject');
  });

  test('messages to agents never carry the host\'s fault text', () => {
    const d = new Driver();
    d.configure('alpha');
    d.connectFailed('alpha', { tag: 'spawn-failed', val: '/secret/path/token=abc' });
    const { admission } = d.admit('alpha');
    assert.doesNotMatch(admission.val, /secret/);
    assert.match(d.status('alpha').lastFault, /secret/, 'operators see it');
  });

  test('unknown, removed and stopped servers are refused', () => {
    const d = new Driver();
    assert.equal(d.admit('ghost').admission.tag, 'reject');
    d.configure('alpha');
    d.event('shutdown');
    const { admission } = d.admit('alpha');
    assert.equal(admission.tag, 'reject');
    assert.match(admission.val, /"alpha" has been stopped/);
  });
});

describe('tools', () => {
  test('published under usable, unique names that keep the originals', () => {
    const d = new Driver();
    d.configure('files.v2');
    const long = 'x'.repeat(100);
    const p = publication(d.connected('files.v2', ['read file', 'write', long]), 'files.v2');
    assert.equal(p.tools.length, 3);
    assert.ok(p.tools.every((t) => USABLE.test(t.advertised)));
    assert.equal(new Set(p.tools.map((t) => t.advertised)).size, 3);
    assert.deepEqual(p.tools.map((t) => t.original).sort(), ['read file', long, 'write'].sort());
    assert.equal(d.status('files.v2').publishedTools, 3);
    assert.equal(d.admit('files.v2', 'write').admission.tag, 'allow');
  });

  test('names colliding across servers: the holder keeps its name, the newcomer gets another', () => {
    const d = new Driver();
    d.configure('a');
    d.configure('a__b');
    const first = publication(d.connected('a', ['b__c']), 'a');
    assert.deepEqual(first.tools.map((t) => t.advertised), ['a__b__c']);
    const second = publication(d.connected('a__b', ['c', 'd']), 'a__b');
    const names = second.tools.map((t) => t.advertised);
    assert.equal(names.length, 2);
    assert.ok(!names.includes('a__b__c'));
    assert.ok(names.includes('a__b__d'));
    assert.ok(names.every((n) => USABLE.test(n)));
  });

  test('names colliding within a server are all published, distinct', () => {
    const d = new Driver();
    d.configure('s');
    const p = publication(d.connected('s', ['a.b', 'a/b', 'a_b', 'ok']), 's');
    assert.equal(p.tools.length, 4);
    assert.equal(new Set(p.tools.map((t) => t.advertised)).size, 4);
    assert.ok(p.tools.some((t) => t.advertised === 's__a_b' && t.original === 'a_b'));
  });

  test('a tool keeps its name while it stays published', () => {
    const d = new Driver();
    d.configure('a');
    d.configure('a__b');
    d.connected('a', ['b__c']);
    const before = publication(d.connected('a__b', ['c']), 'a__b').tools[0].advertised;
    d.disconnected('a'); // frees a__b__c
    const after = publication(d.toolsChanged('a__b', ['c', 'e']), 'a__b');
    assert.equal(after.tools.find((t) => t.original === 'c').advertised, before);
  });

  test('duplicates and empty names in a server\'s list are skipped', () => {
    const d = new Driver();
    d.configure('s');
    const p = publication(d.connected('s', ['a', 'a', '']), 's');
    assert.deepEqual(p.tools.map((t) => t.original), ['a']);
  });

  test('republished only when names, read-only or revision changed', () => {
    const d = new Driver();
    d.configure('alpha');
    d.connected('alpha', ['one', 'two']);
    assert.equal(publication(d.toolsChanged('alpha', ['two', 'one']), 'alpha'), undefined);
    const revised = publication(d.toolsChanged('alpha', [tool('one', '2'), 'two']), 'alpha');
    assert.ok(revised, 'a new revision is republished');
    assert.equal(publication(d.toolsChanged('alpha', [tool('one', '2'), 'two']), 'alpha'), undefined);
    const ro = publication(d.toolsChanged('alpha', [tool('one', '2', true), 'two']), 'alpha');
    assert.equal(ro.tools.find((t) => t.original === 'one').readOnly, true);
    const changed = publication(d.toolsChanged('alpha', ['one', 'three']), 'alpha');
    assert.deepEqual(changed.tools.map((t) => t.original).sort(), ['one', 'three']);
  });

  test('include and exclude filter the tools; a filter change republishes the difference', () => {
    const d = new Driver();
    d.configure('alpha', ['read_*'], ['read_secret']);
    const p = publication(d.connected('alpha', ['read_file', 'read_secret', 'write_file']), 'alpha');
    assert.deepEqual(p.tools.map((t) => t.original), ['read_file']);
    const wider = publication(d.configure('alpha', [], ['read_secret']), 'alpha');
    assert.deepEqual(wider.tools.map((t) => t.original).sort(), ['read_file', 'write_file']);
    assert.equal(publication(d.configure('alpha', [], ['read_secret']), 'alpha'), undefined);
    const none = d.configure('alpha', ['nothing'], []);
    assert.equal(count(none, 'withdraw-tools', 'alpha'), 1);
  });

  test('withdrawn exactly once, however the server goes on failing', () => {
    const d = new Driver();
    d.configure('alpha');
    d.connected('alpha', ['echo']);
    let withdrawn = count(d.disconnected('alpha'), 'withdraw-tools', 'alpha');
    for (let i = 0; i < 25 && d.state('alpha') !== 'parked'; i += 1) {
      withdrawn += count(d.fire('alpha'), 'withdraw-tools', 'alpha');
      withdrawn += count(d.connectFailed('alpha', faults.timedOut), 'withdraw-tools', 'alpha');
    }
    assert.equal(d.state('alpha'), 'parked');
    assert.equal(withdrawn, 1);
  });

  test('removal withdraws, disconnects and forgets', () => {
    const d = new Driver();
    d.configure('alpha');
    d.connected('alpha');
    const actions = d.event('server-removed', 'alpha');
    assert.equal(count(actions, 'withdraw-tools', 'alpha'), 1);
    assert.ok(has(actions, 'disconnect', 'alpha'));
    assert.equal(d.status('alpha'), undefined);
    assert.equal(d.admit('alpha').admission.tag, 'reject');
    assert.deepEqual(d.event('server-removed', 'alpha'), []);
  });

  test('shutdown withdraws every server once and stops everything', () => {
    const d = new Driver();
    d.configure('beta');
    d.connected('beta');
    d.configure('alpha');
    d.connected('alpha');
    d.configure('gamma');
    const actions = d.event('shutdown');
    for (const s of ['alpha', 'beta']) assert.equal(count(actions, 'withdraw-tools', s), 1);
    assert.equal(count(actions, 'withdraw-tools', 'gamma'), 0);
    assert.deepEqual(
      actions.filter((a) => a.tag === 'disconnect').map((a) => a.val),
      ['alpha', 'beta', 'gamma'],
    );
    assert.deepEqual(d.event('shutdown'), []);
    assert.deepEqual(d.connected('alpha'), [{ tag: 'disconnect', val: 'alpha' }]);
  });

  test('tools of a server without a session are never published', () => {
    const d = new Driver();
    d.configure('alpha');
    assert.deepEqual(d.toolsChanged('alpha', ['x']), []);
  });
});

describe('configuration', () => {
  test('an invalid configuration parks the server (nothing is connected) until it is fixed', () => {
    const d = new Driver();
    const actions = d.configure('alpha', ['[broken'], []);
    assert.ok(!has(actions, 'connect', 'alpha'));
    assert.equal(d.state('alpha'), 'parked');
    assert.match(d.admit('alpha').admission.val, /configuration is invalid/);
    assert.ok(has(d.fire('alpha'), 'wake-at', 'alpha'), 'the self-probe re-checks and parks again');
    assert.ok(has(d.configure('alpha'), 'connect', 'alpha'));
  });

  test('per-server settings override the global ones; unknown keys are a configuration error', () => {
    const d = new Driver('{"jitter": 0}');
    d.configure('alpha', [], [], '{"backoff": {"network": {"base_ms": 50}}}');
    d.connectFailed('alpha', faults.closed);
    assert.equal(d.wakes.get('alpha').at - d.now, 50);
    d.configure('beta', [], [], '{"retry": 1}');
    assert.equal(d.state('beta'), 'parked');
  });

  test('set-settings keeps the state; settings that break a server are refused and change nothing', () => {
    const d = new Driver();
    d.configure('alpha', [], [], '{"backoff": {"network": {"base_ms": 100}}}');
    d.connected('alpha');
    const before = JSON.stringify(d.p.status(d.now));
    assert.throws(() => d.p.setSettings('{"unknown": 1}'), /unknown setting/);
    assert.throws(
      () => d.p.setSettings('{"backoff": {"network": {"base_ms": 40, "cap_ms": 50}}}'),
      /server "alpha"/,
    );
    assert.equal(JSON.stringify(d.p.status(d.now)), before);
    d.p.setSettings('{"hold_ms": 0}');
    assert.equal(d.p.settings.hold_ms, 0);
    assert.equal(JSON.stringify(d.p.status(d.now)), before);
  });
});

describe('take-over', () => {
  const handed = (name, extra) => ({
    config: { name, transport: 'stdio', include: [], exclude: [], settings: '' },
    session: undefined,
    connecting: false,
    state: 'backing-off',
    breaker: 'closed',
    breakerUntil: undefined,
    failures: 0,
    breakerFailures: 0,
    toolErrors: 0,
    lastFault: undefined,
    since: 5,
    nextAttemptAt: undefined,
    ...extra,
  });

  test('keeps live sessions (published, never connected), awaits attempts, re-arms timers', () => {
    const p = WindowPolicy.create('');
    const actions = p.takeOver({
      now: 1000,
      previous: { name: 'other', version: '1' },
      servers: [
        handed('live', { state: 'healthy', session: { serverInfo: 'x', tools: [tool('work')], proven: true } }),
        handed('unproven', { state: 'connected', session: { serverInfo: 'x', tools: [tool('work')], proven: false } }),
        handed('inflight', { state: 'connecting', connecting: true }),
        handed('later', { failures: 2, lastFault: 'transport closed', nextAttemptAt: 1500 }),
        handed('overdue', { failures: 1, nextAttemptAt: 900 }),
        handed('parked', { state: 'parked', failures: 6, nextAttemptAt: 50000 }),
        handed('open', {
          state: 'healthy',
          session: { serverInfo: 'x', tools: [tool('w')], proven: true },
          breaker: 'open',
          breakerUntil: 4000,
          breakerFailures: 3,
        }),
      ],
    });
    const connects = actions.filter((a) => a.tag === 'connect').map((a) => a.val);
    assert.deepEqual(connects, ['overdue']);
    assert.ok(publication(actions, 'live'));
    assert.ok(publication(actions, 'unproven'));
    const wakes = Object.fromEntries(actions.filter((a) => a.tag === 'wake-at').map((a) => [a.val.server, a.val.at]));
    assert.deepEqual(wakes, { later: 1500, parked: 50000 });
    const status = Object.fromEntries(p.status(1000).map((s) => [s.server, s]));
    assert.equal(status.live.state, 'healthy');
    assert.equal(status.unproven.state, 'connected');
    assert.equal(status.inflight.state, 'connecting');
    assert.equal(status.later.state, 'backing-off');
    assert.equal(status.later.failures, 2);
    assert.equal(status.later.lastFault, 'transport closed');
    assert.equal(status.parked.state, 'parked');
    assert.equal(status.open.breaker, 'open');
    assert.equal(status.open.breakerUntil, 4000);
    assert.equal(p.admit({ now: 10, callId: '1', server: 'live', tool: 'work' }).tag, 'allow');
    assert.equal(p.admit({ now: 10, callId: '2', server: 'open', tool: 'w' }).tag, 'reject');
    assert.equal(p.admit({ now: 4000, callId: '3', server: 'open', tool: 'w' }).tag, 'probe');
  });

  test('a handed-over failure count still counts toward the window', () => {
    const p = WindowPolicy.create('');
    p.takeOver({ now: 1000, previous: { name: 'o', version: '1' }, servers: [handed('a', { failures: 20, nextAttemptAt: 1100 })] });
    p.handle({ now: 1100, kind: { tag: 'timer', val: { server: 'a', token: p.servers.get('a').wake.token } } });
    p.handle({ now: 1200, kind: { tag: 'connect-failed', val: { server: 'a', fault: faults.closed } } });
    assert.equal(p.status(1200)[0].state, 'parked');
  });

  test('refused on an instance that knows servers, or for a handover naming a server twice', () => {
    const d = new Driver();
    d.configure('alpha');
    assert.throws(() => d.p.takeOver({ now: 1, previous: { name: 'o', version: '1' }, servers: [] }), /fresh instance/);
    const p = WindowPolicy.create('');
    assert.throws(
      () => p.takeOver({ now: 1, previous: { name: 'o', version: '1' }, servers: [handed('a'), handed('a')] }),
      /twice/,
    );
    assert.equal(p.servers.size, 0);
  });
});

test('decisions are deterministic', () => {
  const story = () => {
    const d = new Driver();
    const out = [];
    out.push(d.configure('alpha'));
    out.push(d.connectFailed('alpha', faults.closed));
    out.push(d.fire('alpha'));
    out.push(d.connected('alpha', ['work', 'read']));
    for (const o of [{ tag: 'ok' }, transport, { tag: 'timeout' }, { tag: 'tool-error', val: 'bad' }]) out.push(d.call('alpha', o));
    out.push(d.keepaliveOk('alpha'));
    out.push(d.disconnected('alpha'));
    out.push(d.fire('alpha'));
    out.push(d.p.status(d.now));
    return JSON.stringify(out);
  };
  assert.equal(story(), story());
});

describe('a handed-over attempt of a server whose configuration is invalid', () => {
  // Per-server settings written for the default policy: unknown keys here, so invalid.
  const inflight = {
    config: { name: 'a', transport: 'stdio', include: [], exclude: [], settings: '{"reconnect_budget":3}' },
    session: undefined,
    connecting: true,
    state: 'connecting',
    breaker: 'closed',
    breakerUntil: undefined,
    failures: 0,
    breakerFailures: 0,
    toolErrors: 0,
    lastFault: undefined,
    since: 5,
    nextAttemptAt: undefined,
  };
  const takenOver = () => {
    const p = WindowPolicy.create('');
    const actions = p.takeOver({ now: 1000, previous: { name: 'default', version: '1' }, servers: [inflight] });
    assert.deepEqual(actions, [], 'the attempt is awaited: no connect, no disconnect');
    assert.equal(p.status(1000)[0].state, 'connecting');
    return p;
  };
  const handle = (p, now, tag, val) => p.handle({ now, kind: { tag, val } });
  const tags = (actions) => actions.map((a) => a.tag);

  test('its failure parks it with the configuration error, a self-probe armed', () => {
    const p = takenOver();
    const out = handle(p, 1100, 'connect-failed', { server: 'a', fault: { tag: 'transport-closed', val: 'x' } });
    assert.deepEqual(tags(out), ['state-changed', 'wake-at']);
    assert.match(out[0].val.detail, /^parked: invalid configuration: .*reconnect_budget/);
    const [status] = p.status(1100);
    assert.equal(status.state, 'parked');
    assert.equal(p.admit({ now: 1100, callId: '1', server: 'a', tool: 't' }).tag, 'reject');
  });

  test('its session is closed, nothing published, and it parks', () => {
    const p = takenOver();
    const out = handle(p, 1100, 'connected', { server: 'a', serverInfo: 'x', tools: [tool('work')] });
    assert.deepEqual(tags(out), ['disconnect', 'state-changed', 'wake-at']);
    assert.equal(p.status(1100)[0].state, 'parked');
    assert.equal(p.status(1100)[0].publishedTools, 0);
  });

  test('fixed while its attempt is in flight: the attempt is awaited, then used', () => {
    const p = takenOver();
    const fixed = handle(p, 1100, 'server-configured', { ...inflight.config, settings: '' });
    assert.deepEqual(fixed, [], 'no second attempt while one is in flight');
    const out = handle(p, 1200, 'connected', { server: 'a', serverInfo: 'x', tools: [tool('work')] });
    assert.ok(tags(out).includes('publish-tools'));
  });

  test('fixed once parked: an attempt starts at once', () => {
    const p = takenOver();
    handle(p, 1100, 'connect-failed', { server: 'a', fault: { tag: 'transport-closed', val: 'x' } });
    const out = handle(p, 1200, 'server-configured', { ...inflight.config, settings: '{"window": {"failures": 3}}' });
    assert.deepEqual(tags(out), ['state-changed', 'connect']);
    assert.equal(p.status(1200)[0].state, 'connecting');
  });
});
