// The policy: one deterministic state machine supervising every server of a host.
//
// "Failure window + per-fault-class backoff":
// - a server that fails `window.failures` times within `window.ms` without a proven session is
//   parked (its tools withdrawn, a slow self-probe armed: it is never given up);
// - the wait before the next attempt depends on the kind of fault (a handshake that timed out
//   waits longer than a closed connection); kinds in `permanent` park at once;
// - only a proven session (a keepalive answered, a call answered) resets the window;
// - a circuit breaker per server over consecutive call transport failures, with exactly one
//   half-open probe; a probe that finds no session becomes a reconnect;
// - tools are published under usable, unique names (by default `<server>__<tool>`, or after
//   the operator's prefix), filtered by include/exclude globs, republished only when the
//   visible list really changed, and withdrawn exactly once; prompts are named by the same rule.
//
// Time comes only from events and requests (numbers of host milliseconds); there is no clock,
// no randomness, no I/O. Values use the shapes of the contract's JS bindings, except that times
// and tokens are numbers and a tool's `revision` and a call's `callId` are decimal strings (the
// glue, policy.js, converts).

import {
  breakerState,
  claimCallProbe,
  claimReconnectProbe,
  closedBreaker,
  onAttemptFailed,
  onCallAnswered,
  onCallCancelled,
  onCallFailure,
} from './breaker.js';
import { probeDelay, retryDelay } from './backoff.js';
import { clip, describeFault, faultClass, summarize } from './faults.js';
import { compileFilters } from './glob.js';
import { naturalName, saltedName } from './names.js';
import { MAX_HOLD_MS, parseSettings, serverSettings } from './settings.js';
import { opSecs, words } from './words.js';

/** Identifies this implementation (the host tells implementations apart by `name`). */
export const INFO = Object.freeze({ name: 'tether-window-policy', version: '0.1.0' });

const MAX_INFO = 200;
/** The filter of a server whose configuration is invalid: nothing passes. */
export const NONE = () => false;

// ----- actions -----

const connect = (server) => ({ tag: 'connect', val: server });
const disconnect = (server) => ({ tag: 'disconnect', val: server });
const withdrawTools = (server) => ({ tag: 'withdraw-tools', val: server });
const change = (server, state, detail) => ({ tag: 'state-changed', val: { server, state, detail } });


/** The tools of a session as kept: name, read-only, revision (a decimal string). */
function keepTools(tools) {
  const list = tools ?? [];
  const kept = new Array(list.length);
  for (let i = 0; i < list.length; i += 1) {
    const t = list[i];
    kept[i] = { name: String(t.name), readOnly: t.readOnly === true, revision: String(t.revision) };
  }
  return kept;
}

/**
 * Sets what is derived from a server's configuration and the settings: its effective settings
 * and its tool filter (null: every tool passes). Not enumerable, so never in a snapshot.
 */
export function derive(s, settings, filter) {
  Object.defineProperty(s, 'settings', { value: settings, writable: true, enumerable: false, configurable: true });
  Object.defineProperty(s, 'filter', { value: filter, writable: true, enumerable: false, configurable: true });
  return s;
}

function newServer(config, now) {
  return {
    name: config.name,
    config: {
      name: config.name,
      transport: config.transport,
      include: [...(config.include ?? [])],
      exclude: [...(config.exclude ?? [])],
      settings: config.settings ?? '',
    },
    configError: null,
    state: 'connecting',
    since: now,
    // { info, tools, proven } while the host has a session
    session: null,
    // Consecutive failures without a proven session (reported as `failures`).
    failures: 0,
    // Host times of the failures still inside the window.
    window: [],
    // The attempt in flight is a parked server's single self-probe (or revival).
    reviving: false,
    lastFault: null,
    // { tag, code } of the last fault, for agents' words (no host text).
    lastSummary: null,
    parkReason: null,
    // Times parked (varies the self-probe's jitter) and the current self-probe interval.
    parks: 0,
    probeMs: 0,
    // { at, token } of the one timer that counts.
    wake: null,
    toolErrors: 0,
    breaker: closedBreaker(),
    // What agents see now: { advertised, original, readOnly, revision }.
    published: [],
    // The operator's prefix those names follow (null: the default naming).
    namedBy: null,
  };
}

