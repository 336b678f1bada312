// Settings: a JSON object over the defaults (deep-merged), every key known, every value checked.
// A server's `settings` (its configuration's JSON object) is merged over the global settings in
// the same way, so any key can be overridden per server.

/** The fault kinds of the contract, by their WIT names. */
export const FAULT_KINDS = [
  'spawn-failed',
  'handshake-failed',
  'handshake-timed-out',
  'auth-required',
  'not-mcp-endpoint',
  'process-exited',
  'transport-closed',
  'session-expired',
  'keepalive-failed',
];

/** The longest hold the contract allows. */
export const MAX_HOLD_MS = 60000;

const MAX_MS = 7 * 24 * 3600 * 1000;

/** Every setting with its default. Descriptions live in README.md. */
export const DEFAULTS = Object.freeze({
  window: Object.freeze({ ms: 600000, failures: 6 }),
  backoff: Object.freeze({
    network: Object.freeze({ base_ms: 500, cap_ms: 30000 }),
    crash: Object.freeze({ base_ms: 1000, cap_ms: 60000 }),
    handshake: Object.freeze({ base_ms: 5000, cap_ms: 90000 }),
  }),
  jitter: 0.2,
  seed: 0,
  permanent: Object.freeze(['spawn-failed', 'auth-required', 'not-mcp-endpoint']),
  park: Object.freeze({ probe_ms: 60000, probe_max_ms: 900000 }),
  breaker: Object.freeze({
    threshold: 4,
    cooldown_ms: 30000,
    cooldown_max_ms: 300000,
    probe_lease_ms: 300000,
  }),
  hold_ms: 3000,
});

// key -> checker; a nested object is a section.
const INT = (min, max) => ({ kind: 'int', min, max });
const SCHEMA = {
  window: { ms: INT(1000, MAX_MS), failures: INT(1, 1000) },
  backoff: {
    network: { base_ms: INT(1, MAX_MS), cap_ms: INT(1, MAX_MS) },
    crash: { base_ms: INT(1, MAX_MS), cap_ms: INT(1, MAX_MS) },
    handshake: { base_ms: INT(1, MAX_MS), cap_ms: INT(1, MAX_MS) },
  },
  jitter: { kind: 'fraction', max: 0.5 },
  seed: INT(0, 0xffffffff),
  permanent: { kind: 'faults' },
  park: { probe_ms: INT(1000, MAX_MS), probe_max_ms: INT(1000, MAX_MS) },
  breaker: {
    threshold: INT(1, 1000),
    cooldown_ms: INT(1, MAX_MS),
    cooldown_max_ms: INT(1, MAX_MS),
    probe_lease_ms: INT(1000, MAX_MS),
  },
  hold_ms: INT(0, MAX_HOLD_MS),
};

function isChecker(node) {
  return typeof node.kind === 'string';
}

