// The JSON encoding of the values of `wit/0.2/policy.wit` (docs/CONFORMANCE.md), and the
// conversion between that encoding and the values jco's bindings take and give.
//
// JSON side ("JSON values"): what `parse` returns and `stringify` prints. Records are objects
// with kebab-case keys in WIT order, variants `{tag, val}` (no `val` for a case without payload),
// enums strings, options `null` or the value, `list<u8>` base64 strings. Integers are Numbers,
// except those beyond 2^53 which are BigInts; every `u64` coming *out* of a policy is a BigInt.
//
// jco side: records with camelCase keys, variants `{tag, val}`, enums strings, options
// `undefined` or the value, u64 BigInt, u16/u32/s32 Number, list<u8> Uint8Array.
//
// No dependencies: usable without node_modules.

// ---------------------------------------------------------------------------------------------
// Exact JSON

/** Parses JSON text; integers beyond Number's safe range become BigInt (exactly). */
export function parse(text) {
  if (typeof text !== 'string') text = String(text);
  let i = 0;
  const n = text.length;
  const fail = (what) => {
    throw new SyntaxError(`invalid JSON at offset ${i}: ${what}`);
  };
  const ws = () => {
    while (i < n) {
      const c = text.charCodeAt(i);
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) i++;
      else break;
    }
  };
  const NUMBER = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/y;
  const STRING = /"(?:[^"\\\u0000-\u001f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"/y;
  const value = (depth) => {
    if (depth > 512) fail('nested too deeply');
    ws();
    if (i >= n) fail('unexpected end');
    const c = text[i];
    if (c === '{') {
      i++;
      const obj = {};
      ws();
      if (text[i] === '}') {
        i++;
        return obj;
      }
      for (;;) {
        ws();
        if (text[i] !== '"') fail('expected a key');
        const key = string();
        ws();
        if (text[i] !== ':') fail("expected ':'");
        i++;
        const v = value(depth + 1);
        if (key === '__proto__') {
          Object.defineProperty(obj, key, { value: v, enumerable: true, writable: true, configurable: true });
        } else {
          obj[key] = v;
        }
        ws();
        if (text[i] === ',') {
          i++;
          continue;
        }
        if (text[i] === '}') {
          i++;
          return obj;
        }
        fail("expected ',' or '}'");
      }
    }
    if (c === '[') {
      i++;
      const arr = [];
      ws();
      if (text[i] === ']') {
        i++;
        return arr;
      }
      for (;;) {
        arr.push(value(depth + 1));
        ws();
        if (text[i] === ',') {
          i++;
          continue;
        }
        if (text[i] === ']') {
          i++;
          return arr;
        }
        fail("expected ',' or ']'");
      }
    }
    if (c === '"') return string();
    if (c === 't' && text.startsWith('true', i)) {
      i += 4;
      return true;
    }
    if (c === 'f' && text.startsWith('false', i)) {
      i += 5;
      return false;
    }
    if (c === 'n' && text.startsWith('null', i)) {
      i += 4;
      return null;
    }
    NUMBER.lastIndex = i;
    const m = NUMBER.exec(text);
    if (!m) fail('unexpected character');
    i = NUMBER.lastIndex;
    if (m[1] === undefined && m[2] === undefined) {
      const num = Number(m[0]);
      return Number.isSafeInteger(num) ? num : BigInt(m[0]);
    }
    return Number(m[0]);
  };
  const string = () => {
    STRING.lastIndex = i;
    const m = STRING.exec(text);
    if (!m) fail('invalid string');
    i = STRING.lastIndex;
    return JSON.parse(m[0]);
  };
  const result = value(0);
  ws();
  if (i !== n) fail('trailing characters');
  return result;
}

/**
 * Prints a JSON value compactly (no spaces), object keys in insertion order, BigInt as plain
 * digits, strings as JSON.stringify escapes them (only what JSON requires: `"`, `\`, control
 * characters; `\b \f \n \r \t` short, the others `\u00xx`), so the output matches serde_json's
 * and Python's `json.dumps(..., ensure_ascii=False, separators=(",", ":"))`.
 */