export class WindowPolicy {
  /** A policy with `settings` (an already checked settings object). */
  constructor(settings) {
    this.settings = settings;
    /** @type {Map<string, any>} */
    this.servers = new Map();
    this.now = 0;
    this.nextToken = 0;
    /** The host time (a decimal string) the logic's times count from; set by the glue. */
    this.origin = null;
    this.logs = [];
    /** Advertised name -> the server publishing it (derived from the publications). */
    this.owners = new Map();
    /**
     * Server -> the operator's prefix (contract 0.2.1); a server without one is named by
     * default. Apart from `servers`: it may come before the server's configuration.
     */
    this.namings = new Map();
  }

  /** The operator's prefix for `server`, or null for the default naming. */
  prefixOf(server) {
    const prefix = this.namings.get(server);
    return prefix === undefined ? null : prefix;
  }

  /**
   * The operator's naming of `server`: a prefix ("" for the server's own names), or null for
   * the default. Takes effect at the server's next publication (the host follows with
   * `server-configured`, which republishes a live server).
   */
  setNaming(server, prefix) {
    if (prefix === null || prefix === undefined) this.namings.delete(server);
    else this.namings.set(server, prefix);
    const how = prefix === null || prefix === undefined ? 'by default' : `with the prefix ${JSON.stringify(prefix)}`;
    this.log('debug', `server ${JSON.stringify(server)}: tools and prompts named ${how}`);
  }

  /**
   * The names agents see for `server`'s prompts, by the rule of its tools: [{ advertised,
   * original }], each original once. A pure query: nothing here changes the state. Where two
   * map to one name, the later in sorted order is salted, so a prompt's name does not depend on
   * the order the server lists them in.
   */
  namePrompts(server, originals) {
    const prefix = this.prefixOf(server);
    const unique = [...new Set(originals)];
    const chosen = new Map();
    const used = new Set();
    for (const original of [...unique].sort()) {
      let advertised = naturalName(server, original, prefix);
      for (let salt = 1; used.has(advertised); salt += 1) advertised = saltedName(server, original, salt, prefix);
      used.add(advertised);
      chosen.set(original, advertised);
    }
    return unique.map((original) => ({ advertised: chosen.get(original), original }));
  }

  /** A policy from settings JSON text ("" or "{}": the defaults). Throws a message. */
  static create(text) {
    return new WindowPolicy(parseSettings(text));
  }

  /** Drains the log records ([level, message]) buffered since the last call. */
  takeLogs() {
    const logs = this.logs;
    this.logs = [];
    return logs;
  }

  log(level, message) {
    if (this.logs.length < 256) this.logs.push([level, message]);
  }

  /** Replaces the settings, keeping all state; on error nothing changes. */
  setSettings(text) {
    const settings = parseSettings(text);
    const derived = [];
    for (const s of this.sortedServers()) {
      if (s.configError !== null) {
        derived.push([s, settings, s.filter]);
        continue;
      }
      try {
        const checked = this.check(s.config, settings);
        derived.push([s, checked.settings, checked.filter]);
      } catch (why) {
        throw `these settings would make the configuration of server ${JSON.stringify(s.name)} invalid: ${why}`;
      }
    }
    this.settings = settings;
    for (const [s, eff, filter] of derived) {
      s.settings = eff;
      s.filter = filter;
    }
    this.log('info', 'settings changed');
  }

  /** A server's effective settings and filter; throws a message when its configuration is invalid. */
  check(config, global = this.settings) {
    const settings = serverSettings(global, config.settings);
    const filter = compileFilters(config.include ?? [], config.exclude ?? []);
    return { settings, filter };
  }

  sortedServers() {
    return [...this.servers.keys()].sort().map((name) => this.servers.get(name));
  }

  // ----- the contract's entry points -----

