// The interpreter of the conformance scenarios (docs/CONFORMANCE.md): steps, predicates and
// transcripts. It drives "instances" given by a factory: objects with the methods
//   init(settings: string), handle(event) -> actions, admit(request) -> admission,
//   status(now: bigint) -> statuses, snapshot() -> Uint8Array, restore(bytes),
//   takeOver(handover) -> actions,
// and for contract 0.2.1 setNaming(naming), namePrompts(server, originals) -> named prompts
// (with `naming: true`, or just both methods), taking and returning JSON values
// (wit-json.mjs), throwing on any trap, refusal or error. A PolicyHost (policy-host.mjs) is
// such an instance. No dependencies.

import { T, normalize, stringify } from './wit-json.mjs';

/** A scenario failed: `message` says why (without the step prefix). */
export class ScenarioFailure extends Error {}

/**
 * The scenario file itself is wrong (a step or predicate that is not one of docs/CONFORMANCE.md's,
 * a value not of its WIT type): not the policy's failure; conformance.mjs exits 2.
 */
export class ScenarioMalformed extends Error {}

const fail = (message) => {
  throw new ScenarioFailure(message);
};
const malformed = (message) => {
  throw new ScenarioMalformed(message);
};

/** A value of a WIT type given by the scenario; one that is not is a malformed scenario. */
function given(type, value, what) {
  try {
    return normalize(type, value, what);
  } catch (e) {
    throw new ScenarioMalformed(`malformed ${what} ${safeText(value)}: ${e?.message ?? e}`);
  }
}

const USABLE_NAME = /^[A-Za-z0-9_-]{1,64}$/;

const toBig = (v, what) => {
  if (typeof v === 'bigint') return v;
  if (typeof v === 'number' && Number.isSafeInteger(v)) return BigInt(v);
  throw new ScenarioMalformed(`malformed step: ${what} must be an integer, got ${safeText(v)}`);
};

const need = (step, key, check, what) => {
  if (!Object.prototype.hasOwnProperty.call(step, key) || !check(step[key])) {
    throw new ScenarioMalformed(`malformed step ${safeText(step)}: "${key}" must be ${what}`);
  }
  return step[key];
};
const isString = (v) => typeof v === 'string';
const isInt = (v) => typeof v === 'bigint' || (typeof v === 'number' && Number.isSafeInteger(v));
/** `[[ORIGINAL, ADVERTISED]...]`. */
const isPairs = (v) => Array.isArray(v) && v.every((p) => Array.isArray(p) && p.length === 2 && p.every(isString));

/**
 * Whether an instance takes the operator's naming (contract 0.2.1: `set-naming`,
 * `name-prompts`): a PolicyHost says so; a stand-in by having both methods.
 */
export function speaksNaming(instance) {
  if (typeof instance?.naming === 'boolean') return instance.naming;
  return typeof instance?.setNaming === 'function' && typeof instance?.namePrompts === 'function';
}

/**
 * Whether a scenario of this `since` applies to the instance's component: what 0.2.1 added
 * needs its functions; a version this host does not know is not implemented (as Tether's host
 * decides it).
 */
export function implementsSince(instance, since) {
  if (since === null || since === undefined) return true;
  return since === '0.2.1' && speaksNaming(instance);
}

function safeText(v) {
  try {
    const s = stringify(v);
    return s.length > 120 ? s.slice(0, 117) + '...' : s;
  } catch {
    return String(v);
  }
}

// ---------------------------------------------------------------------------------------------
// Predicates

function publications(actions, server) {
  return (actions ?? []).filter((a) => a.tag === 'publish-tools' && a.val.server === server).map((a) => a.val);
}
const lastPublication = (actions, server) => publications(actions, server).at(-1);
const hasAction = (actions, tag, server) => (actions ?? []).some((a) => a.tag === tag && a.val === server);

/** Exactly these [original, advertised] pairs, in any order, none twice (as sets, as Tether compares them). */
function samePairs(got, wanted) {
  const key = ([original, advertised]) => JSON.stringify([original, advertised]);
  const have = new Set(got.map(key));
  const want = new Set(wanted.map(key));
  return have.size === got.length && have.size === want.size && [...want].every((k) => have.has(k));
}

/**
 * Whether `predicate` holds in `state` ({actions, wakes, now, admission, status, promptNames,
 * published, redundant, ledger}).
 * Throws a ScenarioFailure for a malformed predicate and for `state` naming a server `status` lacks.
 */