export function stringify(v) {
  switch (typeof v) {
    case 'string':
      return JSON.stringify(v);
    case 'bigint':
      return v.toString();
    case 'number':
      if (!Number.isFinite(v)) throw new TypeError(`cannot encode ${v} in JSON`);
      return Number.isInteger(v) ? (Object.is(v, -0) ? '0' : BigInt(v).toString()) : String(v);
    case 'boolean':
      return v ? 'true' : 'false';
    case 'object': {
      if (v === null) return 'null';
      if (Array.isArray(v)) return '[' + v.map(stringify).join(',') + ']';
      if (v instanceof Uint8Array) return JSON.stringify(toBase64(v));
      const parts = [];
      for (const k of Object.keys(v)) {
        if (v[k] === undefined) throw new TypeError(`undefined value for key ${JSON.stringify(k)}`);
        parts.push(JSON.stringify(k) + ':' + stringify(v[k]));
      }
      return '{' + parts.join(',') + '}';
    }
    default:
      throw new TypeError(`cannot encode a ${typeof v} in JSON`);
  }
}

export function toBase64(bytes) {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('base64');
}

export function fromBase64(text, path = 'value') {
  if (typeof text !== 'string' || !/^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/.test(text)) {
    throw new TypeError(`${path}: expected a base64 string (standard alphabet, padded)`);
  }
  return new Uint8Array(Buffer.from(text, 'base64'));
}

// ---------------------------------------------------------------------------------------------
// The types of wit/0.2/policy.wit (package tether:policy@0.2.1; a component of 0.2.0 lacks
// `naming` and `named-prompt`), in WIT order.
// A type is a primitive name ('string', 'bool', 'u16', 'u32', 's32', 'u64', 'bytes' for list<u8>)
// or { record: [[field, type]...] } | { variant: [[case, type|null]...] } | { enum: [case...] }
// | { option: type } | { list: type }. test/wit-types.test.mjs checks this table against the WIT.

const record = (name, ...fields) => ({ name, record: fields });
const variant = (name, ...cases) => ({ name, variant: cases.map((c) => (c.length === 1 ? [c[0], null] : c)) });
const enumeration = (name, ...cases) => ({ name, enum: cases });
const option = (t) => ({ option: t });
const list = (t) => ({ list: t });