  /** Feeds one event; returns the actions to execute, in order. */
  handle(event) {
    this.now = Math.max(this.now, event.now);
    const out = [];
    const { tag, val } = event.kind;
    switch (tag) {
      case 'server-configured':
        this.onConfigured(val, out);
        break;
      case 'server-removed':
        this.onRemoved(val, out);
        break;
      case 'connected':
        this.onConnected(val, out);
        break;
      case 'connect-failed':
        this.onConnectFailed(val, out);
        break;
      case 'disconnected':
        this.onDisconnected(val, out);
        break;
      case 'tools-changed':
        this.onToolsChanged(val, out);
        break;
      case 'keepalive-ok':
        this.prove(this.servers.get(val), 'a keepalive', out);
        break;
      case 'keepalive-failed':
        this.onKeepaliveFailed(val);
        break;
      case 'call-finished':
        this.onCallFinished(val, out);
        break;
      case 'timer':
        this.onTimer(val, out);
        break;
      case 'reconnect-requested':
        this.onReconnect(val, out);
        break;
      case 'shutdown':
        this.onShutdown(out);
        break;
      default:
        this.log('warn', `ignoring an event of unknown kind ${JSON.stringify(tag)}`);
    }
    return out;
  }

  /** Decides whether a tool call may be made. */
  admit(request) {
    this.now = Math.max(this.now, request.now);
    const now = this.now;
    const name = request.server;
    const s = this.servers.get(name);
    if (!s) return { tag: 'reject', val: words.unknown(name) };
    switch (s.state) {
      case 'stopped':
        return { tag: 'reject', val: words.stopped(name) };
      case 'parked':
        if (s.configError !== null) return { tag: 'reject', val: words.misconfigured(name) };
        return {
          tag: 'reject',
          val: words.parked(name, s.lastSummary, s.wake ? Math.max(0, s.wake.at - now) : null),
        };
      case 'connecting': {
        const message = s.lastSummary ? words.reconnecting(name, s.lastSummary, null) : words.connecting(name);
        const hold = s.settings.hold_ms;
        // An attempt is in flight: wait for its session rather than fail the call.
        if (hold > 0) return { tag: 'hold', val: { waitMs: hold, message } };
        return { tag: 'reject', val: message };
      }
      case 'backing-off': {
        if (claimReconnectProbe(s.breaker, now, s.settings.breaker)) {
          this.log('info', `server ${JSON.stringify(name)}: the half-open probe finds no session; signalling a reconnect`);
          return { tag: 'reconnect', val: words.probeReconnect(name, s.lastSummary) };
        }
        const wait = s.wake ? Math.max(0, s.wake.at - now) : null;
        const message = words.reconnecting(name, s.lastSummary, wait);
        const hold = s.settings.hold_ms;
        // The next attempt is due soon: wait for it (and for its handshake) instead.
        if (hold > 0 && wait !== null && wait <= hold) {
          return { tag: 'hold', val: { waitMs: Math.min(wait + hold, MAX_HOLD_MS), message } };
        }
        return { tag: 'reject', val: message };
      }
      default: {
        // connected or healthy
        const b = s.breaker;
        const state = breakerState(b, now);
        if (state === 'closed') return { tag: 'allow' };
        if (state === 'open') {
          return { tag: 'reject', val: words.breakerOpen(name, b.failures, b.reason, b.until - now) };
        }
        if (claimCallProbe(b, now, request.callId, s.settings.breaker)) {
          this.log('info', `server ${JSON.stringify(name)}: call ${request.callId} is the half-open probe`);
          return { tag: 'probe' };
        }
        return { tag: 'reject', val: words.probing(name) };
      }
    }
  }

  /** Every server's status at host time `now` (never before the latest time seen), by name. */
  status(now) {
    const at = Math.max(now, this.now);
    return this.sortedServers().map((s) => {
      const b = s.breaker;
      return {
        server: s.name,
        state: s.state,
        breaker: breakerState(b, at),
        failures: s.failures,
        breakerFailures: b.failures,
        toolErrors: s.toolErrors,
        lastFault: s.lastFault ?? undefined,
        since: s.since,
        publishedTools: s.published.length,
        nextAttemptAt: s.wake ? s.wake.at : undefined,
        breakerUntil: b.open && at < b.until ? b.until : undefined,
      };
    });
  }

