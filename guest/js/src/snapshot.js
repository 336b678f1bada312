// Snapshots: all state as JSON text in UTF-8, read back with every field checked.
//
// The state is kept in plain objects whose keys are always created in the same order (what is
// derived from it, settings per server, filters and the name table, is not enumerable or lives
// apart and is rebuilt), so `JSON.stringify` of the state itself is the snapshot: the same state
// always gives the same bytes, and the engine's native JSON code does the work (this runs in an
// interpreter, where a field-by-field copy of a large tool list costs more than the rest of a
// decision). Nothing in the state is a BigInt: times are numbers, tool revisions and call ids
// decimal strings.

import { derive, NONE, WindowPolicy } from './machine.js';
import { checkSettings, FAULT_KINDS } from './settings.js';

export const SNAPSHOT_FORMAT = 'tether-window-policy';
export const SNAPSHOT_VERSION = 1;

const STATES = ['connecting', 'connected', 'healthy', 'backing-off', 'parked', 'stopped'];
const TRANSPORTS = ['stdio', 'streamable-http', 'sse'];
const REASONS = [null, 'failures', 'probe-failed', 'reconnect-failed'];
const SUMMARY_TAGS = [...FAULT_KINDS, 'call-timeout'];

/** The policy's whole state as JSON text. */
export function snapshotText(policy) {
  return JSON.stringify({
    format: SNAPSHOT_FORMAT,
    version: SNAPSHOT_VERSION,
    settings: policy.settings,
    origin: policy.origin,
    now: policy.now,
    nextToken: policy.nextToken,
    servers: policy.sortedServers(),
    // [[server, prefix]...], by server: the same namings always give the same bytes.
    namings: [...policy.namings.keys()].sort().map((server) => [server, policy.namings.get(server)]),
  });
}

/** The policy's whole state as UTF-8 bytes. */
export function snapshotBytes(policy) {
  return new TextEncoder().encode(snapshotText(policy));
}

// ----- reading -----

function damaged(where, what) {
  throw `snapshot is damaged: ${where} ${what}`;
}

const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
const isCount = (v) => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;

function object(v, where) {
  if (!isObject(v)) damaged(where, 'is not an object');
  return v;
}
function string(v, where) {
  if (typeof v !== 'string') damaged(where, 'is not a string');
  return v;
}
function count(v, where) {
  if (!isCount(v)) damaged(where, 'is not a whole number');
  return v;
}
function flag(v, where) {
  if (typeof v !== 'boolean') damaged(where, 'is not true or false');
  return v;
}
function oneOf(v, allowed, where) {
  if (!allowed.includes(v)) damaged(where, `is not one of ${allowed.join(', ')}`);
  return v;
}
function strings(v, where) {
  if (!Array.isArray(v)) damaged(where, 'is not a list');
  for (let i = 0; i < v.length; i += 1) if (typeof v[i] !== 'string') damaged(`${where}[${i}]`, 'is not a string');
  return [...v];
}

/** A session's tools, checked in one loop (a list may be long). */
function tools(v, where) {
  if (!Array.isArray(v)) damaged(where, 'is not a list');
  const out = new Array(v.length);
  for (let i = 0; i < v.length; i += 1) {
    const t = v[i];
    if (!isObject(t) || typeof t.name !== 'string' || typeof t.readOnly !== 'boolean' || typeof t.revision !== 'string') {
      damaged(`${where}[${i}]`, 'is not a tool');
    }
    out[i] = { name: t.name, readOnly: t.readOnly, revision: t.revision };
  }
  return out;
}

function published(v, where) {
  if (!Array.isArray(v)) damaged(where, 'is not a list');
  const out = new Array(v.length);
  for (let i = 0; i < v.length; i += 1) {
    const t = v[i];
    if (
      !isObject(t) ||
      typeof t.advertised !== 'string' ||
      typeof t.original !== 'string' ||
      typeof t.readOnly !== 'boolean' ||
      typeof t.revision !== 'string'
    ) {
      damaged(`${where}[${i}]`, 'is not a published tool');
    }
    out[i] = { advertised: t.advertised, original: t.original, readOnly: t.readOnly, revision: t.revision };
  }
  return out;
}

function nullable(v, read, where) {
  return v === null ? null : read(v, where);
}

function readBreaker(v, where) {
  object(v, where);
  return {
    open: flag(v.open, `${where}.open`),
    failures: count(v.failures, `${where}.failures`),
    until: count(v.until, `${where}.until`),
    cooldownMs: count(v.cooldownMs, `${where}.cooldownMs`),
    reason: oneOf(v.reason, REASONS, `${where}.reason`),
    probe: nullable(
      v.probe,
      (q, w) => {
        object(q, w);
        const kind = oneOf(q.kind, ['call', 'reconnect'], `${w}.kind`);
        const callId = kind === 'call' ? string(q.callId, `${w}.callId`) : q.callId;
        if (kind === 'reconnect' && callId !== null) damaged(`${w}.callId`, 'must be null');
        return { kind, callId, at: count(q.at, `${w}.at`) };
      },
      `${where}.probe`,
    ),
  };
}

