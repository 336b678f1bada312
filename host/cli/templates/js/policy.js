// A starting point for a Tether policy in JavaScript (contract tether:policy@0.2.1).
//
// Build: ./build.sh policy.wasm     Check: tether policy check policy.wasm
//
// The host feeds events stamped with its time and runs the actions returned; the policy never
// reads a clock, sleeps, or does I/O (there are none in the sandbox), and must decide the same
// way every time it is given the same inputs. This one is deliberately small: it connects,
// retries after a fixed delay, parks a server after a few failures (with a slow self-probe),
// and has a simple circuit breaker. Change anything; `tether policy check` tells what still holds.
//
// Bindings: records are objects with camelCase fields, variants are { tag, val }, enums are
// strings, option<T> is T or undefined, u64 is a BigInt, list<u8> a Uint8Array. A function
// returning result<_, string> returns for ok and throws the error string.

import { log } from 'tether:policy/log@0.2.2';

// ----- settings: a JSON object; unknown keys are refused -----
// (These are the policy's own settings, given to init and setSettings. A server's per-server
// `settings`, in its configuration, are kept but ignored by this starter.)

const DEFAULTS = {
  retry_ms: 2000, // wait before the next attempt
  max_failures: 5, // failed attempts without a proven session, then park
  probe_ms: 60000, // a parked server's self-probe interval
  breaker_threshold: 3, // consecutive call transport failures that open the breaker
  breaker_cooldown_ms: 30000, // how long it stays open before one probe call
};

function parseSettings(text) {
  let given;
  try {
    given = text.trim() === '' ? {} : JSON.parse(text);
  } catch (e) {
    throw `settings are not valid JSON: ${e.message}`; // refused, not a trap
  }
  if (given === null || typeof given !== 'object' || Array.isArray(given)) throw 'settings must be a JSON object';
  const settings = { ...DEFAULTS };
  for (const [key, value] of Object.entries(given)) {
    if (!Object.hasOwn(DEFAULTS, key)) throw `unknown setting ${JSON.stringify(key)} (known: ${Object.keys(DEFAULTS).join(', ')})`;
    if (!Number.isSafeInteger(value) || value < 1) throw `setting ${key} must be a positive whole number`;
    settings[key] = value;
  }
  return settings;
}

// ----- tool (and prompt) names agents can use: [A-Za-z0-9_-]{1,64}, unique across servers -----
// By default `<server>__<tool>`; the operator may give a server a prefix instead (set-naming):
// "" for the server's own names, "x-" for `x-<tool>`.

const sanitize = (text) => text.replace(/[^A-Za-z0-9_-]/g, '_');

function advertise(server, tool, taken) {
  const prefix = state.namings.get(server);
  const text = prefix === undefined ? `${server}__${tool}` : `${prefix}${tool}`;
  const base = sanitize(text).slice(0, 64) || '_'; // prefix "" and a tool named "": still a name
  let name = base;
  for (let n = 2; taken.has(name); n += 1) name = `${base.slice(0, 64 - String(n).length - 1)}_${n}`;
  return name;
}

