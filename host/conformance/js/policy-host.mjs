// Loads a Tether policy component (contract tether:policy@0.2.x) with jco and drives it with
// the JSON encoding of docs/CONFORMANCE.md (see wit-json.mjs). A component of 0.2.1 also takes
// the operator's naming (`set-naming`, `name-prompts`); one of 0.2.0 lacks both.
//
//   import { PolicyHost } from './policy-host.mjs';
//   const policy = await PolicyHost.load('policy.wasm');
//   policy.init('{}');
//   const actions = policy.handle({ now: 1000, kind: { tag: 'server-configured', val: {...} } });
//
// The component is transpiled at run time (jco's `transpile`, instantiation mode 'async') and
// the result cached by the component's SHA-256; it is instantiated with WASI 0.2 from
// preview2-shim, sandboxed (no preopened directories, no environment, no arguments, no
// network; the guest's stdout and stderr go to this process's stderr) and this host's
// `tether:policy/log`.

import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import v8 from 'node:v8';

import { ensureInstalled, HERE } from './install.mjs';
import { T, fromJco, parse, toJco } from './wit-json.mjs';

// componentize-py's components use extended constant expressions (a finished wasm proposal, on by
// default from V8 11.4, Node 22); Node 20's V8 has them behind a flag, set before any compile.
const EXTENDED_CONST = new Uint8Array([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0, 6, 9, 1, 0x7f, 0, 0x41, 1, 0x41, 2, 0x6a, 0x0b]);
if (!WebAssembly.validate(EXTENDED_CONST)) v8.setFlagsFromString('--experimental-wasm-extended-const');

/** The component cannot be used: it does not load, transpile or instantiate, or is of another contract. */
export class PolicyUnusable extends Error {}

/**
 * A call into the policy failed. `kind`: 'refused' (the function returned `err`; `reason` is its
 * text), 'trap' (the guest trapped; the instance is unusable afterwards), 'invalid-output', or
 * 'unsupported' (a function of contract 0.2.1 asked of a component of 0.2.0).
 */
export class PolicyError extends Error {
  constructor(kind, message, reason) {
    super(message);
    this.kind = kind;
    this.reason = reason;
  }
}

/** Log levels of `tether:policy/log`, least severe first. */
export const LOG_LEVELS = ['trace', 'debug', 'info', 'warn', 'error'];

/** The WASI 0.2 packages linked (as Tether's host does), with nothing in them. */
const OFFERED_WASI = ['wasi:cli', 'wasi:clocks', 'wasi:filesystem', 'wasi:io', 'wasi:random', 'wasi:sockets'];
const CONTRACT = 'tether:policy';
const POLICY_EXPORT = /^tether:policy\/policy@(\d+)\.(\d+)\.(\d+)(?:[-+].*)?$/;
/** The functions of the policy interface, as jco names them (and PolicyHost's methods). */
export const FUNCTIONS = ['info', 'init', 'setSettings', 'handle', 'admit', 'status', 'snapshot', 'restore', 'takeOver'];
/** What contract 0.2.1 adds (the operator's naming), as jco names them; a 0.2.0 component lacks them. */
export const NAMING_FUNCTIONS = ['setNaming', 'namePrompts'];
// Bump when what is cached changes.
const CACHE_FORMAT = 1;

/** Whether the sandbox offers the import `name` (`wasi:cli/environment@0.2.3`). */
export function offered(name) {
  const slash = name.indexOf('/');
  const pkg = slash < 0 ? name : name.slice(0, slash);
  const rest = slash < 0 ? '' : name.slice(slash + 1);
  if (pkg === CONTRACT) return true;
  const at = rest.indexOf('@');
  const version = at < 0 ? '' : rest.slice(at + 1);
  return OFFERED_WASI.includes(pkg) && version.startsWith('0.2.');
}

