import assert from 'node:assert/strict';
import { test } from 'node:test';

import { DEFAULTS, checkSettings, parseSettings, serverSettings } from '../src/settings.js';

test('empty text and {} are the defaults', () => {
  assert.deepEqual(parseSettings(''), DEFAULTS);
  assert.deepEqual(parseSettings('  '), DEFAULTS);
  assert.deepEqual(parseSettings('{}'), DEFAULTS);
});

test('overrides merge deeply over the defaults', () => {
  const s = parseSettings('{"breaker": {"threshold": 2}, "backoff": {"network": {"base_ms": 100}}}');
  assert.equal(s.breaker.threshold, 2);
  assert.equal(s.breaker.cooldown_ms, DEFAULTS.breaker.cooldown_ms);
  assert.equal(s.backoff.network.base_ms, 100);
  assert.equal(s.backoff.network.cap_ms, DEFAULTS.backoff.network.cap_ms);
  assert.equal(s.backoff.handshake.base_ms, DEFAULTS.backoff.handshake.base_ms);
});

test('unknown keys are refused, naming the key and the known ones', () => {
  assert.throws(() => parseSettings('{"retries": 3}'), /unknown setting "retries" \(known: window, backoff/);
  assert.throws(() => parseSettings('{"breaker": {"limit": 3}}'), /unknown setting "breaker.limit" \(known in breaker: threshold/);
  assert.throws(() => parseSettings('{"backoff": {"dns": {}}}'), /unknown setting "backoff.dns"/);
});

test('bad values are refused, naming the setting', () => {
  assert.throws(() => parseSettings('[]'), /must be a JSON object/);
  assert.throws(() => parseSettings('{'), /not valid JSON/);
  assert.throws(() => parseSettings('{"hold_ms": "2s"}'), /hold_ms must be a whole number/);
  assert.throws(() => parseSettings('{"hold_ms": 60001}'), /hold_ms must be between 0 and 60000/);
  assert.throws(() => parseSettings('{"jitter": 0.9}'), /jitter must be a number from 0 to 0.5/);
  assert.throws(() => parseSettings('{"window": 5}'), /window must be an object/);
  assert.throws(() => parseSettings('{"permanent": ["bogus"]}'), /"bogus" is not a fault kind/);
  assert.throws(() => parseSettings('{"permanent": ["spawn-failed", "spawn-failed"]}'), /twice/);
  assert.throws(() => parseSettings('{"breaker": {"threshold": 0}}'), /breaker.threshold must be between 1/);
});

test('cross-field rules: a failing server must always be able to fill its window', () => {
  assert.throws(
    () => parseSettings('{"window": {"ms": 60000, "failures": 6}}'),
    /backoff\.\w+\.cap_ms \(\d+\) times \(window.failures - 1 = 5\) must be less than window.ms \(60000\)/,
  );
  assert.throws(() => parseSettings('{"backoff": {"crash": {"base_ms": 70000}}}'), /base_ms \(70000\) must not exceed/);
  assert.throws(() => parseSettings('{"park": {"probe_ms": 1000000}}'), /park.probe_ms/);
  assert.throws(() => parseSettings('{"breaker": {"cooldown_ms": 400000}}'), /breaker.cooldown_ms/);
  // Tight but valid.
  parseSettings('{"window": {"ms": 60000, "failures": 3}, "backoff": {"network": {"cap_ms": 20000}, "crash": {"cap_ms": 20000}, "handshake": {"base_ms": 5000, "cap_ms": 29000}}}');
});

test('a server\'s settings merge over the global ones', () => {
  const global = parseSettings('{"hold_ms": 0}');
  const s = serverSettings(global, '{"breaker": {"threshold": 9}}');
  assert.equal(s.hold_ms, 0);
  assert.equal(s.breaker.threshold, 9);
  assert.deepEqual(serverSettings(global, ''), global);
  assert.throws(() => serverSettings(global, '{"nope": 1}'), /unknown setting "nope"/);
  assert.throws(() => serverSettings(global, '"x"'), /the server's settings must be a JSON object/);
});

test('complete settings read back from a snapshot; incomplete ones are refused', () => {
  const s = parseSettings('{"seed": 7}');
  assert.deepEqual(checkSettings(JSON.parse(JSON.stringify(s))), s);
  const partial = JSON.parse(JSON.stringify(s));
  delete partial.breaker.threshold;
  assert.throws(() => checkSettings(partial), /incomplete/);
});
