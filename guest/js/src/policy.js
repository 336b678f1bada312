// The WIT glue (contract tether:policy@0.2.0, world policy-component): converts between the
// bindings' values and the logic's, holds the one policy instance of this component, and
// forwards the logic's log records to the host. No decisions are made here.
//
// Bindings (componentize-js): records are objects with camelCase fields, variants are
// `{ tag, val }`, enums are strings, `option<T>` is `T | undefined`, u64 is a BigInt,
// `list<u8>` a Uint8Array; a `result<_, string>` export returns for ok and throws the error
// string. The logic keeps times and tokens as numbers and u64 identifiers (tool revisions, call
// ids) as decimal strings, so its state never holds a BigInt.

import { log } from 'tether:policy/log@0.2.0';

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

/** Host milliseconds as a number (beyond 2^53 - 1 ms, some 285 000 years, it saturates). */
const ms = (value) => (value > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(value));
const optMs = (value) => (value === undefined ? undefined : ms(value));
/** Our tokens are small numbers; anything larger is not ours. */
const token = (value) => (value > BigInt(Number.MAX_SAFE_INTEGER) ? -1 : Number(value));

/** The bindings' tools with their u64 revision as a decimal string (in place: they are fresh). */
function tools(list) {
  for (let i = 0; i < list.length; i += 1) list[i].revision = list[i].revision.toString();
  return list;
}

function eventIn(event) {
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
  return { now: ms(event.now), kind: { tag, val: value } };
}

function handoverIn(h) {
  return {
    now: ms(h.now),
    previous: h.previous,
    servers: h.servers.map((s) => ({
      ...s,
      session: s.session && { ...s.session, tools: tools(s.session.tools) },
      since: ms(s.since),
      breakerUntil: optMs(s.breakerUntil),
      nextAttemptAt: optMs(s.nextAttemptAt),
    })),
  };
}

// ----- logic -> host -----

function actionOut(action) {
  if (action.tag === 'wake-at') {
    const { server, at, token: t } = action.val;
    return { tag: 'wake-at', val: { server, at: BigInt(at), token: BigInt(t) } };
  }
  return action;
}

function admissionOut(admission) {
  if (admission.tag === 'hold') {
    return { tag: 'hold', val: { waitMs: BigInt(admission.val.waitMs), message: admission.val.message } };
  }
  return admission;
}

const optBig = (value) => (value === undefined ? undefined : BigInt(value));

function statusOut(s) {
  return {
    ...s,
    since: BigInt(s.since),
    nextAttemptAt: optBig(s.nextAttemptAt),
    breakerUntil: optBig(s.breakerUntil),
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
    return withInstance([], (p) => p.handle(eventIn(event)).map(actionOut));
  },

  admit(request) {
    return withInstance({ tag: 'reject', val: `The gateway's policy is not ready (server ${JSON.stringify(request.server)}); the call was not sent.` }, (p) =>
      admissionOut(
        p.admit({
          now: ms(request.now),
          callId: request.callId.toString(),
          server: request.server,
          tool: request.tool,
        }),
      ),
    );
  },

  status(now) {
    return withInstance([], (p) => p.status(ms(now)).map(statusOut));
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
      return instance.takeOver(handoverIn(handover)).map(actionOut);
    } finally {
      flush();
    }
  },
};
