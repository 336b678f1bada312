import assert from 'node:assert/strict';
import { test } from 'node:test';

import { restorePolicy, snapshotBytes, snapshotText } from '../src/snapshot.js';
import { Driver, faults, tool, transport } from './driver.mjs';

/** A policy with a bit of everything: a healthy server with an open breaker, one backing off,
 * one parked, one with a broken configuration, tool names that needed hashes and salts. */
function busy() {
  const d = new Driver('{"seed": 3, "breaker": {"threshold": 2}}');
  d.configure('alpha', ['*'], ['secret*']);
  d.connected('alpha', [tool('work', '18446744073709551615', true), 'read file', 'secret']);
  d.keepaliveOk('alpha');
  d.call('alpha', transport);
  d.call('alpha', { tag: 'timeout' });
  d.configure('beta');
  d.connectFailed('beta', faults.timedOut);
  d.configure('gamma');
  d.connectFailed('gamma', faults.auth);
  d.configure('delta', ['[bad'], []);
  d.configure('a');
  d.connected('a', ['b__c']);
  d.configure('a__b');
  d.connected('a__b', ['c']);
  d.call('a__b', { tag: 'tool-error', val: 'x' });
  return d;
}

test('restore continues exactly where the snapshot was taken', () => {
  const d = busy();
  const bytes = snapshotBytes(d.p);
  const twin = new Driver();
  twin.p = restorePolicy(bytes);
  twin.now = d.now;
  twin.wakes = new Map(d.wakes);
  twin.nextCall = d.nextCall;
  assert.deepEqual(twin.p.status(d.now), d.p.status(d.now));
  assert.deepEqual(snapshotBytes(twin.p), bytes, 'the same state gives the same bytes');
  const story = (x) => {
    const out = [];
    out.push(x.admit('alpha'));
    x.now += 3600000;
    out.push(x.admit('alpha'));
    out.push(x.fire('beta'));
    out.push(x.connectFailed('beta', faults.timedOut));
    out.push(x.reconnect('gamma'));
    out.push(x.connected('gamma', ['b__c', 'work']));
    out.push(x.disconnected('a'));
    out.push(x.toolsChanged('a__b', ['c', 'd']));
    out.push(x.configure('delta'));
    out.push(x.event('shutdown'));
    out.push(x.p.status(x.now));
    return out;
  };
  assert.deepEqual(story(twin), story(d));
});

test('u64 revisions survive exactly (no BigInt and no float in the state)', () => {
  const d = busy();
  const text = snapshotText(d.p);
  assert.match(text, /"revision":"18446744073709551615"/);
  const p = restorePolicy(new TextEncoder().encode(text));
  assert.equal(p.servers.get('alpha').session.tools[0].revision, '18446744073709551615');
});

test('a snapshot of a fresh policy restores to a fresh policy', () => {
  const d = new Driver();
  const p = restorePolicy(snapshotBytes(d.p));
  assert.deepEqual(p.status(0), []);
  assert.deepEqual(snapshotBytes(p), snapshotBytes(d.p));
});

test('foreign, damaged and future snapshots are refused with a reason', () => {
  const good = JSON.parse(snapshotText(busy().p));
  const bytes = (v) => new TextEncoder().encode(typeof v === 'string' ? v : JSON.stringify(v));
  const refused = (v, pattern) => assert.throws(() => restorePolicy(bytes(v)), pattern);
  refused('not json', /not UTF-8 JSON/);
  assert.throws(() => restorePolicy(new Uint8Array([0x7b, 0xff, 0x7d])), /not UTF-8 JSON/);
  refused([], /not a JSON object/);
  refused({ ...good, format: 'tether-default-policy' }, /format "tether-default-policy"/);
  refused({ ...good, version: 2 }, /version 2 is not supported/);
  refused({ ...good, settings: { ...good.settings, extra: 1 } }, /unknown setting "extra"/);
  const bad = structuredClone(good);
  bad.servers[0].state = 'dancing';
  refused(bad, /servers\[0\]\.state is not one of/);
  const badTool = structuredClone(good);
  badTool.servers.find((s) => s.session).session.tools[0].revision = 5;
  refused(badTool, /is not a tool/);
  const twice = structuredClone(good);
  twice.servers.push(twice.servers[0]);
  refused(twice, /appears twice/);
  const misfiled = structuredClone(good);
  misfiled.servers[0].name = 'other';
  refused(misfiled, /another name/);
});

test('a misconfigured server is restored as it runs: global settings, nothing passes the filter', async () => {
  const { NONE } = await import('../src/machine.js');
  // Invalid under the first settings (100 s * 5 >= 500 s), valid under the ones set afterwards;
  // setSettings keeps the configuration error until the server is configured again.
  const d = new Driver('{"window": {"ms": 500000}, "backoff": {"handshake": {"cap_ms": 60000}}}');
  d.configure('a', [], [], '{"backoff": {"handshake": {"cap_ms": 100000}}}');
  d.p.setSettings('{"window": {"ms": 600000}, "backoff": {"handshake": {"cap_ms": 60000}}}');
  assert.doesNotThrow(() => d.p.check(d.p.servers.get('a').config), 'valid now');
  const running = d.p.servers.get('a');
  assert.notEqual(running.configError, null);
  assert.equal(running.filter, NONE);
  const restored = restorePolicy(snapshotBytes(d.p)).servers.get('a');
  assert.equal(restored.configError, running.configError);
  assert.equal(restored.filter, NONE);
  assert.deepEqual(restored.settings, d.p.settings);
});

test('the time origin travels in the snapshot; a snapshot without one counts from 0', () => {
  const d = new Driver('');
  d.p.origin = '1152921504606846976';
  const text = snapshotText(d.p);
  assert.equal(restorePolicy(new TextEncoder().encode(text)).origin, '1152921504606846976');
  const old = JSON.parse(text);
  delete old.origin;
  assert.equal(restorePolicy(new TextEncoder().encode(JSON.stringify(old))).origin, '0');
  for (const bad of [-1, '01', 'x', '18446744073709551616']) {
    assert.throws(() => restorePolicy(new TextEncoder().encode(JSON.stringify({ ...old, origin: bad }))), /origin is not a host time/);
  }
});