// Include/exclude globs: `*` any run of characters, `?` one character.
function glob(pattern) {
  const source = pattern.replace(/[.+^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '.*').replace(/\?/g, '.');
  return new RegExp(`^${source}$`, 's');
}

// ----- state (plain data; servers in a Map, so any name works, `__proto__` included) -----

const SNAPSHOT_FORMAT = 'my-js-policy/1';

let settings = DEFAULTS;
let state = fresh();

function fresh() {
  // namings: server -> the operator's prefix (set-naming); it may come before the server does.
  return { now: 0, nextToken: 0, servers: new Map(), namings: new Map() };
}

function newServer(config, now) {
  return {
    config: { name: config.name, transport: config.transport, include: config.include, exclude: config.exclude, settings: config.settings },
    state: 'connecting',
    since: now,
    session: null, // { tools: [{ name, readOnly, revision }], proven }
    failures: 0,
    toolErrors: 0,
    lastFault: null,
    wake: null, // { at, token }
    breaker: { failures: 0, openUntil: null, probe: null }, // openUntil: number while open
    published: [], // [{ advertised, original, readOnly, revision }]
  };
}

// ----- actions -----

const change = (server, s, next, detail) => {
  if (s.state !== next) s.since = state.now;
  s.state = next;
  return { tag: 'state-changed', val: { server, state: next, detail } };
};

function arm(server, s, delay, out) {
  state.nextToken += 1;
  s.wake = { at: state.now + delay, token: state.nextToken };
  out.push({ tag: 'wake-at', val: { server, at: BigInt(s.wake.at), token: BigInt(s.wake.token) } });
}

function connect(server, s, detail, out) {
  s.wake = null;
  out.push(change(server, s, 'connecting', detail));
  out.push({ tag: 'connect', val: server });
}

/** Hides the server's tools, once: only when some are visible. */
function withdraw(server, s, out) {
  if (s.published.length === 0) return;
  s.published = [];
  out.push({ tag: 'withdraw-tools', val: server });
}

/** Publishes the server's (filtered) tools, only when they differ from what agents see. */
function publish(server, s, out) {
  if (!s.session) return;
  const include = s.config.include.map(glob);
  const exclude = s.config.exclude.map(glob);
  const taken = new Set();
  for (const [other, o] of state.servers) {
    if (other !== server) for (const t of o.published) taken.add(t.advertised);
  }
  const next = [];
  const seen = new Set();
  for (const tool of [...s.session.tools].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))) {
    if (tool.name === '' || seen.has(tool.name)) continue;
    seen.add(tool.name);
    if (include.length > 0 && !include.some((re) => re.test(tool.name))) continue;
    if (exclude.some((re) => re.test(tool.name))) continue;
    const advertised = advertise(server, tool.name, taken);
    taken.add(advertised);
    next.push({ advertised, original: tool.name, readOnly: tool.readOnly, revision: tool.revision });
  }
  if (JSON.stringify(next) === JSON.stringify(s.published)) return;
  if (next.length === 0) return withdraw(server, s, out);
  s.published = next;
  out.push({
    tag: 'publish-tools',
    val: { server, tools: next.map(({ advertised, original, readOnly }) => ({ advertised, original, readOnly })) },
  });
}

/** An attempt failed or a session ended: retry after a delay, or park. */
function fail(server, s, fault, out) {
  s.failures += 1;
  if (s.breaker.probe === 'reconnect') {
    // The reconnect the breaker asked for failed: it stays open for another cooldown.
    s.breaker.openUntil = state.now + settings.breaker_cooldown_ms;
    s.breaker.probe = null;
  }
  s.lastFault = fault.val === undefined ? fault.tag : `${fault.tag}: ${fault.val}`;
  const permanent = ['spawn-failed', 'auth-required', 'not-mcp-endpoint'].includes(fault.tag);
  if (permanent || s.failures >= settings.max_failures) {
    withdraw(server, s, out);
    out.push(change(server, s, 'parked', `parked after ${s.lastFault}`));
    arm(server, s, settings.probe_ms, out);
  } else {
    out.push(change(server, s, 'backing-off', `${s.lastFault}; retrying`));
    arm(server, s, settings.retry_ms, out);
  }
}

const tools = (list) => list.map((t) => ({ name: t.name, readOnly: t.readOnly, revision: String(t.revision) }));

// ----- events -----

