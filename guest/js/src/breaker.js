// A circuit breaker over one server's tool-call transport failures (timeouts and transport
// errors; tool errors are the arguments' problem and never count).
//
// closed --(threshold consecutive failures)--> open --(cooldown passes; computed at `now`)-->
// half-open --(exactly one probe)--> closed when answered, open again (cooldown doubled, up to
// cooldown_max_ms) when it fails. A probe that finds no live session is a reconnect; when that
// attempt fails the breaker opens again likewise. A claimed probe that is never reported frees
// itself after probe_lease_ms, so a lost report cannot wedge the breaker.

/** A closed breaker. */
export function closedBreaker() {
  return { open: false, failures: 0, until: 0, cooldownMs: 0, reason: null, probe: null };
}

/** 'closed', 'open' or 'half-open' at host time `now`. */
export function breakerState(b, now) {
  if (!b.open) return 'closed';
  return now >= b.until ? 'half-open' : 'open';
}

function openFor(b, now, ms, reason) {
  b.open = true;
  b.cooldownMs = ms;
  b.until = now + ms;
  b.reason = reason;
  b.probe = null;
  return { opened: ms, reason };
}

function reopen(b, now, s, reason) {
  const ms = Math.min(Math.max(b.cooldownMs * 2, s.cooldown_ms), s.cooldown_max_ms);
  return openFor(b, now, ms, reason);
}

/** A call failed in transport or timed out. Returns `{opened, reason}` when it opened. */
export function onCallFailure(b, now, callId, s) {
  if (!b.open) {
    b.failures += 1;
    if (b.failures >= s.threshold) return openFor(b, now, s.cooldown_ms, 'failures');
    return null;
  }
  if (b.probe && b.probe.kind === 'call' && b.probe.callId === callId) {
    b.failures += 1;
    return reopen(b, now, s, 'probe-failed');
  }
  // A late report of a call admitted before the breaker opened changes nothing.
  return null;
}

/** A call was answered (a result or a tool error): the transport works. Returns 'closed'. */
export function onCallAnswered(b, callId) {
  if (!b.open) {
    b.failures = 0;
    return null;
  }
  if (b.probe && b.probe.kind === 'call' && b.probe.callId === callId) {
    Object.assign(b, closedBreaker());
    return 'closed';
  }
  return null;
}

/** The agent cancelled a call: says nothing of the server; a cancelled probe frees the probe. */
export function onCallCancelled(b, callId) {
  if (b.open && b.probe && b.probe.kind === 'call' && b.probe.callId === callId) b.probe = null;
}

function claimable(b, now, s) {
  if (breakerState(b, now) !== 'half-open') return false;
  return b.probe === null || now >= b.probe.at + s.probe_lease_ms;
}

/** Claims the single half-open probe for call `callId`; false when not half-open or taken. */
export function claimCallProbe(b, now, callId, s) {
  if (!claimable(b, now, s)) return false;
  b.probe = { kind: 'call', callId, at: now };
  return true;
}

/** Claims the probe as a reconnect (no live session to call). */
export function claimReconnectProbe(b, now, s) {
  if (!claimable(b, now, s)) return false;
  b.probe = { kind: 'reconnect', callId: null, at: now };
  return true;
}

/** A connection attempt failed: when it was the probe's reconnect, the breaker opens again. */
export function onAttemptFailed(b, now, s) {
  if (b.open && b.probe && b.probe.kind === 'reconnect') return reopen(b, now, s, 'reconnect-failed');
  return null;
}
