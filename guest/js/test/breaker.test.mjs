import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  breakerState,
  claimCallProbe,
  claimReconnectProbe,
  closedBreaker,
  onAttemptFailed,
  onCallAnswered,
  onCallCancelled,
  onCallFailure,
} from '../src/breaker.js';

const S = { threshold: 3, cooldown_ms: 1000, cooldown_max_ms: 3000, probe_lease_ms: 5000 };

function opened(now = 0) {
  const b = closedBreaker();
  for (let i = 1; i <= S.threshold; i += 1) onCallFailure(b, now, String(i), S);
  return b;
}

test('opens after threshold consecutive failures; an answer resets the count', () => {
  const b = closedBreaker();
  assert.equal(onCallFailure(b, 0, '1', S), null);
  assert.equal(onCallFailure(b, 0, '2', S), null);
  onCallAnswered(b, '3');
  assert.equal(b.failures, 0);
  onCallFailure(b, 0, '4', S);
  onCallFailure(b, 0, '5', S);
  assert.deepEqual(onCallFailure(b, 10, '6', S), { opened: 1000, reason: 'failures' });
  assert.equal(breakerState(b, 10), 'open');
  assert.equal(breakerState(b, 1009), 'open');
  assert.equal(breakerState(b, 1010), 'half-open');
});

test('exactly one probe; its answer closes the breaker', () => {
  const b = opened();
  assert.ok(!claimCallProbe(b, 999, 'p', S), 'no probe while open');
  assert.ok(claimCallProbe(b, 1000, 'p', S));
  assert.ok(!claimCallProbe(b, 1000, 'q', S));
  assert.equal(onCallAnswered(b, 'q'), null, 'a late answer of another call changes nothing');
  assert.equal(onCallAnswered(b, 'p'), 'closed');
  assert.equal(breakerState(b, 1000), 'closed');
  assert.deepEqual(b, closedBreaker());
});

test('a failed probe reopens with a doubled cooldown, up to the maximum', () => {
  const b = opened();
  claimCallProbe(b, 1000, 'p', S);
  assert.deepEqual(onCallFailure(b, 1000, 'p', S), { opened: 2000, reason: 'probe-failed' });
  claimCallProbe(b, 3000, 'q', S);
  assert.deepEqual(onCallFailure(b, 3000, 'q', S), { opened: 3000, reason: 'probe-failed' });
  assert.equal(b.until, 6000);
});

test('late failures of calls admitted before the breaker opened change nothing', () => {
  const b = opened();
  const before = structuredClone(b);
  assert.equal(onCallFailure(b, 5, 'old', S), null);
  assert.deepEqual(b, before);
});

test('a cancelled probe frees the probe; a lost one frees itself after the lease', () => {
  const b = opened();
  claimCallProbe(b, 1000, 'p', S);
  onCallCancelled(b, 'p');
  assert.ok(claimCallProbe(b, 1000, 'q', S));
  assert.ok(!claimCallProbe(b, 5999, 'r', S));
  assert.ok(claimCallProbe(b, 6000, 'r', S));
});

test('a reconnect probe whose attempt fails reopens the breaker', () => {
  const b = opened();
  assert.ok(claimReconnectProbe(b, 1000, S));
  assert.ok(!claimCallProbe(b, 1000, 'p', S));
  assert.deepEqual(onAttemptFailed(b, 1200, S), { opened: 2000, reason: 'reconnect-failed' });
  assert.equal(onAttemptFailed(b, 1300, S), null, 'only the probe\'s attempt counts');
});