export function holds(predicate, state) {
  if (typeof predicate !== 'object' || predicate === null || Array.isArray(predicate)) {
    malformed(`malformed predicate ${safeText(predicate)}`);
  }
  const keys = Object.keys(predicate);
  if (keys.length !== 1) malformed(`malformed predicate ${safeText(predicate)}: it must have exactly one key`);
  const [key] = keys;
  const arg = predicate[key];
  const server = () => {
    if (typeof arg !== 'string') malformed(`malformed predicate ${safeText(predicate)}: expected a server name`);
    return arg;
  };
  const field = (name, check, what) => {
    if (typeof arg !== 'object' || arg === null || !check(arg[name])) {
      malformed(`malformed predicate ${safeText(predicate)}: "${name}" must be ${what}`);
    }
    return arg[name];
  };
  switch (key) {
    case 'connects':
      return hasAction(state.actions, 'connect', server());
    case 'disconnects':
      return hasAction(state.actions, 'disconnect', server());
    case 'withdraws': {
      const s = field('server', isString, 'a string');
      const times = toBig(field('times', isInt, 'an integer'), 'times');
      const count = (state.actions ?? []).filter((a) => a.tag === 'withdraw-tools' && a.val === s).length;
      return BigInt(count) === times;
    }
    case 'publishes':
      return publications(state.actions, server()).length > 0;
    case 'publishes-originals': {
      const s = field('server', isString, 'a string');
      const originals = field('originals', (v) => Array.isArray(v) && v.every(isString), 'a list of strings');
      const p = lastPublication(state.actions, s);
      if (!p) return false;
      // Exactly these names as a set, and no original published twice (as Tether's host).
      const got = new Set(p.tools.map((t) => t.original));
      const want = new Set(originals);
      return got.size === p.tools.length && got.size === want.size && [...want].every((o) => got.has(o));
    }
    case 'publishes-usable-names': {
      const p = lastPublication(state.actions, server());
      if (!p) return false;
      const names = p.tools.map((t) => t.advertised);
      return names.every((n) => USABLE_NAME.test(n)) && new Set(names).size === names.length;
    }
    case 'publishes-advertised': {
      const s = field('server', isString, 'a string');
      const names = field('names', isPairs, 'a list of [original, advertised] pairs');
      const p = lastPublication(state.actions, s);
      if (!p) return false;
      return samePairs(p.tools.map((t) => [t.original, t.advertised]), names);
    }
    case 'names-prompts':
      if (!isPairs(arg)) malformed(`malformed predicate ${safeText(predicate)}: expected a list of [original, advertised] pairs`);
      // Nothing named yet is the empty list (as in Tether's host).
      return samePairs((state.promptNames ?? []).map((n) => [n.original, n.advertised]), arg);
    case 'timer-armed':
      return state.wakes.has(server());
    case 'timer-not-in-the-past': {
      const w = state.wakes.get(server());
      return w !== undefined && w.at >= state.now;
    }
    case 'admission':
      if (typeof arg !== 'string') malformed(`malformed predicate ${safeText(predicate)}: expected a case name`);
      return state.admission != null && state.admission.tag === arg;
    case 'refused-naming': {
      const s = server();
      const a = state.admission;
      if (a == null) return false;
      if (a.tag === 'reject' || a.tag === 'reconnect') return a.val.includes(s);
      if (a.tag === 'hold') return a.val.message.includes(s);
      return false;
    }
    case 'lists':
      return (state.status ?? []).some((st) => st.server === server());
    case 'published':
      return (state.published ?? new Map()).has(server());
    case 'redundant':
      return (state.redundant ?? new Set()).has(server());
    case 'attempting':
      return state.ledger?.isConnecting(server()) ?? false;
    case 'state': {
      const s = field('server', isString, 'a string');
      const states = field('in', (v) => Array.isArray(v) && v.every(isString), 'a list of states');
      const entry = (state.status ?? []).find((st) => st.server === s);
      if (!entry) fail(`status() does not list ${s}`);
      return states.includes(entry.state);
    }
    case 'not':
      return !holds(arg, state);
    default:
      return malformed(`unknown predicate "${key}"`);
  }
}

// ---------------------------------------------------------------------------------------------
// Describing calls (for failure messages, worded as Tether's host words them)

