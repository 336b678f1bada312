// Contract 0.2.1: the operator's naming of a server (`set-naming`: a prefix, "" for the server's
// own names, none for the default) in every publication, and prompt names by the same rule.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { WindowPolicy } from '../src/machine.js';
import { isUsable, naturalName } from '../src/names.js';
import { restorePolicy, snapshotBytes, snapshotText } from '../src/snapshot.js';
import { config, count, Driver, publication, tool } from './driver.mjs';

const names = (actions, server) => publication(actions, server)?.tools.map((t) => [t.original, t.advertised]).sort();

test('an empty prefix gives the server its own names', () => {
  const d = new Driver();
  d.p.setNaming('files', ''); // before its configuration, as the host gives it
  d.configure('files');
  assert.deepEqual(names(d.connected('files', ['read_file', 'list']), 'files'), [
    ['list', 'list'],
    ['read_file', 'read_file'],
  ]);
});

test('a prefix goes before each name, made usable as any name', () => {
  const d = new Driver();
  d.p.setNaming('files', 'x-');
  d.configure('files');
  const shown = names(d.connected('files', ['read_file', 'read file']), 'files');
  assert.deepEqual(shown[1], ['read_file', 'x-read_file']);
  assert.match(shown[0][1], /^x-read_file-[0-9a-f]{8}$/); // changed by sanitizing: hashed
});

test('no naming gives the names of before', () => {
  const d = new Driver();
  d.p.setNaming('files', null);
  d.configure('files');
  assert.deepEqual(names(d.connected('files', ['read_file']), 'files'), [['read_file', 'files__read_file']]);
  assert.equal(naturalName('files.v2', 'read file', null), 'files_v2__read_file-59fe7266');
});

test('long names with a prefix are clamped to 64 characters with a hash', () => {
  const d = new Driver();
  d.p.setNaming('files', 'prefix-');
  d.configure('files');
  const long = 't'.repeat(100);
  const shown = names(d.connected('files', [long, `${long}u`]), 'files').map(([, advertised]) => advertised);
  assert.ok(shown.every((n) => n.length === 64 && isUsable(n) && n.startsWith('prefix-ttt')));
  assert.equal(new Set(shown).size, 2);
  // An empty name under an empty prefix still gets a usable one.
  assert.ok(isUsable(naturalName('files', '', '')));
});

test('a new naming renames at the next configuration, and only a difference is republished', () => {
  const d = new Driver();
  d.configure('files');
  d.connected('files', ['read']);
  d.p.setNaming('files', 'x-');
  assert.deepEqual(names(d.configure('files'), 'files'), [['read', 'x-read']]);
  assert.equal(publication(d.configure('files'), 'files'), undefined);
  d.p.setNaming('files', null);
  assert.deepEqual(names(d.configure('files'), 'files'), [['read', 'files__read']]);
  assert.deepEqual([...d.p.owners.keys()], ['files__read']);
});

test('collisions still fail closed: never one name twice, the first keeps it, nothing hidden', () => {
  const d = new Driver();
  for (const name of ['a', 'b']) {
    d.p.setNaming(name, '');
    d.configure(name);
  }
  assert.deepEqual(names(d.connected('a', ['read']), 'a'), [['read', 'read']]);
  const [[, second]] = names(d.connected('b', ['read']), 'b');
  assert.notEqual(second, 'read');
  assert.ok(isUsable(second));
  assert.deepEqual([...d.p.owners].sort(), [['read', 'a'], [second, 'b']].sort());
  // Within one server too: a prefix may map two tools to one name.
  d.p.setNaming('c', 'p');
  d.configure('c');
  const shown = names(d.connected('c', ['x', 'x']), 'c');
  assert.equal(shown.length, 1);
});

