// Advertised tool (and prompt) names: `<server>__<tool>`, restricted to [A-Za-z0-9_-] and 64
// characters. An operator's prefix (contract 0.2.1 `set-naming`) replaces `<server>__`: `""`
// gives the server's own names, `"x-"` gives `x-<tool>`, made usable by the same rules.
//
// A name that can be shown as it is (nothing replaced, short enough) is shown as it is. A name
// that had to be changed (characters replaced, or clamped) ends in `-` and 8 hex digits of a
// hash of the *unchanged* server and tool names, so two tools that sanitize alike stay apart.
// A name that is still taken (by another tool of the server, or by another server) is salted:
// the hash is taken again with a counter until it is free (machine.js keeps who holds which
// name, and lets a tool keep the name it was published under). Which name a tool gets depends
// only on the inputs in order, never on a clock or a random number.

export const MAX_NAME = 64;
const SUFFIX = 9; // '-' + 8 hex digits
const VALID = /^[A-Za-z0-9_-]{1,64}$/;

/** Whether agents can use `name` as a tool name. */
export function isUsable(name) {
  return typeof name === 'string' && VALID.test(name);
}

/** Replaces every run of characters outside [A-Za-z0-9_-] with one `_`. */
export function sanitize(text) {
  return text.replace(/[^A-Za-z0-9_-]+/gu, '_');
}

/**
 * FNV-1a, 32 bits, over the UTF-16LE code units of `parts`, each part followed by a zero
 * unit. (Code units, not UTF-8: native string access only, which a JS engine in a WebAssembly
 * sandbox runs far more cheaply than encoding by hand.)
 */
export function fnv1a32(parts) {
  let hash = 0x811c9dc5;
  for (let p = 0; p < parts.length; p += 1) {
    const text = String(parts[p]);
    for (let i = 0; i < text.length; i += 1) {
      const unit = text.charCodeAt(i);
      hash = Math.imul(hash ^ (unit & 0xff), 0x01000193);
      hash = Math.imul(hash ^ (unit >>> 8), 0x01000193);
    }
    hash = Math.imul(hash, 0x01000193); // the zero unit's low byte
    hash = Math.imul(hash, 0x01000193); // and its high byte
  }
  return hash >>> 0;
}

function hex8(n) {
  return (n >>> 0).toString(16).padStart(8, '0');
}

/** What a name is made of: the operator's prefix (null: the default, `<server>__`) and the name. */
const joined = (server, tool, prefix) => (prefix === null ? `${server}__${tool}` : `${prefix}${tool}`);

// The hash is of the server and the tool, never the prefix: the server already tells two
// servers under one prefix apart.
function hashed(server, tool, salt, prefix) {
  const base = sanitize(joined(server, tool, prefix)).slice(0, MAX_NAME - SUFFIX);
  const parts = salt === 0 ? [server, tool] : [server, tool, String(salt)];
  return `${base}-${hex8(fnv1a32(parts))}`;
}

/**
 * The name `tool` of `server` gets when nothing else claims it, under the operator's `prefix`
 * (null: the default naming): the plain `<prefix><tool>` when that is usable as it is, else the
 * sanitized, clamped form with a hash suffix (also when it is empty: prefix "" and name "").
 */
export function naturalName(server, tool, prefix = null) {
  const raw = joined(server, tool, prefix);
  if (isUsable(raw)) return raw;
  return hashed(server, tool, 0, prefix);
}

/** The `salt`-th alternative name (salt >= 1), for when the natural one is taken. */
export function saltedName(server, tool, salt, prefix = null) {
  return hashed(server, tool, salt, prefix);
}
