// The WIT glue, run in Node with a stand-in for the host's `log` import: the bindings' shapes
// (BigInt u64, option as undefined, variants as { tag, val }) go in and come out as the
// contract says.

import assert from 'node:assert/strict';
import { register } from 'node:module';
import { test } from 'node:test';

const stub = 'export function log(level, message) { (globalThis.__policyLogs ??= []).push([level, message]); }';
const hook = `
export async function resolve(specifier, context, next) {
  if (specifier === 'tether:policy/log@0.2.2') {
    return { url: ${JSON.stringify(`data:text/javascript,${encodeURIComponent(stub)}`)}, shortCircuit: true };
  }
  return next(specifier, context);
}`;
register(`data:text/javascript,${encodeURIComponent(hook)}`);
const { policy } = await import('../src/policy.js');

const config = (name) => ({ name, transport: 'stdio', include: [], exclude: [], settings: '' });
const event = (now, tag, val) => ({ now: BigInt(now), kind: { tag, val } });

test('info names this implementation', () => {
  assert.deepEqual(policy.info(), { name: 'tether-window-policy', version: '0.1.0' });
});

test('init refuses bad settings by throwing the message', () => {
  assert.throws(() => policy.init('{"nope": true}'), (e) => typeof e === 'string' && /unknown setting "nope"/.test(e));
  policy.init('');
});

test('u64 values cross as BigInt both ways', () => {
  policy.init('{"jitter": 0}');
  policy.handle(event(1000, 'server-configured', config('alpha')));
  const actions = policy.handle(
    event(1000, 'connect-failed', { server: 'alpha', fault: { tag: 'transport-closed', val: 'reset' } }),
  );
  const wake = actions.find((a) => a.tag === 'wake-at').val;
  assert.equal(wake.at, 1500n);
  assert.equal(typeof wake.token, 'bigint');
  const hold = policy.admit({ now: 1000n, callId: 1n, server: 'alpha', tool: 'work' });
  assert.equal(hold.tag, 'hold');
  assert.equal(hold.val.waitMs, 3500n);
  const [status] = policy.status(1000n);
  assert.equal(status.since, 1000n);
  assert.equal(status.nextAttemptAt, 1500n);
  assert.equal(status.breakerUntil, undefined);
  assert.equal(status.lastFault, 'transport closed: reset');
  const fired = policy.handle(event(1500, 'timer', { server: 'alpha', token: wake.token }));
  assert.deepEqual(fired.at(-1), { tag: 'connect', val: 'alpha' });
  const connected = policy.handle(
    event(1600, 'connected', {
      server: 'alpha',
      serverInfo: 'x 1',
      tools: [{ name: 'work', readOnly: true, revision: 18446744073709551615n }],
    }),
  );
  const published = connected.find((a) => a.tag === 'publish-tools').val;
  assert.deepEqual(published, { server: 'alpha', tools: [{ advertised: 'alpha__work', original: 'work', readOnly: true }] });
  // The same revision again is no change; a u64 beyond 2^53 is compared exactly.
  const same = policy.handle(
    event(1700, 'tools-changed', { server: 'alpha', tools: [{ name: 'work', readOnly: true, revision: 18446744073709551615n }] }),
  );
  assert.equal(same.length, 0);
  const changed = policy.handle(
    event(1700, 'tools-changed', { server: 'alpha', tools: [{ name: 'work', readOnly: true, revision: 18446744073709551614n }] }),
  );
  assert.equal(changed.filter((a) => a.tag === 'publish-tools').length, 1);
  const report = policy.handle(
    event(1800, 'call-finished', { server: 'alpha', callId: 2n ** 64n - 1n, outcome: { tag: 'ok' }, durationMs: 3n }),
  );
  assert.deepEqual(report.map((a) => a.val.state), ['healthy']);
});

test('snapshot and restore through the glue; a bad snapshot changes nothing', () => {
  policy.init('');
  policy.handle(event(1000, 'server-configured', config('alpha')));
  const bytes = policy.snapshot();
  assert.ok(bytes instanceof Uint8Array);
  assert.throws(() => policy.restore(new Uint8Array([1, 2, 3])), (e) => typeof e === 'string');
  assert.equal(policy.status(0n).length, 1);
  policy.init('');
  assert.equal(policy.status(0n).length, 0);
  policy.restore(bytes);
  assert.deepEqual(policy.snapshot(), bytes);
});