  /**
   * Adopts another implementation's state on a fresh instance: live sessions kept and
   * published, attempts in flight awaited, planned attempts re-armed, counts and breakers
   * carried over. Returns the actions; throws a message (and changes nothing) on error.
   */
  takeOver(handover) {
    if (this.servers.size > 0) throw 'take-over needs a fresh instance that knows no server yet';
    const seen = new Set();
    for (const h of handover.servers) {
      const name = h?.config?.name;
      if (typeof name !== 'string' || name === '') throw 'the handover has a server without a name';
      if (seen.has(name)) throw `the handover names server ${JSON.stringify(name)} twice`;
      seen.add(name);
    }
    const scratch = new WindowPolicy(this.settings);
    scratch.now = Math.max(this.now, handover.now);
    scratch.nextToken = this.nextToken;
    scratch.namings = this.namings; // given before the handover (set-naming)
    const out = [];
    for (const h of handover.servers) scratch.adopt(h, handover.previous, out);
    const previous = handover.previous ?? {};
    scratch.log(
      'info',
      `took over ${handover.servers.length} servers from ${previous.name ?? 'another policy'} ${previous.version ?? ''}`.trim(),
    );
    this.servers = scratch.servers;
    this.owners = scratch.owners;
    this.now = scratch.now;
    this.nextToken = scratch.nextToken;
    this.logs.push(...scratch.takeLogs());
    return out;
  }

  // ----- events -----

  onConfigured(config, out) {
    const name = config.name;
    let checked = null;
    let error = null;
    try {
      checked = this.check(config);
    } catch (why) {
      error = String(why);
    }
    let s = this.servers.get(name);
    if (!s) {
      s = derive(newServer(config, this.now), checked ? checked.settings : this.settings, checked ? checked.filter : NONE);
      this.servers.set(name, s);
      if (error !== null) {
        s.configError = error;
        this.log('error', `server ${JSON.stringify(name)}: ${error}`);
        this.park(s, out, `invalid configuration: ${error}`, false);
        return;
      }
      out.push(change(name, 'connecting', 'configured; connecting'));
      out.push(connect(name));
      return;
    }
    if (s.state === 'stopped') {
      this.log('debug', `server ${JSON.stringify(name)}: configuration ignored after shutdown`);
      return;
    }
    s.config = newServer(config, 0).config;
    if (error !== null) {
      if (s.state === 'parked' && s.configError === error) return;
      s.configError = error;
      s.settings = this.settings;
      s.filter = NONE;
      this.log('error', `server ${JSON.stringify(name)}: ${error}`);
      this.park(s, out, `invalid configuration: ${error}`, false);
      return;
    }
    const wasBroken = s.configError !== null;
    s.configError = null;
    s.settings = checked.settings;
    s.filter = checked.filter;
    if (wasBroken && !s.session && s.state !== 'connecting') {
      // Parked (or waiting) for its configuration, with no session and no attempt in flight.
      this.startAttempt(s, 'configuration fixed; connecting', out);
    } else if (s.session) {
      // The filters may have changed: publishes only a difference.
      this.publish(s, out);
    }
  }

  onRemoved(name, out) {
    this.namings.delete(name); // the naming ends with the server, known or not
    const s = this.servers.get(name);
    if (!s) {
      this.log('debug', `ignoring the removal of unknown server ${JSON.stringify(name)}`);
      return;
    }
    this.withdraw(s, out);
    out.push(disconnect(name));
    out.push(change(name, 'stopped', 'removed from the configuration'));
    this.servers.delete(name);
    this.log('info', `server ${JSON.stringify(name)} removed`);
  }