test('prompts are named by the same rule, and naming them changes nothing', () => {
  const d = new Driver();
  d.p.setNaming('files', 'x-');
  d.configure('files');
  d.connected('files', ['read']);
  d.p.takeLogs();
  const before = snapshotText(d.p);
  const long = 't'.repeat(100);
  const named = d.p.namePrompts('files', ['summarize', 'a b', 'a.b', 'summarize', long]);
  assert.equal(snapshotText(d.p), before);
  assert.deepEqual(d.p.takeLogs(), []);
  assert.deepEqual(
    named.map((n) => n.original),
    ['summarize', 'a b', 'a.b', long],
  );
  assert.equal(named[0].advertised, 'x-summarize');
  assert.equal(named[3].advertised, naturalName('files', long, 'x-'));
  assert.equal(new Set(named.map((n) => n.advertised)).size, 4);
  assert.ok(named.every((n) => isUsable(n.advertised)));
  // The order of the list does not decide who gets which name.
  const swapped = d.p.namePrompts('files', ['a.b', 'a b']);
  assert.deepEqual(swapped.map((n) => n.advertised).sort(), [named[1].advertised, named[2].advertised].sort());
  assert.deepEqual(d.p.namePrompts('other', ['p']), [{ advertised: 'other__p', original: 'p' }]);
  d.p.setNaming('mine', '');
  assert.deepEqual(d.p.namePrompts('mine', ['p']), [{ advertised: 'p', original: 'p' }]);
});

test('the naming is in the snapshot and ends with the server', () => {
  const d = new Driver();
  d.p.setNaming('files', 'x-');
  d.p.setNaming('later', ''); // not configured yet: kept all the same
  d.configure('files');
  d.connected('files', ['read']);
  const bytes = snapshotBytes(d.p);
  const restored = restorePolicy(bytes);
  assert.deepEqual(snapshotBytes(restored), bytes);
  assert.deepEqual([...restored.namings], [['files', 'x-'], ['later', '']]);
  assert.deepEqual(restored.namePrompts('files', ['p']), [{ advertised: 'x-p', original: 'p' }]);
  const removed = d.event('server-removed', 'files');
  assert.equal(count(removed, 'withdraw-tools', 'files'), 1);
  assert.deepEqual([...d.p.namings], [['later', '']]);
  d.configure('files');
  assert.deepEqual(names(d.connected('files', ['read']), 'files'), [['read', 'files__read']]);
  d.event('server-removed', 'later'); // never configured: its naming ends too
  assert.equal(d.p.namings.size, 0);
});

test('a snapshot without namings (an older build) restores with the default names', () => {
  const d = new Driver();
  d.healthy('alpha');
  const old = JSON.parse(snapshotText(d.p));
  delete old.namings;
  for (const s of old.servers) delete s.namedBy;
  const bytes = (v) => new TextEncoder().encode(JSON.stringify(v));
  const restored = restorePolicy(bytes(old));
  assert.equal(restored.namings.size, 0);
  assert.deepEqual(restored.status(d.now), d.p.status(d.now));
  const again = restored.handle({ now: d.now, kind: { tag: 'tools-changed', val: { server: 'alpha', tools: [tool('work')] } } });
  assert.equal(publication(again, 'alpha'), undefined);
  for (const bad of [{ alpha: 'x' }, [['alpha']], [['alpha', 1]], [['a', 'x'], ['a', 'y']]]) {
    assert.throws(() => restorePolicy(bytes({ ...old, namings: bad })), /namings/);
  }
  assert.throws(() => restorePolicy(bytes({ ...old, servers: [{ ...old.servers[0], namedBy: 3 }] })), /namedBy/);
});

test('take-over keeps the namings given before it', () => {
  const p = WindowPolicy.create('');
  p.setNaming('alpha', '');
  const server = {
    config: config('alpha'),
    session: { serverInfo: 'x', tools: [tool('work')], proven: true },
    connecting: false,
    state: 'healthy',
    breaker: 'closed',
    breakerUntil: undefined,
    failures: 0,
    breakerFailures: 0,
    toolErrors: 0,
    lastFault: undefined,
    since: 10,
    nextAttemptAt: undefined,
  };
  const actions = p.takeOver({ now: 1000, servers: [server], previous: { name: 'other', version: '1' } });
  assert.deepEqual(names(actions, 'alpha'), [['work', 'work']]);
  assert.deepEqual([...p.namings], [['alpha', '']]);
});