function handle(kind, out) {
  const { tag, val } = kind;
  if (tag === 'shutdown') {
    for (const [server, s] of [...state.servers].sort(([a], [b]) => (a < b ? -1 : 1))) {
      if (s.state === 'stopped') continue;
      withdraw(server, s, out);
      s.session = null;
      s.wake = null;
      out.push({ tag: 'disconnect', val: server });
      out.push(change(server, s, 'stopped', 'host shutting down'));
    }
    return;
  }
  if (tag === 'server-configured') {
    const s = state.servers.get(val.name);
    if (!s) {
      const added = newServer(val, state.now);
      state.servers.set(val.name, added);
      connect(val.name, added, 'configured', out);
    } else if (s.state !== 'stopped') {
      s.config = newServer(val, 0).config;
      publish(val.name, s, out); // the filters may have changed
    }
    return;
  }
  // Every other event names one server.
  const server = typeof val === 'string' ? val : val.server;
  if (tag === 'server-removed') state.namings.delete(server); // the naming ends with the server
  const s = state.servers.get(server);
  if (!s) return;
  switch (tag) {
    case 'server-removed':
      withdraw(server, s, out);
      out.push({ tag: 'disconnect', val: server });
      out.push(change(server, s, 'stopped', 'removed'));
      state.servers.delete(server);
      break;
    case 'connected':
      if (s.state === 'stopped') {
        out.push({ tag: 'disconnect', val: server });
        break;
      }
      s.session = { tools: tools(val.tools), proven: false };
      s.wake = null;
      s.breaker = { failures: 0, openUntil: null, probe: null };
      publish(server, s, out);
      out.push(change(server, s, 'connected', `session up (${val.serverInfo})`));
      break;
    case 'connect-failed':
      if (s.state === 'connecting') fail(server, s, val.fault, out);
      break;
    case 'disconnected':
      if (!s.session) break;
      s.session = null;
      withdraw(server, s, out);
      fail(server, s, val.fault, out);
      break;
    case 'tools-changed':
      if (s.session) {
        s.session.tools = tools(val.tools);
        publish(server, s, out);
      }
      break;
    case 'keepalive-ok':
      prove(server, s, out);
      break;
    case 'keepalive-failed':
      break; // a `disconnected` follows if the session is torn down
    case 'call-finished': {
      const b = s.breaker;
      const callId = String(val.callId);
      const outcome = val.outcome.tag;
      if (outcome === 'ok' || outcome === 'tool-error') {
        if (outcome === 'tool-error') s.toolErrors += 1;
        else s.toolErrors = 0;
        if (b.openUntil === null || b.probe === callId) s.breaker = { failures: 0, openUntil: null, probe: null };
        prove(server, s, out);
      } else if (outcome === 'transport-error' || outcome === 'timeout') {
        b.failures += 1;
        if ((b.openUntil === null && b.failures >= settings.breaker_threshold) || b.probe === callId) {
          b.openUntil = state.now + settings.breaker_cooldown_ms;
          b.probe = null;
        }
      } else if (outcome === 'cancelled' && b.probe === callId) {
        b.probe = null;
      }
      break;
    }
    case 'timer':
      if (s.wake && BigInt(s.wake.token) === val.token) {
        s.wake = null;
        if (s.state === 'backing-off' || s.state === 'parked') connect(server, s, `attempt after ${s.failures} failures`, out);
      }
      break;
    case 'reconnect-requested':
      if (s.state === 'backing-off' || s.state === 'parked') connect(server, s, `reconnect requested by ${val.source}`, out);
      break;
    default:
      break;
  }
}

function prove(server, s, out) {
  if (!s.session || s.session.proven) return;
  s.session.proven = true;
  s.failures = 0;
  out.push(change(server, s, 'healthy', 'session proven'));
}

const breakerState = (s, now) => (s.breaker.openUntil === null ? 'closed' : now >= s.breaker.openUntil ? 'half-open' : 'open');

// ----- the export the host calls -----

