// Delays: per-fault-class exponential backoff and the parked server's slow self-probe, both
// with a deterministic jitter (a hash of the seed, the server and the attempt; no randomness),
// so that servers failing together do not retry in lockstep, and a replay decides the same.

import { fnv1a32 } from './names.js';

/** A number in [0, 1) from the seed, the server and what is being timed. */
export function unit(seed, server, what, n) {
  return fnv1a32([String(seed), server, what, String(n)]) / 4294967296;
}

/** Shortens `ms` by up to `jitter` (a fraction) of itself; whole milliseconds, at least 1. */
export function jittered(ms, jitter, u) {
  return Math.max(1, ms - Math.floor(ms * jitter * u));
}

/**
 * The wait before attempt `failures + 1` after a fault of backoff class `cls`: the class's
 * base doubled per consecutive failure, capped, jittered.
 */
export function retryDelay(settings, cls, failures, server) {
  const { base_ms, cap_ms } = settings.backoff[cls];
  const exponent = Math.min(Math.max(failures - 1, 0), 40);
  const raw = Math.min(cap_ms, base_ms * 2 ** exponent);
  return jittered(raw, settings.jitter, unit(settings.seed, server, cls, failures));
}

/** The wait before the next self-probe of a parked server whose probe interval is `probeMs`. */
export function probeDelay(settings, probeMs, server, parks) {
  return jittered(probeMs, settings.jitter, unit(settings.seed, server, 'probe', parks));
}
