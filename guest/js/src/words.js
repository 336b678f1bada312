// Words for agents (admission messages) and operators (state changes). Every message to an
// agent names the server, says that the call was not sent, and says what to do; it describes a
// fault by category only (faults.js), never with the host's text.

import { faultPhrase } from './faults.js';

const q = (server) => JSON.stringify(server);

/** Whole seconds, rounded up, at least 1. */
export function secs(ms) {
  return Math.max(1, Math.ceil(ms / 1000));
}

/** Seconds for operators: whole when exact, else one decimal. */
export function opSecs(ms) {
  return ms % 1000 === 0 ? `${ms / 1000} s` : `${(ms / 1000).toFixed(1)} s`;
}

const retry = (waitMs) =>
  waitMs === null || waitMs === undefined ? 'Retry in a few seconds.' : `Retry in about ${secs(waitMs)} s.`;

export const words = {
  unknown: (server) => `Server ${q(server)} is not configured on this gateway; the call was not sent.`,
  stopped: (server) => `Server ${q(server)} has been stopped; the call was not sent.`,
  parked: (server, summary, waitMs) =>
    `Server ${q(server)} is unavailable (${summary ? faultPhrase(summary) : 'it keeps failing'}); the call was not sent. ` +
    `It is checked again automatically${waitMs === null ? '' : ` in about ${secs(waitMs)} s`}; an operator can reconnect it sooner.`,
  misconfigured: (server) =>
    `Server ${q(server)} is unavailable: its configuration is invalid; the call was not sent. An operator must fix it.`,
  connecting: (server) => `Server ${q(server)} is connecting; the call was not sent. ${retry(null)}`,
  reconnecting: (server, summary, waitMs) =>
    `Server ${q(server)} is reconnecting${summary ? ` after ${faultPhrase(summary)}` : ''}; the call was not sent. ${retry(waitMs)}`,
  breakerOpen: (server, failures, reason, waitMs) => {
    const why =
      reason === 'probe-failed'
        ? 'a test call failed'
        : reason === 'reconnect-failed'
          ? 'a reconnect failed'
          : `${failures} consecutive calls failed in transport`;
    return `Server ${q(server)} is failing (${why}); calls are paused and this one was not sent. ${retry(waitMs)}`;
  },
  probing: (server) =>
    `Server ${q(server)} is being tested with a single call after failures; the call was not sent. ${retry(null)}`,
  probeReconnect: (server, summary) =>
    `Server ${q(server)} has no live session${summary ? ` (${faultPhrase(summary)})` : ''}; a reconnect was requested and the call was not sent. ${retry(null)}`,
};