/** The top-level imports of a component, from the WIT that jco's `componentWit` prints. */
export function importsOfWit(wit) {
  const names = [];
  let depth = 0;
  for (const line of wit.split('\n')) {
    const t = line.trim();
    // Only the world's own items (depth 1), not those of inline interfaces.
    if (depth === 1) {
      const m = /^import\s+%?(\S+?)\s*(?:;|:\s|\{|$)/.exec(t);
      if (m) names.push(m[1]);
    }
    for (const ch of t) {
      if (ch === '{') depth++;
      else if (ch === '}') depth--;
    }
  }
  return names;
}

function defaultCacheDir() {
  return process.env.TETHER_JS_CACHE || join(tmpdir(), 'tether-policy-host-js');
}

let deps;
async function dependencies({ needJco }) {
  if (!deps) {
    ensureInstalled(); // once per thread: it reads both lockfiles
    const { WASIShim } = await import('@bytecodealliance/preview2-shim/instantiation');
    const jcoPackage = JSON.parse(readFileSync(join(HERE, 'node_modules/@bytecodealliance/jco/package.json'), 'utf8'));
    deps = { WASIShim, jcoVersion: jcoPackage.version, jco: null };
  }
  if (needJco && !deps.jco) deps.jco = await import('@bytecodealliance/jco');
  return deps;
}

function makeLogger(log) {
  if (typeof log === 'function') return log;
  const min = LOG_LEVELS.indexOf(log ?? 'warn');
  return (level, message) => {
    if (min >= 0 && LOG_LEVELS.indexOf(level) >= min) process.stderr.write(`policy ${level}: ${message}\n`);
  };
}

/** A transpiled, compiled component: instantiate it as often as needed. */
export class PolicyComponent {
  /**
   * Loads a component from a path or bytes.
   * Options: `cacheDir` (where transpiled output is kept, by the component's SHA-256; default
   * $TETHER_JS_CACHE or <tmpdir>/tether-policy-host-js; false: transpile into a temporary dir
   * removed when the process exits), `log` ('trace'...'error', 'off', or a function (level, message)).
   * Throws PolicyUnusable when it cannot be used.
   */
  static async load(source, { cacheDir, log } = {}) {
    let bytes;
    let label;
    if (typeof source === 'string') {
      label = source;
      try {
        bytes = readFileSync(source);
      } catch (e) {
        throw new PolicyUnusable(`cannot read policy ${source}: ${e.message}`);
      }
    } else {
      label = 'component';
      bytes = source;
    }
    bytes = new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const magic = bytes.length >= 8 && bytes[0] === 0 && bytes[1] === 0x61 && bytes[2] === 0x73 && bytes[3] === 0x6d;
    if (!magic) throw new PolicyUnusable(`policy ${label} is not a valid wasm component: no wasm header`);
    if (bytes[6] === 0 && bytes[7] === 0) {
      throw new PolicyUnusable(`policy ${label} is not a valid wasm component: a core wasm module, not a component`);
    }
    const d = await dependencies({ needJco: false });
    const sha = createHash('sha256').update(bytes).digest('hex');
    const key = `${sha}-jco${d.jcoVersion}-f${CACHE_FORMAT}`;
    const root = cacheDir === false ? null : cacheDir ?? defaultCacheDir();
    let dir = root ? join(root, key) : null;
    let meta;
    if (dir && existsSync(join(dir, 'meta.json'))) {
      try {
        meta = JSON.parse(readFileSync(join(dir, 'meta.json'), 'utf8'));
      } catch {
        meta = undefined;
      }
    }
    if (!meta) {
      const { jco } = await dependencies({ needJco: true });
      let out;
      let wit;
      try {
        out = await jco.transpile(bytes, {
          name: 'policy',
          instantiation: 'async',
          quiet: true,
          noTypescript: true,
        });
        wit = await jco.componentWit(bytes);
      } catch (e) {
        throw new PolicyUnusable(`policy ${label} is not a valid wasm component: ${firstLine(e)}`);
      }
      meta = { wit, exports: out.exports.map(([name]) => name) };
      const parent = root ?? tmpdir();
      mkdirSync(parent, { recursive: true });
      const tmp = mkdtempSync(join(parent, `.${sha.slice(0, 12)}-`));
      // No cache: the files live until this process ends, however loading ends.
      if (!dir) process.once('exit', () => rmSync(tmp, { recursive: true, force: true }));
      try {
        for (const [file, data] of Object.entries(out.files)) {
          const target = join(tmp, file === 'policy.js' ? 'policy.mjs' : file);
          mkdirSync(join(target, '..'), { recursive: true });
          writeFileSync(target, data);
        }
        writeFileSync(join(tmp, 'meta.json'), JSON.stringify(meta));
      } catch (e) {
        rmSync(tmp, { recursive: true, force: true });
        throw e;
      }
      if (dir) {
        try {
          renameSync(tmp, dir);
        } catch {
          // Another process cached it first: use theirs.
          rmSync(tmp, { recursive: true, force: true });
        }
      } else {
        dir = tmp;
      }
    }
    const missing = importsOfWit(meta.wit).filter((name) => !offered(name));
    if (missing.length > 0) {
      let why =
        `${label} imports ${missing.join(', ')}, which the policy sandbox does not link (it links ` +
        `WASI 0.2's ${OFFERED_WASI.join(', ')}, and gives no files, network or environment through them)`;
      if (missing.some((n) => n.startsWith('wasi:http/'))) {
        why += '; a componentize-js build imports wasi:http unless built with `--disable http --disable fetch-event`';
      }
      throw new PolicyUnusable(why);
    }
    const exportName = meta.exports.find((n) => POLICY_EXPORT.test(n));
    if (!exportName) {
      throw new PolicyUnusable(`${label} exports no tether:policy/policy interface (it exports ${meta.exports.join(', ') || 'nothing'})`);
    }
    const [, major, minor] = POLICY_EXPORT.exec(exportName);
    if (major !== '0' || minor !== '2') {
      throw new PolicyUnusable(
        `${label} is built for the contract ${exportName.split('@')[1]}; this host runs 0.2.x components`,
      );
    }
    let mod;
    try {
      mod = await import(pathToFileURL(join(dir, 'policy.mjs')).href);
    } catch (e) {
      throw new PolicyUnusable(`the transpiled ${label} does not load: ${firstLine(e)}`);
    }
    const cores = new Map();
    const coreDir = dir;
    const getCoreModule = (path) => {
      let m = cores.get(path);
      if (!m) {
        m = WebAssembly.compile(readFileSync(join(coreDir, path)));
        cores.set(path, m);
      }
      return m;
    };
    const component = new PolicyComponent(mod, exportName, getCoreModule, makeLogger(log), d.WASIShim);
    component.label = label;
    return component;
  }

  constructor(mod, exportName, getCoreModule, logger, WASIShim) {
    this.exportName = exportName;
    this.mod = mod;
    this.getCoreModule = getCoreModule;
    this.logger = logger;
    const shim = new WASIShim({ sandbox: { preopens: {}, env: {}, args: [], enableNetwork: false } });
    const wasi = shim.getImportObject();
    const stderr = wasi['wasi:cli/stderr'];
    const imports = {
      ...wasi,
      // The guest's stdout must not mix with a report on ours.
      'wasi:cli/stdout': { getStdout: () => stderr.getStderr() },
      'wasi:cli/exit': {
        exit() {
          throw new Error('the policy called wasi:cli/exit');
        },
        exitWithCode() {
          throw new Error('the policy called wasi:cli/exit');
        },
      },
      'tether:policy/log': { log: (level, message) => this.logger(level, message) },
    };
    // Bindings look interfaces up without their version; accept either spelling.
    this.imports = new Proxy(imports, {
      get(target, key) {
        if (typeof key === 'string' && !(key in target)) return target[key.replace(/@[^/]*$/, '')];
        return target[key];
      },
      has(target, key) {
        return key in target || (typeof key === 'string' && key.replace(/@[^/]*$/, '') in target);
      },
    });
  }

  /** A fresh instance (not yet `init`ed). */
  async instantiate() {
    let root;
    try {
      root = await this.mod.instantiate(this.getCoreModule, this.imports);
    } catch (e) {
      throw new PolicyUnusable(`${this.label} does not instantiate: ${firstLine(e)}`);
    }
    const exports = root[this.exportName] ?? root.policy;
    const absent = FUNCTIONS.filter((f) => typeof exports?.[f] !== 'function');
    if (absent.length > 0) {
      throw new PolicyUnusable(`${this.label} lacks the functions ${absent.join(', ')} of ${this.exportName}`);
    }
    return new PolicyHost(this, exports);
  }
}

function firstLine(e) {
  const text = e?.message ?? String(e);
  return text.split('\n').find((l) => l.trim()) ?? text;
}

const asValue = (v) => (typeof v === 'string' ? parse(v) : v);

/**
 * One instance of a policy. Methods take and return JSON values of docs/CONFORMANCE.md's
 * encoding (JSON text is accepted too); u64s come back as BigInt (print with wit-json's
 * `stringify`). Refusals and traps throw PolicyError.
 */
export class PolicyHost {
  /** Loads `source` (path or bytes) and makes one instance. Options as PolicyComponent.load. */
  static async load(source, options) {
    const component = await PolicyComponent.load(source, options);
    return component.instantiate();
  }

  constructor(component, exports) {
    this.component = component;
    this.exports = exports;
    this.broken = null;
  }

  /** Another, fresh instance of the same component. */
  fresh() {
    return this.component.instantiate();
  }

  /** The component's label (its path), as messages name it. */
  get label() {
    return this.component.label;
  }

  /**
   * Whether the policy takes the operator's naming (contract 0.2.1), told by what it exports,
   * as Tether's host tells it: both `set-naming` and `name-prompts`, or it is of 0.2.0.
   */
  get naming() {
    return NAMING_FUNCTIONS.every((f) => typeof this.exports[f] === 'function');
  }

  /** The contract version the component speaks, by what it exports: '0.2.1' or '0.2.0'. */
  get contract() {
    return this.naming ? '0.2.1' : '0.2.0';
  }

  // Calls `fn`; errors as Tether's host words them. `refusing`: what an `err` refuses.
  #call(what, fn, outType, refusing) {
    const who = `policy ${this.label}`;
    if (this.broken) throw new PolicyError('trap', `${who} failed during ${what}: the instance trapped earlier (${this.broken})`);
    let out;
    try {
      out = fn();
    } catch (e) {
      if (e && typeof e === 'object' && Object.prototype.hasOwnProperty.call(e, 'payload')) {
        const reason = typeof e.payload === 'string' ? e.payload : String(e.payload);
        throw new PolicyError('refused', `${who} refused ${refusing ?? 'the call'}: ${reason}`, reason);
      }
      const text = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
      this.broken = `${what}: ${text}`;
      throw new PolicyError('trap', `${who} failed during ${what}: trapped: ${text}`);
    }
    if (outType === undefined) return undefined;
    try {
      return fromJco(outType, out, what);
    } catch (e) {
      throw new PolicyError('invalid-output', `${who} failed during ${what}: returned invalid output: ${e.message}`);
    }
  }

  /** `info()`: {name, version}. */
  info() {
    return this.#call('info', () => this.exports.info(), T['policy-info']);
  }

  /** `init(settings)`: settings is JSON text (a JSON value is printed first). */
  init(settings = '{}') {
    const text = typeof settings === 'string' ? settings : JSON.stringify(settings);
    return this.#call('init', () => this.exports.init(text), undefined, 'the settings');
  }

  /** `set-settings(settings)`. */
  setSettings(settings) {
    const text = typeof settings === 'string' ? settings : JSON.stringify(settings);
    return this.#call('set-settings', () => this.exports.setSettings(text), undefined, 'the settings');
  }

  /** `handle(event)` -> list<action>. */
  handle(event) {
    const arg = toJco(T.event, asValue(event), 'event');
    return this.#call('handle', () => this.exports.handle(arg), T.actions);
  }

  /** `admit(call-request)` -> admission. */
  admit(request) {
    const arg = toJco(T['call-request'], asValue(request), 'request');
    return this.#call('admit', () => this.exports.admit(arg), T.admission);
  }

  /** `status(now)` -> list<server-status>. */
  status(now) {
    const arg = toJco(T.millis, asValue(now), 'now');
    return this.#call('status', () => this.exports.status(arg), T.statuses);
  }

  /** `snapshot()` -> the bytes (Uint8Array; wit-json's toBase64 gives the JSON encoding). */
  snapshot() {
    let bytes;
    this.#call('snapshot', () => {
      bytes = this.exports.snapshot();
    });
    if (!(bytes instanceof Uint8Array)) {
      throw new PolicyError('invalid-output', `policy ${this.label} failed during snapshot: returned invalid output: not bytes`);
    }
    return bytes;
  }

  /** `restore(snapshot)`: bytes, or their base64 encoding. */
  restore(snapshot) {
    const arg = toJco('bytes', snapshot, 'snapshot');
    return this.#call('restore', () => this.exports.restore(arg), undefined, 'the saved state');
  }

  /** `take-over(handover)` -> list<action>. */
  takeOver(handover) {
    const arg = toJco(T.handover, asValue(handover), 'handover');
    return this.#call('take-over', () => this.exports.takeOver(arg), T.actions, 'the handed-over state');
  }

  #naming(what) {
    if (!this.naming) throw new PolicyError('unsupported', `policy ${this.label} has no ${what} (contract 0.2.0)`);
  }

  /** `set-naming(naming)` (contract 0.2.1): `{server, prefix}`, prefix null for the default. */
  setNaming(naming) {
    this.#naming('set-naming');
    const arg = toJco(T.naming, asValue(naming), 'naming');
    return this.#call('set-naming', () => this.exports.setNaming(arg));
  }

  /**
   * `name-prompts(server, originals)` -> list<named-prompt> (contract 0.2.1). Not checked here:
   * see scenario.mjs's `invalidPromptNames`.
   */
  namePrompts(server, originals) {
    this.#naming('name-prompts');
    const s = toJco('string', server, 'server');
    const list = toJco(T.strings, asValue(originals), 'originals');
    return this.#call('name-prompts', () => this.exports.namePrompts(s, list), T.namedPrompts);
  }
}