const millis = 'u64';
const transportKind = enumeration('transport-kind', 'stdio', 'streamable-http', 'sse');
const fault = variant(
  'fault',
  ['spawn-failed', 'string'],
  ['handshake-failed', 'string'],
  ['handshake-timed-out'],
  ['auth-required', 'u16'],
  ['not-mcp-endpoint', 'string'],
  ['process-exited', option('s32')],
  ['transport-closed', 'string'],
  ['session-expired'],
  ['keepalive-failed', 'string'],
);
const tool = record('tool', ['name', 'string'], ['read-only', 'bool'], ['revision', 'u64']);
const serverConfig = record(
  'server-config',
  ['name', 'string'],
  ['transport', transportKind],
  ['include', list('string')],
  ['exclude', list('string')],
  ['settings', 'string'],
);
const sessionInfo = record('session-info', ['server', 'string'], ['server-info', 'string'], ['tools', list(tool)]);
const serverFault = record('server-fault', ['server', 'string'], ['fault', fault]);
const serverTools = record('server-tools', ['server', 'string'], ['tools', list(tool)]);
const callOutcome = variant(
  'call-outcome',
  ['ok'],
  ['tool-error', 'string'],
  ['transport-error', fault],
  ['timeout'],
  ['cancelled'],
);
const callReport = record(
  'call-report',
  ['server', 'string'],
  ['call-id', 'u64'],
  ['outcome', callOutcome],
  ['duration-ms', 'u64'],
);
const reconnectSource = enumeration('reconnect-source', 'operator', 'agent', 'probe');
const reconnectRequest = record('reconnect-request', ['server', 'string'], ['source', reconnectSource]);
const timerFired = record('timer-fired', ['server', 'string'], ['token', 'u64']);
const eventKind = variant(
  'event-kind',
  ['server-configured', serverConfig],
  ['server-removed', 'string'],
  ['connected', sessionInfo],
  ['connect-failed', serverFault],
  ['disconnected', serverFault],
  ['tools-changed', serverTools],
  ['keepalive-ok', 'string'],
  ['keepalive-failed', serverFault],
  ['call-finished', callReport],
  ['timer', timerFired],
  ['reconnect-requested', reconnectRequest],
  ['shutdown'],
);
const event = record('event', ['now', millis], ['kind', eventKind]);
const publishedTool = record('published-tool', ['advertised', 'string'], ['original', 'string'], ['read-only', 'bool']);
const publication = record('publication', ['server', 'string'], ['tools', list(publishedTool)]);
const wake = record('wake', ['server', 'string'], ['at', millis], ['token', 'u64']);
const serverState = enumeration('server-state', 'connecting', 'connected', 'healthy', 'backing-off', 'parked', 'stopped');
const breakerState = enumeration('breaker-state', 'closed', 'open', 'half-open');
const stateChange = record('state-change', ['server', 'string'], ['state', serverState], ['detail', 'string']);
const action = variant(
  'action',
  ['connect', 'string'],
  ['disconnect', 'string'],
  ['wake-at', wake],
  ['publish-tools', publication],
  ['withdraw-tools', 'string'],
  ['state-changed', stateChange],
);
const callRequest = record('call-request', ['now', millis], ['call-id', 'u64'], ['server', 'string'], ['tool', 'string']);
const hold = record('hold', ['wait-ms', 'u64'], ['message', 'string']);
const admission = variant('admission', ['allow'], ['probe'], ['reject', 'string'], ['reconnect', 'string'], ['hold', hold]);
const serverStatus = record(
  'server-status',
  ['server', 'string'],
  ['state', serverState],
  ['breaker', breakerState],
  ['failures', 'u32'],
  ['breaker-failures', 'u32'],
  ['tool-errors', 'u32'],
  ['last-fault', option('string')],
  ['since', millis],
  ['published-tools', 'u32'],
  ['next-attempt-at', option(millis)],
  ['breaker-until', option(millis)],
);
const liveSession = record('live-session', ['server-info', 'string'], ['tools', list(tool)], ['proven', 'bool']);
const serverHandover = record(
  'server-handover',
  ['config', serverConfig],
  ['session', option(liveSession)],
  ['connecting', 'bool'],
  ['state', serverState],
  ['breaker', breakerState],
  ['breaker-until', option(millis)],
  ['failures', 'u32'],
  ['breaker-failures', 'u32'],
  ['tool-errors', 'u32'],
  ['last-fault', option('string')],
  ['since', millis],
  ['next-attempt-at', option(millis)],
);
const policyInfo = record('policy-info', ['name', 'string'], ['version', 'string']);
const handover = record('handover', ['now', millis], ['servers', list(serverHandover)], ['previous', policyInfo]);
const naming = record('naming', ['server', 'string'], ['prefix', option('string')]);
const namedPrompt = record('named-prompt', ['advertised', 'string'], ['original', 'string']);
const level = enumeration('level', 'trace', 'debug', 'info', 'warn', 'error');