  onConnected(session, out) {
    const name = session.server;
    const s = this.servers.get(name);
    if (!s) {
      this.log('debug', `ignoring a session of unknown server ${JSON.stringify(name)}`);
      return;
    }
    if (s.state === 'stopped') {
      // Not asked for: do not let it linger.
      out.push(disconnect(name));
      this.log('warn', `server ${JSON.stringify(name)}: closing a session that was not asked for`);
      return;
    }
    if (s.configError !== null) {
      // An attempt made while the configuration is invalid (one a handover said was in
      // flight): nothing may be published, so close it and park until the configuration is fixed.
      out.push(disconnect(name));
      this.log('warn', `server ${JSON.stringify(name)}: closing a session of a server whose configuration is invalid`);
      this.park(s, out, `invalid configuration: ${s.configError}`, false);
      return;
    }
    const info = clip(session.serverInfo, MAX_INFO);
    s.session = { info, tools: keepTools(session.tools), proven: false };
    s.wake = null;
    // A fresh session is new evidence: the breaker starts closed.
    s.breaker = closedBreaker();
    const changed = this.enter(s, 'connected');
    this.publish(s, out);
    if (changed) out.push(change(name, 'connected', `session established (${info}); not yet proven`));
  }

  onConnectFailed({ server: name, fault }, out) {
    const s = this.servers.get(name);
    if (!s || s.state !== 'connecting') {
      this.log('debug', `ignoring a connect failure of ${JSON.stringify(name)}: no attempt in flight`);
      return;
    }
    this.fail(s, fault, out);
  }

  onDisconnected({ server: name, fault }, out) {
    const s = this.servers.get(name);
    if (!s || !s.session) {
      this.log('debug', `ignoring a disconnect of ${JSON.stringify(name)}: no live session`);
      return;
    }
    s.session = null;
    this.withdraw(s, out);
    // A proven session reset the window, so this is failure #1; an unproven one adds to it.
    this.fail(s, fault, out);
  }

  onToolsChanged({ server: name, tools }, out) {
    const s = this.servers.get(name);
    if (!s || !s.session) {
      this.log('debug', `ignoring a tool list of ${JSON.stringify(name)}: no live session`);
      return;
    }
    s.session.tools = keepTools(tools);
    this.publish(s, out);
  }

  onKeepaliveFailed({ server: name, fault }) {
    const s = this.servers.get(name);
    if (!s) return;
    // Only noted: a `disconnected` follows if the host tears the session down.
    s.lastFault = describeFault(fault);
    s.lastSummary = summarize(fault);
    this.log('info', `server ${JSON.stringify(name)}: ${s.lastFault}`);
  }

  onCallFinished(report, out) {
    const name = report.server;
    const s = this.servers.get(name);
    if (!s) return;
    const b = s.breaker;
    const bs = s.settings.breaker;
    const { tag, val } = report.outcome;
    let opened = null;
    let closed = null;
    let answered = false;
    switch (tag) {
      case 'ok':
        s.toolErrors = 0;
        closed = onCallAnswered(b, report.callId);
        answered = true;
        break;
      case 'tool-error':
        // The server works; the arguments were wrong. Counted apart, never opens the breaker.
        s.toolErrors += 1;
        closed = onCallAnswered(b, report.callId);
        answered = true;
        break;
      case 'transport-error':
        s.lastFault = describeFault(val);
        s.lastSummary = summarize(val);
        opened = onCallFailure(b, this.now, report.callId, bs);
        break;
      case 'timeout':
        s.lastFault = 'a call timed out';
        s.lastSummary = { tag: 'call-timeout', code: null };
        opened = onCallFailure(b, this.now, report.callId, bs);
        break;
      case 'cancelled':
        onCallCancelled(b, report.callId);
        break;
      default:
        break;
    }
    if (opened) {
      const why = opened.reason === 'probe-failed' ? 'its test call failed' : `${b.failures} consecutive call failures`;
      out.push(change(name, s.state, `circuit breaker open for ${opSecs(opened.opened)} (${why})`));
    }
    if (closed) out.push(change(name, s.state, 'circuit breaker closed: its test call was answered'));
    if (answered) this.prove(s, 'an answered call', out);
  }

  onTimer({ server: name, token }, out) {
    const s = this.servers.get(name);
    if (!s || !s.wake || s.wake.token !== token) {
      this.log('debug', `ignoring a stale timer of ${JSON.stringify(name)}`);
      return;
    }
    s.wake = null;
    if (s.state === 'backing-off') {
      this.startAttempt(s, `backoff over; attempt ${s.failures + 1}`, out);
    } else if (s.state === 'parked') {
      this.selfProbe(s, 'self-probe', out);
    }
  }