/** A fault in words, as Tether's host says it. */
export function describeFault(fault) {
  const v = fault?.val;
  switch (fault?.tag) {
    case 'spawn-failed':
      return `could not start the server process: ${v}`;
    case 'handshake-failed':
      return `MCP handshake failed: ${v}`;
    case 'handshake-timed-out':
      return 'MCP handshake timed out';
    case 'auth-required':
      return `the server requires authorization (HTTP ${v})`;
    case 'not-mcp-endpoint':
      return `not an MCP endpoint: ${v}`;
    case 'process-exited':
      return v === null || v === undefined
        ? 'the server process was killed by a signal'
        : `the server process exited with code ${v}`;
    case 'transport-closed':
      return `the connection closed: ${v}`;
    case 'session-expired':
      return 'the server no longer knows the session';
    case 'keepalive-failed':
      return `keepalive failed: ${v}`;
    default:
      return safeText(fault);
  }
}

const SOURCE_NAMES = { operator: 'Operator', agent: 'Agent', probe: 'Probe' };

/** An event kind in words (the description of a `handle` call). */
export function describeEvent(kind) {
  const v = kind?.val;
  switch (kind?.tag) {
    case 'server-configured':
      return `configure ${v.name}`;
    case 'server-removed':
      return `remove ${v}`;
    case 'connected':
      return `${v.server} connected`;
    case 'connect-failed':
      return `${v.server} failed to connect (${describeFault(v.fault)})`;
    case 'disconnected':
      return `${v.server} disconnected (${describeFault(v.fault)})`;
    case 'tools-changed':
      return `${v.server} changed its tools`;
    case 'keepalive-ok':
      return `${v} answered a keepalive`;
    case 'keepalive-failed':
      return `${v.server} keepalive failed`;
    case 'call-finished':
      return `call ${v['call-id']} on ${v.server} finished: ${safeText(v.outcome)}`;
    case 'timer':
      return `timer for ${v.server}`;
    case 'reconnect-requested':
      return `reconnect ${v.server} requested by ${SOURCE_NAMES[v.source] ?? v.source}`;
    case 'shutdown':
      return 'shutdown';
    default:
      return `event ${safeText(kind)}`;
  }
}

// ---------------------------------------------------------------------------------------------
// What the host knows of its servers

/** Most actions one answer may hold (as Tether's host). */
export const MAX_ACTIONS = 10000;
/** The longest a policy may hold a call (host/src/policy/outputs.rs). */
export const MAX_HOLD_MS = 60000n;
/** The longest message for the model a policy may produce, in UTF-8 bytes. */
export const MAX_MESSAGE = 4096;