/** Every named type of the WIT (interface `types`, and `log.level`), by WIT name. */
export const TYPES = Object.freeze({
  'transport-kind': transportKind,
  fault,
  tool,
  'server-config': serverConfig,
  'session-info': sessionInfo,
  'server-fault': serverFault,
  'server-tools': serverTools,
  'call-outcome': callOutcome,
  'call-report': callReport,
  'reconnect-source': reconnectSource,
  'reconnect-request': reconnectRequest,
  'timer-fired': timerFired,
  'event-kind': eventKind,
  event,
  'published-tool': publishedTool,
  publication,
  wake,
  'server-state': serverState,
  'breaker-state': breakerState,
  'state-change': stateChange,
  action,
  'call-request': callRequest,
  hold,
  admission,
  'server-status': serverStatus,
  'live-session': liveSession,
  'server-handover': serverHandover,
  handover,
  naming,
  'named-prompt': namedPrompt,
  'policy-info': policyInfo,
  level,
});

/** Composite types used by the functions of `interface policy`. */
export const T = Object.freeze({
  ...TYPES,
  millis,
  actions: list(action),
  statuses: list(serverStatus),
  snapshot: 'bytes',
  strings: list('string'),
  namedPrompts: list(namedPrompt),
});

// ---------------------------------------------------------------------------------------------
// Conversion

const camelCache = new Map();
/** jco's name for a WIT field: lower camel case (`breaker-until` -> `breakerUntil`). */
export function camel(kebab) {
  let c = camelCache.get(kebab);
  if (c === undefined) {
    c = kebab.replace(/-([a-z0-9])/g, (_, ch) => ch.toUpperCase());
    camelCache.set(kebab, c);
  }
  return c;
}

const U64_MAX = (1n << 64n) - 1n;
const RANGES = {
  u16: [0, 0xffff],
  u32: [0, 0xffffffff],
  s32: [-0x80000000, 0x7fffffff],
};

function describe(type) {
  if (typeof type === 'string') return type;
  if (type.name) return type.name;
  if (type.option) return `option<${describe(type.option)}>`;
  if (type.list) return `list<${describe(type.list)}>`;
  return 'value';
}

function typeError(path, type, got) {
  let shown;
  try {
    shown = stringify(got);
  } catch {
    shown = String(got);
  }
  if (shown.length > 80) shown = shown.slice(0, 77) + '...';
  return new TypeError(`${path}: expected ${describe(type)}, got ${shown}`);
}

const isPlainObject = (v) => typeof v === 'object' && v !== null && !Array.isArray(v) && !(v instanceof Uint8Array);

/**
 * Converts a JSON value of WIT type `type` to what jco's bindings take. Strict: every record
 * field must be present and no other key; integers must be exact and in range.
 */
export function toJco(type, v, path = 'value') {
  if (typeof type === 'string') {
    switch (type) {
      case 'string':
        if (typeof v !== 'string') throw typeError(path, type, v);
        return v;
      case 'bool':
        if (typeof v !== 'boolean') throw typeError(path, type, v);
        return v;
      case 'u64': {
        let b;
        if (typeof v === 'bigint') b = v;
        else if (typeof v === 'number' && Number.isSafeInteger(v)) b = BigInt(v);
        else throw typeError(path, type, v);
        if (b < 0n || b > U64_MAX) throw typeError(path, type, v);
        return b;
      }
      case 'u16':
      case 'u32':
      case 's32': {
        const [lo, hi] = RANGES[type];
        const num = typeof v === 'bigint' ? Number(v) : v;
        if (typeof num !== 'number' || !Number.isInteger(num) || num < lo || num > hi) throw typeError(path, type, v);
        return num;
      }
      case 'bytes':
        if (v instanceof Uint8Array) return v;
        return fromBase64(v, path);
      default:
        throw new Error(`unknown type ${type}`);
    }
  }
  if (type.record) {
    if (!isPlainObject(v)) throw typeError(path, type, v);
    const out = {};
    for (const [field, ft] of type.record) {
      if (!Object.prototype.hasOwnProperty.call(v, field)) {
        throw new TypeError(`${path}: ${describe(type)} lacks the field "${field}"`);
      }
      out[camel(field)] = toJco(ft, v[field], `${path}.${field}`);
    }
    for (const key of Object.keys(v)) {
      if (!type.record.some(([field]) => field === key)) {
        throw new TypeError(`${path}: ${describe(type)} has no field "${key}"`);
      }
    }
    return out;
  }
  if (type.variant) {
    if (!isPlainObject(v) || typeof v.tag !== 'string') throw typeError(path, type, v);
    const c = type.variant.find(([name]) => name === v.tag);
    if (!c) throw new TypeError(`${path}: ${describe(type)} has no case "${v.tag}"`);
    for (const key of Object.keys(v)) {
      if (key !== 'tag' && key !== 'val') throw new TypeError(`${path}: unexpected key "${key}" in a variant`);
    }
    const [tag, payload] = c;
    if (payload === null) {
      if (v.val !== undefined && v.val !== null) {
        throw new TypeError(`${path}: the case "${tag}" of ${describe(type)} has no payload`);
      }
      return { tag };
    }
    if (!Object.prototype.hasOwnProperty.call(v, 'val')) {
      throw new TypeError(`${path}: the case "${tag}" of ${describe(type)} needs a "val"`);
    }
    return { tag, val: toJco(payload, v.val, `${path}.val`) };
  }
  if (type.enum) {
    if (typeof v !== 'string' || !type.enum.includes(v)) throw typeError(path, type, v);
    return v;
  }
  if (type.option) {
    if (v === null || v === undefined) return undefined;
    return toJco(type.option, v, path);
  }
  if (type.list) {
    if (!Array.isArray(v)) throw typeError(path, type, v);
    return v.map((x, k) => toJco(type.list, x, `${path}[${k}]`));
  }
  throw new Error('unknown type');
}

