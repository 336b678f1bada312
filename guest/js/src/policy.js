// The WIT glue (contract tether:policy@0.2.1, world policy-component): converts between the
// bindings' values and the logic's, holds the one policy instance of this component, and
// forwards the logic's log records to the host. No decisions are made here.
//
// Bindings (componentize-js): records are objects with camelCase fields, variants are
// `{ tag, val }`, enums are strings, `option<T>` is `T | undefined`, u64 is a BigInt,
// `list<u8>` a Uint8Array; a `result<_, string>` export returns for ok and throws the error
// string. The logic keeps times and tokens as numbers and u64 identifiers (tool revisions, call
// ids) as decimal strings, so its state never holds a BigInt.
//
// Host times are u64 milliseconds and may exceed 2^53. The logic is handed them relative to an
// origin (a BigInt, kept in the state as a decimal string, so snapshots carry it): 0 while the
// first time seen is below 2^52, else that time minus 2^52. The origin is added back to every
// time handed out, so any host time works exactly for the next 2^52 ms (some 142 000 years).

import { log } from 'tether:policy/log@0.2.2';

import { INFO, WindowPolicy } from './machine.js';
import { restorePolicy, snapshotBytes } from './snapshot.js';

const NOT_INITIALIZED = 'policy not initialized: the host must call init first';
const LEVELS = new Set(['trace', 'debug', 'info', 'warn', 'error']);

/** @type {WindowPolicy | null} */
let instance = null;

function flush() {
  if (!instance) return;
  for (const [level, message] of instance.takeLogs()) {
    log(LEVELS.has(level) ? level : 'info', message);
  }
}

function withInstance(fallback, f) {
  if (!instance) {
    log('error', NOT_INITIALIZED);
    return fallback;
  }
  try {
    return f(instance);
  } finally {
    flush();
  }
}

// ----- host -> logic -----

const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);
const HEADROOM = 2n ** 52n;

/** A duration in milliseconds as a number (beyond 2^53 - 1 ms it saturates). */
const ms = (value) => (value > MAX_SAFE ? Number.MAX_SAFE_INTEGER : Number(value));

/** The origin of `p`'s times, fixed by the first host time it sees. */
function origin(p, seen) {
  if (p.origin === null) p.origin = (seen < HEADROOM ? 0n : seen - HEADROOM).toString();
  return BigInt(p.origin);
}
/** A host time as the logic's number: relative to the origin, saturating at 0 and 2^53 - 1. */
function at(p, value) {
  const rel = value - origin(p, value);
  return rel < 0n ? 0 : ms(rel);
}
const optAt = (p, value) => (value === undefined ? undefined : at(p, value));
/** The logic's time as a host time. */
const hostTime = (p, value) => BigInt(value) + BigInt(p.origin ?? '0');
const optHostTime = (p, value) => (value === undefined ? undefined : hostTime(p, value));
/** Our tokens are small numbers; anything larger is not ours. */
const token = (value) => (value > BigInt(Number.MAX_SAFE_INTEGER) ? -1 : Number(value));

/** The bindings' tools with their u64 revision as a decimal string (in place: they are fresh). */
function tools(list) {
  for (let i = 0; i < list.length; i += 1) list[i].revision = list[i].revision.toString();
  return list;
}

function eventIn(p, event) {
  const { tag, val } = event.kind;
  let value = val;
  switch (tag) {
    case 'connected':
    case 'tools-changed':
      value = { ...val, tools: tools(val.tools) };
      break;
    case 'call-finished':
      value = { ...val, callId: val.callId.toString(), durationMs: ms(val.durationMs) };
      break;
    case 'timer':
      value = { server: val.server, token: token(val.token) };
      break;
    default:
      break;
  }
  return { now: at(p, event.now), kind: { tag, val: value } };
}

function handoverIn(p, h) {
  return {
    now: at(p, h.now),
    previous: h.previous,
    servers: h.servers.map((s) => ({
      ...s,
      session: s.session && { ...s.session, tools: tools(s.session.tools) },
      since: at(p, s.since),
      breakerUntil: optAt(p, s.breakerUntil),
      nextAttemptAt: optAt(p, s.nextAttemptAt),
    })),
  };
}

// ----- logic -> host -----

function actionOut(p, action) {
  if (action.tag === 'wake-at') {
    const { server, at: when, token: t } = action.val;
    return { tag: 'wake-at', val: { server, at: hostTime(p, when), token: BigInt(t) } };
  }
  return action;
}

function admissionOut(admission) {
  if (admission.tag === 'hold') {
    return { tag: 'hold', val: { waitMs: BigInt(admission.val.waitMs), message: admission.val.message } };
  }
  return admission;
}

function statusOut(p, s) {
  return {
    ...s,
    since: hostTime(p, s.since),
    nextAttemptAt: optHostTime(p, s.nextAttemptAt),
    breakerUntil: optHostTime(p, s.breakerUntil),
  };
}

// ----- the export -----

export const policy = {
  info() {
    return { name: INFO.name, version: INFO.version };
  },

  init(settings) {
    instance = WindowPolicy.create(settings); // throws the error string
    log('info', `${INFO.name} ${INFO.version} started`);
  },

  setSettings(settings) {
    if (!instance) throw NOT_INITIALIZED;
    try {
      instance.setSettings(settings);
    } finally {
      flush();
    }
  },

  handle(event) {
    return withInstance([], (p) => p.handle(eventIn(p, event)).map((a) => actionOut(p, a)));
  },

  admit(request) {
    return withInstance({ tag: 'reject', val: `The gateway's policy is not ready (server ${JSON.stringify(request.server)}); the call was not sent.` }, (p) =>
      admissionOut(
        p.admit({
          now: at(p, request.now),
          callId: request.callId.toString(),
          server: request.server,
          tool: request.tool,
        }),
      ),
    );
  },

  status(now) {
    return withInstance([], (p) => p.status(at(p, now)).map((s) => statusOut(p, s)));
  },

  snapshot() {
    return withInstance(new Uint8Array(0), (p) => snapshotBytes(p));
  },

  restore(bytes) {
    const restored = restorePolicy(bytes); // throws the error string; nothing changes then
    instance = restored;
    log('info', `${INFO.name} ${INFO.version} restored from a snapshot`);
  },

  takeOver(handover) {
    if (!instance) throw NOT_INITIALIZED;
    try {
      const p = instance;
      return p.takeOver(handoverIn(p, handover)).map((a) => actionOut(p, a));
    } finally {
      flush();
    }
  },

  setNaming(naming) {
    withInstance(undefined, (p) => p.setNaming(naming.server, naming.prefix ?? null));
  },

  namePrompts(server, originals) {
    return withInstance([], (p) => p.namePrompts(server, originals));
  },
};
