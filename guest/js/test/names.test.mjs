import assert from 'node:assert/strict';
import { test } from 'node:test';

import { fnv1a32, isUsable, naturalName, saltedName, sanitize } from '../src/names.js';

test('a name that is usable as it is stays as it is', () => {
  assert.equal(naturalName('files', 'read_file'), 'files__read_file');
  assert.equal(naturalName('my-srv', 'get-x'), 'my-srv__get-x');
  const tool = 't'.repeat(64 - 'srv__'.length);
  assert.equal(naturalName('srv', tool), `srv__${tool}`);
});

test('a changed name gets a hash of the unchanged names', () => {
  const name = naturalName('files.v2', 'read file');
  assert.match(name, /^files_v2__read_file-[0-9a-f]{8}$/);
  assert.ok(isUsable(name));
  // Two names that sanitize alike stay apart.
  assert.notEqual(naturalName('s', 'a.b'), naturalName('s', 'a/b'));
  // And a changed name never takes the plain name of the tool it resembles.
  assert.notEqual(naturalName('s', 'a.b'), naturalName('s', 'a_b'));
});

test('long names are clamped to 64 characters and stay distinct', () => {
  const a = naturalName('server', `${'x'.repeat(80)}a`);
  const b = naturalName('server', `${'x'.repeat(80)}b`);
  assert.equal(a.length, 64);
  assert.equal(b.length, 64);
  assert.ok(isUsable(a) && isUsable(b));
  assert.notEqual(a, b);
  assert.equal(a.slice(0, 55), b.slice(0, 55));
});

test('salted names differ from the natural one and from each other', () => {
  const natural = naturalName('a', 'b__c');
  const one = saltedName('a', 'b__c', 1);
  const two = saltedName('a', 'b__c', 2);
  assert.equal(new Set([natural, one, two]).size, 3);
  assert.ok([one, two].every(isUsable));
});

test('sanitize replaces runs of other characters by one underscore, per code point', () => {
  assert.equal(sanitize('a b..c'), 'a_b_c');
  assert.equal(sanitize('emoji \u{1F600}!'), 'emoji_');
  assert.equal(sanitize('\u00fc\u00f1\u00ef'), '_');
});

test('the hash is pinned (names must not change across versions)', () => {
  assert.equal(fnv1a32([]), 0x811c9dc5);
  assert.equal(fnv1a32(['files.v2', 'read file']).toString(16).padStart(8, '0'), naturalName('files.v2', 'read file').slice(-8));
  assert.equal(naturalName('files.v2', 'read file'), 'files_v2__read_file-59fe7266');
});

test('isUsable follows the contract', () => {
  assert.ok(isUsable('a'));
  assert.ok(isUsable('A-z_0'));
  assert.ok(!isUsable(''));
  assert.ok(!isUsable('x'.repeat(65)));
  assert.ok(!isUsable('a.b'));
  assert.ok(!isUsable(7));
});