  onReconnect({ server: name, source }, out) {
    const s = this.servers.get(name);
    if (!s) return;
    const who = `reconnect requested by the ${source}`;
    switch (s.state) {
      case 'backing-off':
        this.startAttempt(s, who, out);
        return;
      case 'parked':
        if (source === 'agent' && s.lastSummary && s.configError === null) {
          if (faultClass({ tag: s.lastSummary.tag }, s.settings) === 'permanent') {
            // An agent cannot fix credentials or a missing binary; the self-probe and operators can.
            this.log('info', `server ${JSON.stringify(name)}: ${who} ignored: parked by a permanent fault`);
            return;
          }
        }
        this.selfProbe(s, who, out);
        return;
      case 'connected':
      case 'healthy':
        if (source === 'agent' && s.session.proven && !s.breaker.open) {
          this.log('info', `server ${JSON.stringify(name)}: ${who} ignored: its session is proven and healthy`);
          return;
        }
        // The host tears the old session down before connecting again.
        s.session = null;
        this.withdraw(s, out);
        this.startAttempt(s, `${who}; replacing the session`, out);
        return;
      default:
        // connecting (an attempt is in flight) or stopped
        this.log('debug', `server ${JSON.stringify(name)}: ${who} ignored while ${s.state}`);
    }
  }

  onShutdown(out) {
    for (const s of this.sortedServers()) {
      if (s.state === 'stopped') continue;
      this.withdraw(s, out);
      s.session = null;
      s.wake = null;
      s.reviving = false;
      this.enter(s, 'stopped');
      out.push(disconnect(s.name));
      out.push(change(s.name, 'stopped', 'host shutting down'));
    }
    this.log('info', 'shutdown: every server stopped');
  }

  // ----- supervision -----

  enter(s, state) {
    if (s.state === state) return false;
    s.state = state;
    s.since = this.now;
    return true;
  }

  /** A `wake-at` at host time `at`, superseding the server's earlier ones. */
  armAt(s, at) {
    this.nextToken += 1;
    s.wake = { at, token: this.nextToken };
    return { tag: 'wake-at', val: { server: s.name, at, token: this.nextToken } };
  }

  startAttempt(s, detail, out) {
    s.wake = null;
    this.enter(s, 'connecting');
    out.push(change(s.name, 'connecting', detail));
    out.push(connect(s.name));
  }

  /** The session answered: the window and the failure count reset, a revival succeeded. */
  prove(s, how, out) {
    if (!s || !s.session) return;
    if (!s.session.proven) {
      s.session.proven = true;
      s.failures = 0;
      s.window = [];
      s.reviving = false;
      s.probeMs = 0;
      s.parkReason = null;
    }
    if (this.enter(s, 'healthy')) out.push(change(s.name, 'healthy', `session proven by ${how}`));
  }

  /** An attempt failed or a session ended: back off, or park. */
  fail(s, fault, out) {
    const now = this.now;
    const w = s.settings.window;
    s.lastFault = describeFault(fault);
    s.lastSummary = summarize(fault);
    s.failures += 1;
    s.window = s.window.filter((t) => t > now - w.ms);
    s.window.push(now);
    const reopened = onAttemptFailed(s.breaker, now, s.settings.breaker);
    if (reopened) this.log('info', `server ${JSON.stringify(s.name)}: the probe's reconnect failed; breaker open again`);
    const cls = faultClass(fault, s.settings);
    if (s.configError !== null) {
      // No attempt is made while the configuration is invalid: park until it is fixed (the
      // self-probe re-checks it).
      this.park(s, out, `invalid configuration: ${s.configError}`, false);
    } else if (cls === 'permanent') {
      this.park(s, out, `permanent fault: ${s.lastFault}`, s.reviving);
    } else if (s.reviving) {
      this.park(s, out, `self-probe failed: ${s.lastFault}`, true);
    } else if (s.window.length >= w.failures) {
      const why = `${s.window.length} failures within ${opSecs(w.ms)} without a proven session (last: ${s.lastFault})`;
      this.park(s, out, why, false);
    } else {
      const delay = retryDelay(s.settings, cls, s.failures, s.name);
      this.enter(s, 'backing-off');
      const detail =
        `${s.lastFault}; failure ${s.window.length} of ${w.failures} within ${opSecs(w.ms)}; ` +
        `next attempt in ${opSecs(delay)}`;
      out.push(change(s.name, 'backing-off', detail));
      out.push(this.armAt(s, now + delay));
    }
  }

