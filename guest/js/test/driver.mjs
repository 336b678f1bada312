// A test driver for the logic (no wasm): virtual time, the latest timer per server, call ids.
// Not a test file itself; the *.test.mjs files use it.

import { WindowPolicy } from '../src/machine.js';

export const tool = (name, revision = '1', readOnly = false) => ({ name, readOnly, revision });

export const config = (name, include = [], exclude = [], settings = '') => ({
  name,
  transport: 'stdio',
  include,
  exclude,
  settings,
});

export const faults = {
  closed: { tag: 'transport-closed', val: 'connection reset' },
  exited: { tag: 'process-exited', val: 1 },
  timedOut: { tag: 'handshake-timed-out' },
  spawn: { tag: 'spawn-failed', val: 'No such file or directory' },
  auth: { tag: 'auth-required', val: 401 },
  expired: { tag: 'session-expired' },
};

export class Driver {
  constructor(settings = '') {
    this.p = WindowPolicy.create(settings);
    this.now = 1000;
    this.wakes = new Map();
    this.nextCall = 1;
  }

  event(tag, val) {
    const actions = this.p.handle({ now: this.now, kind: { tag, val } });
    for (const a of actions) if (a.tag === 'wake-at') this.wakes.set(a.val.server, a.val);
    return actions;
  }

  configure(name, include = [], exclude = [], settings = '') {
    return this.event('server-configured', config(name, include, exclude, settings));
  }

  connected(name, tools = ['work']) {
    const list = tools.map((t) => (typeof t === 'string' ? tool(t) : t));
    return this.event('connected', { server: name, serverInfo: 'test 1.0', tools: list });
  }

  toolsChanged(name, tools) {
    const list = tools.map((t) => (typeof t === 'string' ? tool(t) : t));
    return this.event('tools-changed', { server: name, tools: list });
  }

  connectFailed(name, fault = faults.closed) {
    return this.event('connect-failed', { server: name, fault });
  }

  disconnected(name, fault = faults.exited) {
    return this.event('disconnected', { server: name, fault });
  }

  keepaliveOk(name) {
    return this.event('keepalive-ok', name);
  }

  reconnect(name, source = 'operator') {
    return this.event('reconnect-requested', { server: name, source });
  }

  /** Fires the latest timer of `name`, moving time to it. Throws if none is armed. */
  fire(name) {
    const wake = this.wakes.get(name);
    if (!wake) throw new Error(`no timer armed for ${name}`);
    this.wakes.delete(name);
    this.now = Math.max(this.now, wake.at);
    return this.event('timer', { server: name, token: wake.token });
  }

  admit(name, toolName = 'work') {
    const callId = String(this.nextCall++);
    return { callId, admission: this.p.admit({ now: this.now, callId, server: name, tool: toolName }) };
  }

  finish(name, callId, outcome) {
    return this.event('call-finished', { server: name, callId, outcome, durationMs: 5 });
  }

  /** Admits a call and, if it is sent, finishes it with `outcome`; returns the admission. */
  call(name, outcome = { tag: 'ok' }) {
    const { callId, admission } = this.admit(name);
    if (admission.tag === 'allow' || admission.tag === 'probe') this.finish(name, callId, outcome);
    return admission;
  }

  status(name) {
    return this.p.status(this.now).find((s) => s.server === name);
  }

  state(name) {
    return this.status(name)?.state;
  }

  healthy(name, tools = ['work']) {
    this.configure(name);
    this.connected(name, tools);
    this.keepaliveOk(name);
  }
}

export const has = (actions, tag, server) =>
  actions.some((a) => a.tag === tag && (a.tag === 'wake-at' || a.tag === 'publish-tools' || a.tag === 'state-changed' ? a.val.server : a.val) === server);

export const count = (actions, tag, server) =>
  actions.filter((a) => a.tag === tag && (typeof a.val === 'string' ? a.val : a.val.server) === server).length;

export const publication = (actions, server) =>
  actions.filter((a) => a.tag === 'publish-tools' && a.val.server === server).at(-1)?.val;

export const transport = { tag: 'transport-error', val: faults.closed };