function plain(value) {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

/** A deep, mutable copy of a settings object (arrays copied too). */
export function cloneSettings(settings) {
  return JSON.parse(JSON.stringify(settings));
}

function checkValue(checker, value, path) {
  switch (checker.kind) {
    case 'int':
      if (typeof value !== 'number' || !Number.isInteger(value)) {
        throw `setting ${path} must be a whole number, not ${JSON.stringify(value)}`;
      }
      if (value < checker.min || value > checker.max) {
        throw `setting ${path} must be between ${checker.min} and ${checker.max}, not ${value}`;
      }
      return value;
    case 'fraction':
      if (typeof value !== 'number' || !Number.isFinite(value) || value < 0 || value > checker.max) {
        throw `setting ${path} must be a number from 0 to ${checker.max}, not ${JSON.stringify(value)}`;
      }
      return value;
    case 'faults': {
      if (!Array.isArray(value)) throw `setting ${path} must be a list of fault kinds`;
      const seen = new Set();
      for (const kind of value) {
        if (!FAULT_KINDS.includes(kind)) {
          throw `setting ${path}: ${JSON.stringify(kind)} is not a fault kind (known: ${FAULT_KINDS.join(', ')})`;
        }
        if (seen.has(kind)) throw `setting ${path} names ${kind} twice`;
        seen.add(kind);
      }
      return [...value];
    }
    default:
      throw `setting ${path}: unknown checker`;
  }
}

function merge(target, overrides, schema, prefix) {
  for (const key of Object.keys(overrides)) {
    const path = prefix ? `${prefix}.${key}` : key;
    const node = Object.prototype.hasOwnProperty.call(schema, key) ? schema[key] : undefined;
    if (node === undefined) {
      const known = Object.keys(schema).join(', ');
      throw `unknown setting ${JSON.stringify(path)} (known${prefix ? ` in ${prefix}` : ''}: ${known})`;
    }
    const value = overrides[key];
    if (isChecker(node)) {
      target[key] = checkValue(node, value, path);
    } else {
      if (!plain(value)) throw `setting ${path} must be an object`;
      merge(target[key], value, node, path);
    }
  }
}

/** Cross-field rules; throws the first one broken. */
export function validate(s) {
  for (const cls of Object.keys(s.backoff)) {
    const { base_ms, cap_ms } = s.backoff[cls];
    if (base_ms > cap_ms) {
      throw `setting backoff.${cls}.base_ms (${base_ms}) must not exceed backoff.${cls}.cap_ms (${cap_ms})`;
    }
    // A server that keeps failing must fill its window, or it would retry forever without
    // parking: window.failures attempts, spaced at most cap_ms apart, must fit in window.ms.
    const span = cap_ms * (s.window.failures - 1);
    if (span >= s.window.ms) {
      throw `setting backoff.${cls}.cap_ms (${cap_ms}) times (window.failures - 1 = ${s.window.failures - 1}) must be less than window.ms (${s.window.ms}), or a server that keeps failing would never park`;
    }
  }
  if (s.park.probe_ms > s.park.probe_max_ms) {
    throw `setting park.probe_ms (${s.park.probe_ms}) must not exceed park.probe_max_ms (${s.park.probe_max_ms})`;
  }
  if (s.breaker.cooldown_ms > s.breaker.cooldown_max_ms) {
    throw `setting breaker.cooldown_ms (${s.breaker.cooldown_ms}) must not exceed breaker.cooldown_max_ms (${s.breaker.cooldown_max_ms})`;
  }
  return s;
}

/** Parses settings JSON text: "" (or whitespace) is no overrides; else a JSON object. */
export function parseObject(text, what = 'settings') {
  if (typeof text !== 'string' || text.trim() === '') return {};
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw `${what} are not valid JSON: ${e && e.message ? e.message : e}`;
  }
  if (!plain(value)) throw `${what} must be a JSON object`;
  return value;
}

/** `base` with the overrides object merged over it, validated. Throws a message. */
export function mergeSettings(base, overrides) {
  const merged = cloneSettings(base);
  merge(merged, overrides, SCHEMA, '');
  return validate(merged);
}

/** Settings from JSON text over the defaults. Throws a message. */
export function parseSettings(text) {
  return mergeSettings(DEFAULTS, parseObject(text));
}

/** A server's effective settings: its own JSON object merged over the global settings. */
export function serverSettings(global, serverJson) {
  return mergeSettings(global, parseObject(serverJson, 'the server\'s settings'));
}

/** Checks a settings object read back from a snapshot (same rules as parsing). */
export function checkSettings(value) {
  if (!plain(value)) throw 'settings are not an object';
  const rebuilt = mergeSettings(DEFAULTS, value);
  // Every key must have been present: a snapshot carries complete settings.
  if (JSON.stringify(rebuilt) !== JSON.stringify(canonical(value))) {
    throw 'settings are incomplete';
  }
  return rebuilt;
}

// The value with its keys in DEFAULTS order (for comparing complete settings).
function canonical(value, schema = DEFAULTS) {
  if (!plain(schema)) return value;
  const out = {};
  for (const key of Object.keys(schema)) {
    if (plain(value) && key in value) out[key] = canonical(value[key], schema[key]);
  }
  return out;
}