  /** Parks: tools withdrawn, session closed if any, a slow self-probe armed. Never final. */
  park(s, out, reason, grow) {
    this.withdraw(s, out);
    if (s.session) {
      s.session = null;
      out.push(disconnect(s.name));
    }
    s.reviving = false;
    const p = s.settings.park;
    if (s.probeMs === 0) s.probeMs = p.probe_ms;
    else if (grow) s.probeMs = Math.min(s.probeMs * 2, p.probe_max_ms);
    s.probeMs = Math.min(Math.max(s.probeMs, p.probe_ms), p.probe_max_ms);
    s.parks += 1;
    const delay = probeDelay(s.settings, s.probeMs, s.name, s.parks);
    s.parkReason = reason;
    this.enter(s, 'parked');
    this.log('info', `server ${JSON.stringify(s.name)} parked: ${reason}`);
    out.push(change(s.name, 'parked', `parked: ${reason}; next self-probe in ${opSecs(delay)}`));
    out.push(this.armAt(s, this.now + delay));
  }

  /** Leaves parked with one attempt (or, for a broken configuration, a re-check of it). */
  selfProbe(s, why, out) {
    if (s.configError !== null) {
      try {
        const checked = this.check(s.config);
        s.configError = null;
        s.settings = checked.settings;
        s.filter = checked.filter;
        this.startAttempt(s, `${why}: the configuration is valid now; connecting`, out);
      } catch (error) {
        s.configError = String(error);
        this.park(s, out, `invalid configuration: ${s.configError}`, true);
      }
      return;
    }
    s.reviving = true;
    this.startAttempt(s, `${why}: one attempt`, out);
  }

  // ----- tools -----

  /** Hides the server's tools if any are visible: the one place a withdrawal is emitted. */
  withdraw(s, out) {
    const old = s.published;
    if (old.length === 0) return;
    for (let i = 0; i < old.length; i += 1) this.owners.delete(old[i].advertised);
    s.published = [];
    out.push(withdrawTools(s.name));
  }

  /**
   * Computes what the server may show and publishes it only if it differs from what is shown
   * (names, read-only, revision; order does not matter). A tool keeps the name it is shown
   * under; a new one gets its natural name, salted while another tool or server holds that.
   * One pass over the list, no sorting: this runs in an interpreter, per tool.
   */
  publish(s, out) {
    if (!s.session) return;
    const old = s.published;
    const prefix = this.prefixOf(s.name);
    const before = new Map();
    // Names shown are kept only under the naming they were given by: a new naming renames.
    if (s.namedBy === prefix) for (let i = 0; i < old.length; i += 1) before.set(old[i].original, old[i]);
    s.namedBy = prefix;
    const filter = s.filter;
    const tools = s.session.tools;
    const seen = new Set();
    const used = new Set();
    const next = [];
    const fresh = [];
    let same = true;
    for (let i = 0; i < tools.length; i += 1) {
      const t = tools[i];
      const name = t.name;
      if (name === '' || seen.has(name) || (filter !== null && !filter(name))) continue;
      seen.add(name);
      const was = before.get(name);
      if (was === undefined) {
        fresh.push(t);
        continue;
      }
      used.add(was.advertised);
      next.push({ advertised: was.advertised, original: name, readOnly: t.readOnly, revision: t.revision });
      if (was.readOnly !== t.readOnly || was.revision !== t.revision) same = false;
    }
    if (same && fresh.length === 0 && next.length === old.length) return;
    const owners = this.owners;
    const me = s.name;
    for (let i = 0; i < fresh.length; i += 1) {
      const t = fresh[i];
      let advertised = naturalName(me, t.name, prefix);
      for (let salt = 1; ; salt += 1) {
        const owner = owners.get(advertised);
        if (!used.has(advertised) && (owner === undefined || owner === me)) break;
        advertised = saltedName(me, t.name, salt, prefix);
      }
      used.add(advertised);
      next.push({ advertised, original: t.name, readOnly: t.readOnly, revision: t.revision });
    }
    if (next.length === 0) {
      this.withdraw(s, out);
      return;
    }
    for (let i = 0; i < old.length; i += 1) {
      if (!used.has(old[i].advertised)) owners.delete(old[i].advertised);
    }
    const shown = new Array(next.length);
    for (let i = 0; i < next.length; i += 1) {
      const t = next[i];
      owners.set(t.advertised, me);
      shown[i] = { advertised: t.advertised, original: t.original, readOnly: t.readOnly };
    }
    s.published = next;
    out.push({ tag: 'publish-tools', val: { server: me, tools: shown } });
  }

