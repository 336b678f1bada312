import assert from 'node:assert/strict';
import { test } from 'node:test';

import { compileFilters, compileGlob } from '../src/glob.js';

const matches = (pattern, name) => compileGlob(pattern)(name);

test('wildcards, classes, alternatives and escapes', () => {
  assert.ok(matches('read_*', 'read_file'));
  assert.ok(matches('read_*', 'read_'));
  assert.ok(!matches('read_*', 'write_file'));
  assert.ok(matches('a?c', 'abc'));
  assert.ok(!matches('a?c', 'ac'));
  assert.ok(matches('[a-c]x', 'bx'));
  assert.ok(!matches('[!a-c]x', 'bx'));
  assert.ok(matches('[^a-c]x', 'dx'));
  assert.ok(matches('{get,list}_*', 'list_items'));
  assert.ok(matches('{a,b{c,d}}', 'bd'));
  assert.ok(matches('x\\*', 'x*'));
  assert.ok(!matches('x\\*', 'xy'));
  assert.ok(matches('[]]', ']'));
  assert.ok(matches('[a-]', '-'));
});

test('regular expression characters are literal', () => {
  assert.ok(matches('a.b', 'a.b'));
  assert.ok(!matches('a.b', 'axb'));
  assert.ok(matches('(x)+$', '(x)+$'));
  assert.ok(matches('tool|other', 'tool|other'));
  assert.ok(!matches('tool|other', 'tool'));
});

test('a pattern matches the whole name, any characters', () => {
  assert.ok(!matches('read', 'read_file'));
  assert.ok(matches('*', ''));
  assert.ok(matches('\u00e9*', '\u00e9t\u00e9'));
  assert.ok(matches('?', '\u{1F600}'));
});

test('invalid patterns are errors that name them', () => {
  for (const [pattern, why] of [
    ['[abc', 'never closed'],
    ['{a', 'never closed'],
    ['x\\', 'backslash'],
    ['[z-a]', 'reversed'],
  ]) {
    assert.throws(() => compileGlob(pattern), (e) => e.includes(JSON.stringify(pattern)) && e.includes(why));
  }
  assert.throws(() => compileFilters(['ok'], ['[bad']), /^exclude: invalid pattern/);
});

test('include limits, exclude always wins, nothing to filter is null', () => {
  const f = compileFilters(['read_*', 'list'], ['read_secret*']);
  assert.ok(f('read_file'));
  assert.ok(f('list'));
  assert.ok(!f('write_file'));
  assert.ok(!f('read_secret_key'));
  const onlyExclude = compileFilters([], ['delete*']);
  assert.ok(onlyExclude('anything'));
  assert.ok(!onlyExclude('delete_all'));
  assert.equal(compileFilters([], []), null);
});