function readServer(v, where) {
  object(v, where);
  const c = object(v.config, `${where}.config`);
  const name = string(v.name, `${where}.name`);
  const config = {
    name: string(c.name, `${where}.config.name`),
    transport: oneOf(c.transport, TRANSPORTS, `${where}.config.transport`),
    include: strings(c.include, `${where}.config.include`),
    exclude: strings(c.exclude, `${where}.config.exclude`),
    settings: string(c.settings, `${where}.config.settings`),
  };
  if (config.name !== name) damaged(where, 'is filed under another name than its configuration');
  const window = v.window;
  if (!Array.isArray(window) || !window.every(isCount)) damaged(`${where}.window`, 'is not a list of times');
  return {
    name,
    config,
    configError: nullable(v.configError, string, `${where}.configError`),
    state: oneOf(v.state, STATES, `${where}.state`),
    since: count(v.since, `${where}.since`),
    session: nullable(
      v.session,
      (q, w) => {
        object(q, w);
        return { info: string(q.info, `${w}.info`), tools: tools(q.tools, `${w}.tools`), proven: flag(q.proven, `${w}.proven`) };
      },
      `${where}.session`,
    ),
    failures: count(v.failures, `${where}.failures`),
    window: [...window],
    reviving: flag(v.reviving, `${where}.reviving`),
    lastFault: nullable(v.lastFault, string, `${where}.lastFault`),
    lastSummary: nullable(
      v.lastSummary,
      (q, w) => {
        object(q, w);
        const code = q.code;
        if (code !== null && !(Number.isInteger(code) && Math.abs(code) <= 2 ** 31)) damaged(`${w}.code`, 'is not a code');
        return { tag: oneOf(q.tag, SUMMARY_TAGS, `${w}.tag`), code };
      },
      `${where}.lastSummary`,
    ),
    parkReason: nullable(v.parkReason, string, `${where}.parkReason`),
    parks: count(v.parks, `${where}.parks`),
    probeMs: count(v.probeMs, `${where}.probeMs`),
    wake: nullable(
      v.wake,
      (q, w) => {
        object(q, w);
        return { at: count(q.at, `${w}.at`), token: count(q.token, `${w}.token`) };
      },
      `${where}.wake`,
    ),
    toolErrors: count(v.toolErrors, `${where}.toolErrors`),
    breaker: readBreaker(v.breaker, `${where}.breaker`),
    published: published(v.published, `${where}.published`),
    // A snapshot of a build before contract 0.2.1 has none: its names were the default ones.
    namedBy: v.namedBy === undefined ? null : nullable(v.namedBy, string, `${where}.namedBy`),
  };
}

/** The operators' namings: [[server, prefix]...], each server once. */
function namings(v, where) {
  if (!Array.isArray(v)) damaged(where, 'is not a list');
  const out = new Map();
  for (let i = 0; i < v.length; i += 1) {
    const pair = v[i];
    if (!Array.isArray(pair) || pair.length !== 2 || typeof pair[0] !== 'string' || typeof pair[1] !== 'string') {
      damaged(`${where}[${i}]`, 'is not a [server, prefix] pair');
    }
    if (out.has(pair[0])) damaged(`${where}[${i}]`, `names server ${JSON.stringify(pair[0])} twice`);
    out.set(pair[0], pair[1]);
  }
  return out;
}

/** A policy continuing exactly where the snapshotted one was. Throws a message. */
export function restorePolicy(bytes) {
  let value;
  try {
    value = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes));
  } catch (e) {
    throw `snapshot is not UTF-8 JSON text: ${e && e.message ? e.message : e}`;
  }
  if (!isObject(value)) throw 'snapshot is not a JSON object; it was not taken by this policy';
  if (value.format !== SNAPSHOT_FORMAT) {
    throw `snapshot is of format ${JSON.stringify(value.format ?? null)}, not ${JSON.stringify(SNAPSHOT_FORMAT)}`;
  }
  if (value.version !== SNAPSHOT_VERSION) {
    throw `snapshot version ${JSON.stringify(value.version ?? null)} is not supported (this policy reads version ${SNAPSHOT_VERSION})`;
  }
  let settings;
  try {
    settings = checkSettings(value.settings);
  } catch (why) {
    throw `snapshot is damaged: ${why}`;
  }
  const policy = new WindowPolicy(settings);
  // A snapshot without an origin counted from host time 0.
  const origin = value.origin === undefined ? '0' : value.origin;
  if (origin !== null && (typeof origin !== 'string' || !/^(0|[1-9][0-9]{0,19})$/.test(origin) || BigInt(origin) >= 2n ** 64n)) {
    damaged('origin', 'is not a host time');
  }
  policy.origin = origin;
  policy.now = count(value.now, 'now');
  policy.nextToken = count(value.nextToken, 'nextToken');
  // A snapshot of a build before contract 0.2.1 has no namings: every server by default.
  policy.namings = value.namings === undefined ? new Map() : namings(value.namings, 'namings');
  if (!Array.isArray(value.servers)) damaged('servers', 'is not a list');
  for (let i = 0; i < value.servers.length; i += 1) {
    const s = readServer(value.servers[i], `servers[${i}]`);
    if (policy.servers.has(s.name)) damaged(`server ${JSON.stringify(s.name)}`, 'appears twice');
    if (s.configError !== null) {
      // As the running instance keeps a misconfigured server: the global settings, nothing passes.
      derive(s, settings, NONE);
    } else {
      try {
        const checked = policy.check(s.config);
        derive(s, checked.settings, checked.filter);
      } catch (why) {
        damaged(`server ${JSON.stringify(s.name)}`, `has an invalid configuration: ${why}`);
      }
    }
    for (let k = 0; k < s.published.length; k += 1) {
      const advertised = s.published[k].advertised;
      if (policy.owners.has(advertised)) damaged(`server ${JSON.stringify(s.name)}`, `publishes ${advertised} twice`);
      policy.owners.set(advertised, s.name);
    }
    policy.servers.set(s.name, s);
  }
  return policy;
}