  // ----- take-over -----

  adopt(h, previous, out) {
    const now = this.now;
    const config = h.config;
    let checked = null;
    let error = null;
    try {
      checked = this.check(config);
    } catch (why) {
      error = String(why);
    }
    const s = derive(newServer(config, Math.min(h.since, now)), checked ? checked.settings : this.settings, checked ? checked.filter : NONE);
    s.failures = h.failures;
    s.toolErrors = h.toolErrors;
    s.lastFault = h.lastFault ?? null;
    s.window = new Array(Math.min(h.failures, s.settings.window.failures - 1)).fill(now);
    const bs = s.settings.breaker;
    const b = s.breaker;
    b.failures = h.breakerFailures;
    if (h.breaker === 'open') {
      b.open = true;
      b.until = h.breakerUntil ?? now + bs.cooldown_ms;
      b.cooldownMs = Math.min(Math.max(b.until - now, bs.cooldown_ms), bs.cooldown_max_ms);
      b.reason = 'failures';
    } else if (h.breaker === 'half-open') {
      b.open = true;
      b.until = Math.min(h.breakerUntil ?? now, now);
      b.cooldownMs = bs.cooldown_ms;
      b.reason = 'failures';
    }
    this.servers.set(s.name, s);
    if (h.session) {
      // The host keeps the session: never connect or disconnect it here.
      s.session = {
        info: clip(h.session.serverInfo, MAX_INFO),
        tools: keepTools(h.session.tools),
        proven: Boolean(h.session.proven),
      };
      s.state = s.session.proven ? 'healthy' : 'connected';
      if (s.session.proven) s.window = [];
      if (error !== null) {
        // Fail closed: nothing published while the configuration is invalid.
        s.configError = error;
        this.log('error', `server ${JSON.stringify(s.name)}: ${error}; its session is kept, its tools hidden`);
      } else {
        this.publish(s, out);
      }
    } else if (h.connecting) {
      // Its outcome arrives as an event; a parked server's attempt is its self-probe.
      s.state = 'connecting';
      s.reviving = h.state === 'parked';
      if (error !== null) s.configError = error;
    } else if (error !== null) {
      s.configError = error;
      this.park(s, out, `invalid configuration: ${error}`, false);
    } else if (h.state === 'stopped') {
      s.state = 'stopped';
    } else if (h.state === 'parked') {
      s.state = 'parked';
      s.probeMs = s.settings.park.probe_ms;
      s.parkReason = `parked by ${previous?.name ?? 'the previous policy'}`;
      const at = h.nextAttemptAt ?? now + s.probeMs;
      out.push(this.armAt(s, Math.max(at, now)));
    } else {
      // Waiting for its next attempt (or the previous policy's attempt never went out).
      s.state = 'backing-off';
      if (h.nextAttemptAt !== undefined && h.nextAttemptAt !== null && h.nextAttemptAt > now) {
        out.push(this.armAt(s, h.nextAttemptAt));
      } else {
        this.startAttempt(s, 'taken over; attempting now', out);
      }
    }
  }
}