/**
 * Converts what jco's bindings give for WIT type `type` to its JSON value (keys in WIT order,
 * every field present, u64 as BigInt). Checks what it converts: a policy answering out of
 * type would be a bug of the bindings, but is reported rather than printed.
 */
export function fromJco(type, v, path = 'value') {
  if (typeof type === 'string') {
    switch (type) {
      case 'string':
        if (typeof v !== 'string') throw typeError(path, type, v);
        return v;
      case 'bool':
        if (typeof v !== 'boolean') throw typeError(path, type, v);
        return v;
      case 'u64':
        if (typeof v === 'bigint') return v;
        if (typeof v === 'number' && Number.isSafeInteger(v)) return BigInt(v);
        throw typeError(path, type, v);
      case 'u16':
      case 'u32':
      case 's32':
        if (typeof v !== 'number' || !Number.isInteger(v)) throw typeError(path, type, v);
        return v;
      case 'bytes':
        if (!(v instanceof Uint8Array)) throw typeError(path, type, v);
        return toBase64(v);
      default:
        throw new Error(`unknown type ${type}`);
    }
  }
  if (type.record) {
    if (typeof v !== 'object' || v === null) throw typeError(path, type, v);
    const out = {};
    for (const [field, ft] of type.record) out[field] = fromJco(ft, v[camel(field)], `${path}.${field}`);
    return out;
  }
  if (type.variant) {
    if (typeof v !== 'object' || v === null) throw typeError(path, type, v);
    const c = type.variant.find(([name]) => name === v.tag);
    if (!c) throw new TypeError(`${path}: ${describe(type)} has no case "${v.tag}"`);
    const [tag, payload] = c;
    return payload === null ? { tag } : { tag, val: fromJco(payload, v.val, `${path}.val`) };
  }
  if (type.enum) {
    if (!type.enum.includes(v)) throw typeError(path, type, v);
    return v;
  }
  if (type.option) {
    if (v === undefined || v === null) return null;
    return fromJco(type.option, v, path);
  }
  if (type.list) {
    if (!Array.isArray(v)) throw typeError(path, type, v);
    return v.map((x, k) => fromJco(type.list, x, `${path}[${k}]`));
  }
  throw new Error('unknown type');
}

/** Normalizes a JSON value of type `type`: checked, keys in WIT order, u64 as BigInt. */
export function normalize(type, v, path = 'value') {
  return fromJco(type, toJco(type, v, path), path);
}
