// Faults: their class (which decides the backoff), words for operators and words for agents.
//
// A fault is `{ tag, val }` as the contract's bindings give it (tag: the WIT case name).

/** The backoff class of each retryable fault kind; the `permanent` setting overrides. */
const CLASS = {
  'spawn-failed': 'crash',
  'handshake-failed': 'handshake',
  'handshake-timed-out': 'handshake',
  'auth-required': 'network',
  'not-mcp-endpoint': 'handshake',
  'process-exited': 'crash',
  'transport-closed': 'network',
  'session-expired': 'network',
  'keepalive-failed': 'network',
};

/** 'permanent' when the settings say another attempt cannot help, else the backoff class. */
export function faultClass(fault, settings) {
  if (settings.permanent.includes(fault.tag)) return 'permanent';
  return CLASS[fault.tag] ?? 'network';
}

const MAX_TEXT = 200;

/** `text` shortened to `max` UTF-16 units (and `...`) when longer. */
export function clip(text, max = MAX_TEXT) {
  const s = String(text ?? '');
  return s.length > max ? `${s.slice(0, max)}...` : s;
}

/** For operators (status, state changes): may include the host's text. */
export function describeFault(fault) {
  switch (fault.tag) {
    case 'spawn-failed':
      return `spawn failed: ${clip(fault.val)}`;
    case 'handshake-failed':
      return `handshake failed: ${clip(fault.val)}`;
    case 'handshake-timed-out':
      return 'handshake timed out';
    case 'auth-required':
      return `authorization required (HTTP ${fault.val})`;
    case 'not-mcp-endpoint':
      return `not an MCP endpoint: ${clip(fault.val)}`;
    case 'process-exited':
      return fault.val === undefined || fault.val === null
        ? 'process killed by a signal'
        : `process exited with code ${fault.val}`;
    case 'transport-closed':
      return `transport closed: ${clip(fault.val)}`;
    case 'session-expired':
      return 'session expired';
    case 'keepalive-failed':
      return `keepalive failed: ${clip(fault.val)}`;
    default:
      return `unknown fault ${clip(fault.tag)}`;
  }
}

/**
 * For agents: the category only, never the host's text (which may carry paths, URLs or
 * credentials). Works on the stored `{ tag, code }` summary of a fault.
 */
export function faultPhrase(summary) {
  switch (summary.tag) {
    case 'spawn-failed':
      return 'its process could not be started';
    case 'handshake-failed':
      return 'its MCP handshake failed';
    case 'handshake-timed-out':
      return 'its MCP handshake timed out';
    case 'auth-required':
      return `it requires authorization (HTTP ${summary.code})`;
    case 'not-mcp-endpoint':
      return 'its endpoint does not speak MCP';
    case 'process-exited':
      return summary.code === null ? 'its process was killed' : `its process exited with code ${summary.code}`;
    case 'transport-closed':
      return 'its connection closed';
    case 'session-expired':
      return 'its session expired';
    case 'keepalive-failed':
      return 'it stopped answering keepalives';
    case 'call-timeout':
      return 'calls to it timed out';
    default:
      return 'it failed';
  }
}

/** What is kept of a fault for agents' words: its kind and, for two kinds, a number. */
export function summarize(fault) {
  const code =
    fault.tag === 'auth-required' || fault.tag === 'process-exited'
      ? (fault.val === undefined ? null : fault.val)
      : null;
  return { tag: fault.tag, code };
}