/** Rust's `char::is_whitespace` (what `str::trim` removes). */
const RUST_SPACE = /^[\t\n\v\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*$/;

/** The first 80 characters (code points), as Tether's host shortens what it quotes. */
const clip80 = (text) => [...text].slice(0, 80).join('');

/** A string as Rust's `{:?}` prints it (close enough: control characters as `\u{..}`). */
export function rustDebug(text) {
  let out = '"';
  for (const ch of text) {
    const c = ch.codePointAt(0);
    if (ch === '"') out += '\\"';
    else if (ch === '\\') out += '\\\\';
    else if (ch === '\n') out += '\\n';
    else if (ch === '\r') out += '\\r';
    else if (ch === '\t') out += '\\t';
    else if (c === 0) out += '\\0';
    else if (c < 0x20 || (c >= 0x7f && c < 0xa0)) out += `\\u{${c.toString(16)}}`;
    else out += ch;
  }
  return out + '"';
}

/** Why the host refuses an admission (host/src/policy/outputs.rs `check_admission`), or null. */
export function invalidAdmission(admission) {
  const v = admission?.val;
  if (admission?.tag === 'hold' && BigInt(v['wait-ms']) > MAX_HOLD_MS) {
    return `held a call for ${v['wait-ms']} ms (limit ${MAX_HOLD_MS})`;
  }
  let message;
  if (admission?.tag === 'reject' || admission?.tag === 'reconnect') message = v;
  else if (admission?.tag === 'hold') message = v.message;
  else return null;
  if (RUST_SPACE.test(message)) return 'a refusal without a message for the model';
  const bytes = Buffer.byteLength(message, 'utf8');
  if (bytes > MAX_MESSAGE) return `a refusal message of ${bytes} bytes (limit ${MAX_MESSAGE})`;
  return null;
}

/**
 * Why the host refuses `name-prompts`'s answer (outputs.rs `check_prompt_names`), or null: an
 * unusable advertised name, an original it was not asked about or named twice, or two prompts
 * under one name.
 */
export function invalidPromptNames(originals, named) {
  const asked = new Set(originals);
  const advertised = new Set();
  const seen = new Set();
  for (const { advertised: name, original } of named) {
    if (!USABLE_NAME.test(name)) return `named a prompt with an unusable name ${rustDebug(clip80(name))}`;
    if (!asked.has(original)) return `named a prompt it was not asked about: ${rustDebug(clip80(original))}`;
    if (seen.has(original)) return `named prompt ${rustDebug(clip80(original))} twice`;
    seen.add(original);
    if (advertised.has(name)) return `gave two prompts the name ${name}`;
    advertised.add(name);
  }
  return null;
}

/** A tool list's revisions by name (the first tool of a name counts, as in Tether's ledger). */
function revisions(tools) {
  const byName = new Map();
  for (const t of tools) if (!byName.has(t.name)) byName.set(t.name, t.revision);
  return byName;
}

/**
 * What the host knows of its servers, as the events and actions passing through tell it (as
 * Tether's runtime keeps it, host/src/policy/ledger.rs): which servers are configured, each
 * one's live session with its latest tool list, and whether an attempt is in flight.
 */
export class Ledger {
  constructor(servers = new Map()) {
    // name -> { session: Map of tool name -> revision (the first tool of a name) | null, connecting: bool }
    this.servers = servers;
  }
  clone() {
    return new Ledger(new Map([...this.servers].map(([n, e]) => [n, { ...e }])));
  }
  /** Takes in what an event says happened (before the policy hears it; a removal after). */
  noteEvent(event) {
    const v = event.kind.val;
    const entry = (name) => this.servers.get(name);
    switch (event.kind.tag) {
      case 'server-configured':
        if (!this.servers.has(v.name)) this.servers.set(v.name, { session: null, connecting: false });
        break;
      case 'server-removed':
        this.servers.delete(v);
        break;
      case 'connected':
        if (entry(v.server)) Object.assign(entry(v.server), { session: revisions(v.tools), connecting: false });
        break;
      case 'connect-failed':
        if (entry(v.server)) Object.assign(entry(v.server), { session: null, connecting: false });
        break;
      case 'disconnected': // the end of a session says nothing of an attempt asked for since
        if (entry(v.server)) entry(v.server).session = null;
        break;
      case 'tools-changed':
        if (entry(v.server)?.session) entry(v.server).session = revisions(v.tools);
        break;
      default:
    }
  }
  noteHandover(handover) {
    this.servers = new Map(
      handover.servers.map((sh) => [
        sh.config.name,
        { session: sh.session ? revisions(sh.session.tools) : null, connecting: !!sh.connecting },
      ]),
    );
  }
  /** Takes in what the host is about to do. */
  noteActions(actions) {
    for (const a of actions) {
      const e = (a.tag === 'connect' || a.tag === 'disconnect') && this.servers.get(a.val);
      if (e) Object.assign(e, { session: null, connecting: a.tag === 'connect' });
    }
  }
  /** Whether a `connect` of `server` went out and its outcome has not come back. */
  isConnecting(server) {
    return this.servers.get(server)?.connecting === true;
  }
  /** The revision of `original` in the server's latest tool list, or null. */
  revision(server, original) {
    return this.servers.get(server)?.session?.get(original) ?? null;
  }
  /** Whether the host has a session for `server` or an attempt in flight. */
  isLive(server) {
    const e = this.servers.get(server);
    return !!e && (e.session !== null || e.connecting);
  }
  /**
   * Why the host cannot even take these actions in (too many, or a publication of a tool the
   * server's latest list lacks: Tether's conversion of the answer), or null.
   */
  invalid(actions, what) {
    if (actions.length > MAX_ACTIONS) return `returned ${actions.length} actions for ${what} (limit ${MAX_ACTIONS})`;
    for (const a of actions) {
      if (a.tag !== 'publish-tools') continue;
      const { server, tools } = a.val;
      for (const t of tools) {
        if (!this.servers.get(server)?.session?.has(t.original)) {
          return `published ${clip80(t.advertised)} as ${rustDebug(clip80(t.original))}, which server ${rustDebug(server)} does not offer`;
        }
      }
    }
    return null;
  }
  /** Why the host refuses these actions (outputs.rs `check_actions`), or null. */
  checkActions(actions) {
    for (const a of actions) {
      let server;
      switch (a.tag) {
        case 'connect':
        case 'disconnect':
        case 'withdraw-tools':
          server = a.val;
          break;
        case 'publish-tools': {
          const names = new Set();
          for (const t of a.val.tools) {
            if (!USABLE_NAME.test(t.advertised)) return `published an unusable tool name ${rustDebug(clip80(t.advertised))}`;
            if (t.original === '') return `published ${t.advertised} without its original name`;
            if (names.has(t.advertised)) return `published ${t.advertised} twice`;
            names.add(t.advertised);
          }
          server = a.val.server;
          break;
        }
        default: // wake-at, state-changed
          server = a.val.server;
      }
      if (!this.servers.has(server)) return `acted on a server the host never configured: ${rustDebug(clip80(server))}`;
    }
    return null;
  }
  /** Why the host refuses a take-over's actions (outputs.rs `check_take_over`), or null. */
  checkTakeOver(actions) {
    const replaced = actions.find((a) => (a.tag === 'connect' || a.tag === 'disconnect') && this.isLive(a.val));
    if (replaced) {
      return `asked to connect or disconnect ${rustDebug(replaced.val)}, whose session (or attempt) the host keeps`;
    }
    return this.checkActions(actions);
  }
}

// ---------------------------------------------------------------------------------------------
// The interpreter

/** Statuses in the order of their servers' names (as Rust orders strings: by UTF-8 bytes). */
function byServer(statuses) {
  return [...statuses].sort((x, y) => Buffer.compare(Buffer.from(x.server, 'utf8'), Buffer.from(y.server, 'utf8')));
}

function errorText(e) {
  if (e instanceof ScenarioFailure) return e.message;
  return e?.message ?? String(e);
}

/** `{"alpha": (27143, 1)}`: the armed timers, as Tether's host prints them. */
function describeWakes(wakes) {
  const entries = [...wakes.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return '{' + entries.map(([server, w]) => `${rustDebug(server)}: (${w.at}, ${w.token})`).join(', ') + '}';
}

/**
 * Runs one scenario. `newInstance()` gives a fresh, un-`init`ed instance (may be async).
 * Returns { name, level, failure: string|null, transcript: string[] (the lines, without their
 * '\n'), unusable?: string (the first instance could not be made or refused the settings: the
 * component cannot be used; a caller's preflight normally finds that first), applicable?: false
 * (the scenario's `since` names a contract version the component lacks: passed without running,
 * no transcript) }.
 *
 * A failure reads `at step K (WHAT): WHY`, K counting the calls into the policy so far (`handle`,
 * `admit`, `snapshot-restore`, `take-over`, `set-naming`, `name-prompts`; not `status`) and WHAT
 * the latest of them, as Tether's host says it.
 *
 * `watch` (optional) hears the progress as it happens, for a caller that must report on a run it
 * cannot wait for: `called(K, WHAT)` when step K begins, `recorded(line)` for each transcript line.
 */
export async function runScenario(scenario, { newInstance, settings = '{}', watch = {} }) {
  const transcript = [];
  const record = (obj) => {
    const line = stringify(obj);
    transcript.push(line);
    watch.recorded?.(line);
  };
  const s = {
    instance: null,
    // What `twice` restarts from.
    now: 1000n,
    wakes: new Map(),
    nextCallId: 1n,
    calls: new Map(),
    lastCall: null,
    // The latest answers.
    actions: [],
    admission: null,
    status: [],
    promptNames: [],
    // What the host shows of each server (its publication in force, as a key), and the servers
    // the latest actions changed nothing of.
    published: new Map(),
    redundant: new Set(),
    ledger: null,
  };
  let calls = 0;
  let last = 'start';
  const called = (what) => {
    calls++;
    last = what;
    watch.called?.(calls, last);
  };

  const attempt = (what, fn) => {
    try {
      return fn();
    } catch (e) {
      if (e instanceof ScenarioFailure) throw e;
      throw new ScenarioFailure(what ? `${what}: ${errorText(e)}` : errorText(e));
    }
  };
  // A fresh instance given `init(settings)` (not recorded: callers record when the spec says).
  const fresh = async () => {
    let inst;
    try {
      inst = await newInstance();
    } catch (e) {
      fail(errorText(e));
    }
    attempt(null, () => inst.init(settings));
    return inst;
  };
  let ledger = new Ledger();
  s.ledger = ledger;
  const label = () => s.instance?.label ?? 'under test';
  // An answer the host refuses, worded as Tether's runtime words it.
  const invalid = (during, why) => fail(`policy ${label()} failed during ${during}: returned invalid output: ${why}`);
  // The host takes the actions in (Tether's conversion of the answer) before it checks them.
  const checked = (actions, during, what) => {
    const why = ledger.invalid(actions, what);
    if (why) invalid(during, why);
    return actions;
  };
  // Does what the policy asked: arms its timers, and shows or hides tools as Tether's host does,
  // absorbing what changes nothing (host/src/registry.rs).
  const took = (actions) => {
    s.redundant = new Set();
    for (const a of actions) {
      if (a.tag === 'wake-at') {
        s.wakes.set(a.val.server, { at: a.val.at, token: a.val.token });
      } else if (a.tag === 'publish-tools') {
        const { server, tools } = a.val;
        const shown = stringify(
          tools
            .map((t) => [t.advertised, t.original, t['read-only'], ledger.revision(server, t.original)])
            .sort(([x], [y]) => Buffer.compare(Buffer.from(x, 'utf8'), Buffer.from(y, 'utf8'))),
        );
        if (s.published.get(server) === shown) s.redundant.add(server);
        else s.published.set(server, shown);
      } else if (a.tag === 'withdraw-tools') {
        if (!s.published.delete(a.val)) s.redundant.add(a.val);
      }
    }
    ledger.noteActions(actions);
    s.actions = actions;
  };
  const handle = (kind) => {
    const event = given(T.event, { now: s.now, kind }, 'event');
    called(describeEvent(event.kind));
    // As Tether's runtime: the ledger hears the event first (a publication needs the tools it
    // brings), except a removal (the policy still acts on the server it forgets).
    const removal = event.kind.tag === 'server-removed';
    if (!removal) ledger.noteEvent(event);
    const actions = checked(attempt(null, () => s.instance.handle(event)), 'handle', 'one event');
    const why = ledger.checkActions(actions);
    if (why) invalid('handle', why);
    if (removal) ledger.noteEvent(event);
    took(actions);
    record({ do: 'handle', event, actions });
  };
  const admit = (server, tool) => {
    const request = given(T['call-request'], { now: s.now, 'call-id': s.nextCallId, server, tool }, 'request');
    called(`admit a call to ${server}/${tool}`);
    s.nextCallId++;
    s.lastCall = request['call-id'];
    const admission = attempt(null, () => s.instance.admit(request));
    const why = invalidAdmission(admission);
    if (why) invalid('admit', why);
    record({ do: 'admit', request, admission });
    s.admission = admission;
    return request['call-id'];
  };
  const finish = (server, callId, outcome) =>
    handle({ tag: 'call-finished', val: { server, 'call-id': callId, outcome, 'duration-ms': 5 } });
  const statusNow = () => attempt(null, () => s.instance.status(s.now));
  // `set-naming` (contract 0.2.1); a 0.2.0 component has none to call.
  const setNaming = (naming) => {
    if (!speaksNaming(s.instance)) fail('the policy has no set-naming (contract 0.2.0)');
    attempt(null, () => s.instance.setNaming(naming));
    record({ do: 'set-naming', naming });
  };

  const isObject = (v) => typeof v === 'object' && v !== null;

  // The host's own state, which `twice` and `snapshot-restore` start again from.
  const save = () => ({
    now: s.now,
    wakes: new Map(s.wakes),
    nextCallId: s.nextCallId,
    calls: new Map(s.calls),
    lastCall: s.lastCall,
    published: new Map(s.published),
    ledger: ledger.clone(),
  });
  const resume = (saved) => {
    Object.assign(s, saved, { wakes: new Map(saved.wakes), calls: new Map(saved.calls), published: new Map(saved.published) });
    ledger = saved.ledger;
    s.ledger = ledger;
  };
  // Fails with `what` when two runs of a block wrote other transcripts, naming the first line
  // that differs.
  const sameRuns = (first, second, what) => {
    const n = Math.max(first.length, second.length);
    for (let k = 0; k < n; k++) {
      if (first[k] !== second[k]) {
        fail(`${what} (line ${k + 1} of the block's transcript): ${first[k] ?? 'nothing'} vs ${second[k] ?? 'nothing'}`);
      }
    }
  };

  // Runs steps; returns 'ran', 'stop' (a stop-if held: the enclosing repeat ends).
  const runSteps = async (steps) => {
    if (!Array.isArray(steps)) malformed(`malformed steps: ${safeText(steps)}`);
    for (const step of steps) {
      const flow = await runStep(step);
      if (flow !== 'ran') return flow;
    }
    return 'ran';
  };

  const runStep = async (step) => {
    if (!isObject(step)) malformed(`malformed step ${safeText(step)}`);
    switch (step.do) {
      case 'event':
        handle(need(step, 'kind', isObject, 'an event kind'));
        break;
      case 'fire-timer': {
        const server = need(step, 'server', isString, 'a string');
        const w = s.wakes.get(server);
        if (w) {
          s.wakes.delete(server);
          if (w.at > s.now) s.now = w.at;
          handle({ tag: 'timer', val: { server, token: w.token } });
        } else if (step.optional !== true) {
          fail(`expected a timer armed for ${server}, none is`);
        }
        break;
      }
      case 'advance':
        s.now += toBig(need(step, 'ms', isInt, 'an integer'), 'ms');
        break;
      case 'admit': {
        const server = need(step, 'server', isString, 'a string');
        const tool = need(step, 'tool', isString, 'a string');
        const name = step.name ?? null;
        if (name !== null && typeof name !== 'string') malformed(`malformed step ${safeText(step)}: "name" must be a string or null`);
        const callId = admit(server, tool);
        if (name !== null) s.calls.set(name, callId);
        break;
      }
      case 'finish': {
        const server = need(step, 'server', isString, 'a string');
        const outcome = need(step, 'outcome', isObject, 'a call outcome');
        const name = step.call ?? null;
        const callId = name === null ? s.lastCall : s.calls.get(name) ?? null;
        if (callId === null) fail(name === null ? 'no call was admitted' : `no call named ${name} was admitted`);
        finish(server, callId, outcome);
        break;
      }
      case 'call': {
        const server = need(step, 'server', isString, 'a string');
        const tool = need(step, 'tool', isString, 'a string');
        const outcome = need(step, 'outcome', isObject, 'a call outcome');
        const callId = admit(server, tool);
        if (s.admission.tag === 'allow' || s.admission.tag === 'probe') finish(server, callId, outcome);
        break;
      }
      case 'status':
        s.status = statusNow();
        record({ do: 'status', now: s.now, status: s.status });
        break;
      case 'snapshot-restore': {
        // Exports before the restored instance was asked to decide anything have no `steps`.
        const steps = step.steps ?? [];
        if (!Array.isArray(steps)) malformed(`malformed step ${safeText(step)}: "steps" must be a list of steps`);
        called('snapshot and restore into a fresh instance');
        const before = statusNow();
        const snapshot = attempt(null, () => s.instance.snapshot());
        // The original answers the steps first; the restored instance answers them again from
        // the host's state as it was at the snapshot.
        const saved = save();
        const firstFrom = transcript.length;
        const flow = await runSteps(steps);
        const first = transcript.slice(firstFrom);
        if (steps.length > 0) {
          called('restore the snapshot into a fresh instance');
          resume(saved);
        }
        const inst = await fresh();
        attempt('moving the state into a fresh instance failed', () => inst.restore(snapshot));
        s.instance = inst;
        const after = statusNow();
        record({ do: 'snapshot-restore' });
        // The contract does not order `status`: compare server by server.
        const a = stringify(byServer(before));
        const b = stringify(byServer(after));
        if (a !== b) fail(`status changed across snapshot/restore: ${a} -> ${b}`);
        const secondFrom = transcript.length;
        await runSteps(steps);
        sameRuns(first, transcript.slice(secondFrom), 'the restored instance answered otherwise than the original');
        return flow;
      }
      case 'take-over': {
        const handover = given(T.handover, need(step, 'handover', isObject, 'a handover'), 'handover');
        // Exports before contract 0.2.1 have no `namings`; null is none.
        const namings = step.namings ?? [];
        if (!Array.isArray(namings)) malformed(`malformed step ${safeText(step)}: "namings" must be a list of namings or null`);
        const told = namings.map((n) => given(T.naming, n, 'naming'));
        called(`take over from ${handover.previous.name}`);
        s.instance = await fresh();
        record({ do: 'init', settings });
        // The operator's namings come first, on the fresh instance; a 0.2.0 one is given none.
        if (speaksNaming(s.instance)) for (const naming of told) setNaming(naming);
        ledger.noteHandover(handover);
        // The handover says nothing of what the host shows: the policy's publications are new.
        s.published = new Map();
        let actions;
        try {
          actions = checked(s.instance.takeOver(handover), 'take-over', 'a handover');
        } catch (e) {
          fail(`the handover was refused: ${errorText(e)}`);
        }
        const why = ledger.checkTakeOver(actions);
        if (why) invalid('take-over', why);
        took(actions);
        record({ do: 'take-over', handover, actions });
        break;
      }
      case 'set-naming': {
        const naming = given(T.naming, need(step, 'naming', isObject, 'a naming'), 'naming');
        called(`set the naming of ${naming.server}`);
        setNaming(naming);
        break;
      }
      case 'name-prompts': {
        const server = need(step, 'server', isString, 'a string');
        const originals = given(T.strings, need(step, 'originals', Array.isArray, 'a list of strings'), 'originals');
        called(`name the prompts of ${server}`);
        if (!speaksNaming(s.instance)) fail('the policy has no name-prompts (contract 0.2.0)');
        const named = attempt(null, () => s.instance.namePrompts(server, originals));
        const why = invalidPromptNames(originals, named);
        if (why) invalid('name-prompts', why);
        record({ do: 'name-prompts', server, originals, named });
        s.promptNames = named;
        break;
      }
      case 'twice': {
        const steps = need(step, 'steps', Array.isArray, 'a list of steps');
        const saved = save();
        const firstFrom = transcript.length;
        const flow = await runSteps(steps);
        const first = transcript.slice(firstFrom);
        resume(saved);
        s.instance = await fresh();
        record({ do: 'init', settings });
        const secondFrom = transcript.length;
        await runSteps(steps);
        sameRuns(first, transcript.slice(secondFrom), 'the same inputs gave other outputs in a fresh instance');
        return flow;
      }
      case 'repeat': {
        const times = toBig(need(step, 'times', isInt, 'an integer'), 'times');
        const steps = need(step, 'steps', Array.isArray, 'a list of steps');
        const otherwise = step.else ?? null;
        if (otherwise !== null && typeof otherwise !== 'string') malformed(`malformed step ${safeText(step)}: "else" must be a string or null`);
        for (let k = 0n; k < times; k++) {
          if ((await runSteps(steps)) === 'stop') return 'ran';
        }
        if (otherwise !== null) fail(otherwise);
        break;
      }
      case 'stop-if':
        if (holds(need(step, 'that', isObject, 'a predicate'), s)) return 'stop';
        break;
      case 'expect': {
        const that = need(step, 'that', isObject, 'a predicate');
        const otherwise = need(step, 'else', isString, 'a message');
        if (!holds(that, s)) fail(`${otherwise}; ${context(that, s)}`);
        break;
      }
      default:
        malformed(`unknown step ${safeText(step.do)}`);
    }
    return 'ran';
  };

  const result = { name: scenario?.name, level: scenario?.level, failure: null, transcript };
  try {
    s.instance = await newInstance();
  } catch (e) {
    result.unusable = errorText(e);
    result.failure = result.unusable;
    return result;
  }
  try {
    s.instance.init(settings);
  } catch (e) {
    result.unusable = `policy ${s.instance.label ?? 'under test'} refused the settings ${settings.trim()}: ${e?.reason ?? errorText(e)}`;
    result.failure = result.unusable;
    return result;
  }
  const since = scenario?.since ?? null;
  if (since !== null && typeof since !== 'string') {
    result.malformed = `"since" must be a contract version or null, not ${safeText(since)}`;
    result.failure = result.malformed;
    return result;
  }
  if (!implementsSince(s.instance, since)) {
    // What it checks came after the component's contract: it passes without running (and
    // has no transcript).
    result.applicable = false;
    return result;
  }
  record({ do: 'init', settings });
  try {
    // A stop-if outside any repeat ends the scenario (as in Tether's host).
    await runSteps(scenario?.steps);
  } catch (e) {
    if (e instanceof ScenarioMalformed) {
      result.malformed = `at step ${calls} (${last}): ${e.message}`;
      result.failure = result.malformed;
    } else {
      const why = e instanceof ScenarioFailure ? e.message : `host error: ${e?.stack ?? e}`;
      result.failure = `at step ${calls} (${last}): ${why}`;
    }
  }
  return result;
}

/** What a predicate looked at, for a failure's message (as Tether's host words it). */
export function context(predicate, state) {
  const key = Object.keys(predicate)[0];
  switch (key) {
    case 'not':
      return context(predicate.not, state);
    case 'admission':
    case 'refused-naming':
      return state.admission ? `the admission was ${stringify(state.admission)}` : 'no call was admitted';
    case 'lists':
    case 'state':
      return `the status was ${stringify(state.status ?? [])}`;
    case 'names-prompts':
      return `the prompt names were ${stringify(state.promptNames ?? [])}`;
    case 'published': {
      const servers = [...(state.published ?? new Map()).keys()].sort((x, y) =>
        Buffer.compare(Buffer.from(x, 'utf8'), Buffer.from(y, 'utf8')),
      );
      return `the host holds publications of ${stringify(servers)}`;
    }
    case 'timer-armed':
    case 'timer-not-in-the-past':
      return `at ${state.now} the timers were ${describeWakes(state.wakes)}`;
    default:
      return `the actions were ${stringify(state.actions ?? [])}`;
  }
}