test('take-over converts the handover and refuses a second one', () => {
  policy.init('');
  const server = {
    config: config('alpha'),
    session: { serverInfo: 'x', tools: [{ name: 'work', readOnly: false, revision: 1n }], proven: true },
    connecting: false,
    state: 'healthy',
    breaker: 'open',
    breakerUntil: 5000n,
    failures: 0,
    breakerFailures: 3,
    toolErrors: 0,
    lastFault: undefined,
    since: 10n,
    nextAttemptAt: undefined,
  };
  const actions = policy.takeOver({ now: 1000n, servers: [server], previous: { name: 'other', version: '1' } });
  assert.deepEqual(actions.map((a) => a.tag), ['publish-tools']);
  assert.equal(policy.status(1000n)[0].breakerUntil, 5000n);
  assert.throws(() => policy.takeOver({ now: 1000n, servers: [], previous: { name: 'o', version: '1' } }), /fresh instance/);
});

test('log records reach the host', () => {
  globalThis.__policyLogs = [];
  policy.init('');
  assert.deepEqual(globalThis.__policyLogs, [['info', 'tether-window-policy 0.1.0 started']]);
  policy.handle(event(1000, 'server-configured', config('alpha')));
  policy.handle(event(1000, 'server-removed', 'alpha'));
  assert.ok(globalThis.__policyLogs.some(([level, message]) => level === 'info' && /server "alpha" removed/.test(message)));
});

test('host times beyond 2^53 stay exact: the logic counts from an origin', () => {
  const base = 2n ** 60n;
  policy.init('{"jitter": 0}');
  policy.handle(event(base, 'server-configured', config('alpha')));
  const actions = policy.handle(event(base + 7n, 'connect-failed', { server: 'alpha', fault: { tag: 'transport-closed', val: 'reset' } }));
  const wake = actions.find((a) => a.tag === 'wake-at').val;
  assert.equal(wake.at, base + 7n + 500n);
  const [status] = policy.status(base + 8n);
  assert.equal(status.since, base + 7n);
  assert.equal(status.nextAttemptAt, base + 507n);
  const hold = policy.admit({ now: base + 100n, callId: 1n, server: 'alpha', tool: 'work' });
  assert.equal(hold.val.waitMs, 3407n);
  // The origin travels in the snapshot.
  const bytes = policy.snapshot();
  policy.init('');
  policy.restore(bytes);
  assert.equal(policy.status(base + 8n)[0].nextAttemptAt, base + 507n);
  const fired = policy.handle(event(base + 507n, 'timer', { server: 'alpha', token: wake.token }));
  assert.deepEqual(fired.at(-1), { tag: 'connect', val: 'alpha' });
  // The largest host time.
  policy.init('');
  const max = 2n ** 64n - 1n;
  policy.handle(event(max, 'server-configured', config('beta')));
  assert.equal(policy.status(max)[0].since, max);
});

test('set-naming and name-prompts through the glue (contract 0.2.1)', () => {
  policy.init('');
  policy.setNaming({ server: 'alpha', prefix: '' });
  policy.setNaming({ server: 'beta', prefix: undefined }); // none: the default naming
  policy.handle(event(1000, 'server-configured', config('alpha')));
  const connected = policy.handle(
    event(1001, 'connected', { server: 'alpha', serverInfo: 'x', tools: [{ name: 'work', readOnly: false, revision: 1n }] }),
  );
  assert.deepEqual(connected.find((a) => a.tag === 'publish-tools').val.tools, [{ advertised: 'work', original: 'work', readOnly: false }]);
  const bytes = policy.snapshot();
  assert.deepEqual(policy.namePrompts('alpha', ['ask', 'ask']), [{ advertised: 'ask', original: 'ask' }]);
  assert.deepEqual(policy.namePrompts('beta', ['ask']), [{ advertised: 'beta__ask', original: 'ask' }]);
  assert.deepEqual(policy.snapshot(), bytes, 'naming prompts changes nothing');
  policy.init('');
  policy.restore(bytes);
  assert.deepEqual(policy.namePrompts('alpha', ['ask']), [{ advertised: 'ask', original: 'ask' }]);
});