export const policy = {
  info() {
    return { name: 'my-js-policy', version: '0.1.0' };
  },

  init(text) {
    settings = parseSettings(text); // throws the error string
    state = fresh();
  },

  setSettings(text) {
    settings = parseSettings(text);
  },

  handle(event) {
    state.now = Math.max(state.now, Number(event.now));
    const out = [];
    handle(event.kind, out);
    return out;
  },

  admit(request) {
    state.now = Math.max(state.now, Number(request.now));
    const server = request.server;
    const s = state.servers.get(server);
    const say = (what) => `Server ${JSON.stringify(server)} ${what}; the call was not sent.`;
    if (!s) return { tag: 'reject', val: say('is not configured') };
    if (!s.session) {
      if (s.state === 'backing-off' && breakerState(s, state.now) === 'half-open' && s.breaker.probe === null) {
        s.breaker.probe = 'reconnect'; // the probe finds no session: ask for a reconnect instead
        return { tag: 'reconnect', val: say('has no session; reconnecting') };
      }
      return { tag: 'reject', val: say(`is ${s.state}`) };
    }
    switch (breakerState(s, state.now)) {
      case 'closed':
        return { tag: 'allow' };
      case 'open':
        return { tag: 'reject', val: say('is failing; calls are paused') };
      default:
        if (s.breaker.probe !== null) return { tag: 'reject', val: say('is being tested with one call') };
        s.breaker.probe = String(request.callId);
        return { tag: 'probe' };
    }
  },

  status(now) {
    const at = Math.max(state.now, Number(now));
    return [...state.servers.keys()]
      .sort()
      .map((server) => {
        const s = state.servers.get(server);
        const breaker = breakerState(s, at);
        return {
          server,
          state: s.state,
          breaker,
          failures: s.failures,
          breakerFailures: s.breaker.failures,
          toolErrors: s.toolErrors,
          lastFault: s.lastFault ?? undefined,
          since: BigInt(s.since),
          publishedTools: s.published.length,
          nextAttemptAt: s.wake ? BigInt(s.wake.at) : undefined,
          breakerUntil: breaker === 'open' ? BigInt(s.breaker.openUntil) : undefined,
        };
      });
  },

  snapshot() {
    const byName = ([a], [b]) => (a < b ? -1 : a > b ? 1 : 0);
    const servers = [...state.servers].sort(byName);
    const namings = [...state.namings].sort(byName);
    const saved = { format: SNAPSHOT_FORMAT, settings, state: { now: state.now, nextToken: state.nextToken, servers, namings } };
    return new TextEncoder().encode(JSON.stringify(saved));
  },

  /** Replaces the state with a snapshot's, after checking its shape; on error nothing changes. */
  restore(bytes) {
    let saved;
    try {
      saved = JSON.parse(new TextDecoder().decode(bytes));
    } catch (e) {
      throw `not a snapshot of this policy: ${e}`;
    }
    if (saved === null || typeof saved !== 'object' || saved.format !== SNAPSHOT_FORMAT) {
      throw `not a snapshot of this policy (format ${JSON.stringify(saved?.format ?? null)}, expected ${SNAPSHOT_FORMAT})`;
    }
    let restored;
    try {
      restored = parseSettings(JSON.stringify(saved.settings ?? null));
    } catch (why) {
      throw `damaged snapshot: ${why}`;
    }
    const st = saved.state;
    const whole = (v) => Number.isSafeInteger(v) && v >= 0;
    if (st === null || typeof st !== 'object' || !whole(st.now) || !whole(st.nextToken) || !Array.isArray(st.servers)) {
      throw 'damaged snapshot: its state is not { now, nextToken, servers }';
    }
    // A snapshot of before contract 0.2.1 has no namings.
    const namings = st.namings ?? [];
    const pair = (p) => Array.isArray(p) && p.length === 2 && typeof p[0] === 'string' && typeof p[1] === 'string';
    if (!Array.isArray(namings) || !namings.every(pair)) throw 'damaged snapshot: namings are not [server, prefix] pairs';
    const servers = new Map();
    for (const entry of st.servers) {
      const [name, s] = Array.isArray(entry) ? entry : [];
      if (typeof name !== 'string' || s === null || typeof s !== 'object' || typeof s.state !== 'string' || !Array.isArray(s.published)) {
        throw 'damaged snapshot: a server entry is not [name, server]';
      }
      if (servers.has(name)) throw `damaged snapshot: server ${JSON.stringify(name)} appears twice`;
      servers.set(name, s);
    }
    settings = restored;
    state = { now: st.now, nextToken: st.nextToken, servers, namings: new Map(namings) };
  },

  /** Adopts another policy's servers: keeps live sessions (never connects them), re-arms timers. */
  takeOver(handover) {
    if (state.servers.size > 0) throw 'take-over needs a fresh instance';
    state.now = Math.max(state.now, Number(handover.now));
    const out = [];
    for (const h of handover.servers) {
      const server = h.config.name;
      const s = newServer(h.config, Math.min(Number(h.since), state.now));
      state.servers.set(server, s);
      s.failures = h.failures;
      s.toolErrors = h.toolErrors;
      s.lastFault = h.lastFault ?? null;
      if (h.session) {
        s.session = { tools: tools(h.session.tools), proven: h.session.proven };
        s.state = h.session.proven ? 'healthy' : 'connected';
        publish(server, s, out);
      } else if (h.connecting) {
        s.state = 'connecting'; // its outcome arrives as an event
      } else if (h.state === 'stopped') {
        s.state = 'stopped';
      } else {
        s.state = h.state === 'parked' ? 'parked' : 'backing-off';
        const at = h.nextAttemptAt === undefined ? state.now : Math.max(Number(h.nextAttemptAt), state.now);
        arm(server, s, at - state.now, out);
      }
    }
    log('info', `took over ${handover.servers.length} servers from ${handover.previous.name}`);
    return out;
  },

  /** The operator's prefix for a server's names (undefined: the default); the host follows with
   * `server-configured`, which republishes a live server under the new names. */
  setNaming(naming) {
    if (naming.prefix === undefined) state.namings.delete(naming.server);
    else state.namings.set(naming.server, naming.prefix);
  },

  /** The names agents see for a server's prompts, by the rule of its tools; changes nothing. */
  namePrompts(server, originals) {
    const taken = new Set();
    return [...new Set(originals)].map((original) => {
      const advertised = advertise(server, original, taken);
      taken.add(advertised);
      return { advertised, original };
    });
  },
};
