#!/usr/bin/env node
// Runs Tether's conformance scenarios (docs/CONFORMANCE.md) against a policy component in jco.
//
//   node host/conformance/js/conformance.mjs COMPONENT [--scenarios DIR] [--settings JSON]
//                                [--transcripts DIR] [--only NAME]... [--log LEVEL] [--no-cache] [--call-timeout SECONDS]
//
// The policy runs in a worker thread (scenario-worker.mjs); a call into it that gives no answer
// within the deadline fails its scenario, and the next scenario gets a fresh worker.
//
// Exit status: 0 every scenario passed, 1 one failed, 2 the component cannot be used (it does
// not load, transpile or instantiate, or refuses the settings) or the arguments or scenario files
// are wrong.

import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { Worker } from 'node:worker_threads';

import { HERE, ensureInstalled } from './install.mjs';
import { LOG_LEVELS } from './policy-host.mjs';
import { parse } from './wit-json.mjs';

const USAGE = `usage: node host/conformance/js/conformance.mjs COMPONENT [--scenarios DIR] [--settings JSON]
       [--transcripts DIR] [--only NAME]... [--log LEVEL] [--no-cache] [--call-timeout SECONDS]

  COMPONENT          the policy component (.wasm), contract tether:policy@0.2.x
  --scenarios DIR    the exported scenarios: index.json and NAME.json (default: host/conformance/scenarios)
  --settings JSON    settings given to the policy's init in every scenario (default: {})
  --transcripts DIR  write DIR/NAME.jsonl, every call into the policy, per scenario
  --only NAME        run only this scenario (repeatable)
  --log LEVEL        print the policy's log records from LEVEL up on stderr
                     (trace, debug, info, warn, error, off; default: warn)
  --no-cache         transpile even if the component is in the cache, and cache nothing
  --call-timeout SECONDS
                     fail a scenario whose call into the policy gives no answer within
                     SECONDS (the policy may loop) and go on with the next (default: 60)

exit status: 0 all passed, 1 a scenario failed, 2 the component cannot be used
             or the arguments or scenario files are wrong`;

function usage(message) {
  if (message) process.stderr.write(`conformance.mjs: ${message}\n`);
  process.stderr.write(USAGE + '\n');
  return 2;
}

function parseArgs(argv) {
  const opts = {
    component: null,
    scenarios: join(HERE, '..', 'scenarios'),
    settings: '{}',
    transcripts: null,
    only: [],
    log: 'warn',
    cache: true,
    callTimeout: 60,
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new Error(`${arg} needs a value`);
      return argv[++i];
    };
    const eq = arg.indexOf('=');
    if (arg.startsWith('--') && eq > 0) {
      argv.splice(i + 1, 0, arg.slice(eq + 1));
      argv[i] = arg.slice(0, eq);
      i--;
      continue;
    }
    switch (arg) {
      case '-h':
      case '--help':
        opts.help = true;
        break;
      case '--scenarios':
        opts.scenarios = resolve(value());
        break;
      case '--settings':
        opts.settings = value();
        break;
      case '--transcripts':
        opts.transcripts = resolve(value());
        break;
      case '--only':
        opts.only.push(value());
        break;
      case '--log':
        opts.log = value();
        if (![...LOG_LEVELS, 'off'].includes(opts.log)) {
          throw new Error(`--log: unknown level ${opts.log}`);
        }
        break;
      case '--no-cache':
        opts.cache = false;
        break;
      case '--call-timeout': {
        const text = value();
        const seconds = /^\d+(\.\d+)?$/.test(text) ? Number(text) : NaN;
        // setTimeout takes at most 2^31 - 1 ms.
        if (!(seconds > 0 && seconds * 1000 <= 2 ** 31 - 1)) {
          throw new Error(`--call-timeout: ${text} is not a number of seconds above 0 (at most 2147483)`);
        }
        opts.callTimeout = seconds;
        break;
      }
      default:
        if (arg.startsWith('-') && arg !== '-') throw new Error(`unknown option ${arg}`);
        if (opts.component !== null) throw new Error(`unexpected argument ${arg}`);
        opts.component = arg;
    }
  }
  return opts;
}

function readJson(path, what) {
  let text;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new Error(`cannot read ${what} ${path}: ${e.code === 'ENOENT' ? 'no such file' : e.message}`);
  }
  try {
    return parse(text);
  } catch (e) {
    throw new Error(`${path} is not JSON: ${e.message}`);
  }
}

function loadScenarios(dir, only) {
  const index = readJson(join(dir, 'index.json'), 'the scenario index');
  if (!Array.isArray(index) || !index.every((n) => typeof n === 'string')) {
    throw new Error(`${join(dir, 'index.json')} must be an array of scenario names`);
  }
  for (const name of only) {
    if (!index.includes(name)) throw new Error(`--only ${name}: no such scenario in ${dir}`);
  }
  const names = only.length > 0 ? index.filter((n) => only.includes(n)) : index;
  return names.map((name) => {
    if (!/^[A-Za-z0-9._-]+$/.test(name)) throw new Error(`bad scenario name ${JSON.stringify(name)} in index.json`);
    const scenario = readJson(join(dir, `${name}.json`), 'the scenario');
    if (scenario?.name !== name) throw new Error(`${name}.json names the scenario ${JSON.stringify(scenario?.name)}`);
    if (!Array.isArray(scenario.steps)) throw new Error(`${name}.json has no steps`);
    return scenario;
  });
}

/**
 * A worker thread holding the policy (scenario-worker.mjs), and the deadline on its calls: each
 * call into the policy must answer within `seconds`, or the worker is terminated and the wait
 * ends with {type: 'timeout', step, what, lines} (the transcript lines so far).
 */
class PolicyWorker {
  constructor(data, seconds) {
    this.seconds = seconds;
    this.step = 0;
    this.what = 'start';
    this.lines = [];
    this.timer = null;
    this.waiting = null;
    this.early = null; // an answer nobody waited for yet (the worker failed between scenarios)
    this.closed = false;
    this.worker = new Worker(new URL('./scenario-worker.mjs', import.meta.url), { workerData: data });
    this.worker.on('message', (m) => {
      if (m.type !== 'call') return this.#settle(m);
      this.step = m.step;
      this.what = m.what;
      for (const line of m.lines) this.lines.push(line);
      // The deadline runs from the start of each call.
      if (this.timer) this.timer.refresh();
      else this.timer = setTimeout(() => this.#expire(), this.seconds * 1000);
    });
    this.worker.on('error', (error) => this.#settle({ type: 'error', error }));
    this.worker.on('exit', (code) => {
      if (!this.closed) this.#settle({ type: 'error', error: new Error(`the policy's worker thread ended (exit code ${code})`) });
    });
  }

  #settle(answer) {
    clearTimeout(this.timer);
    this.timer = null;
    const resolve = this.waiting;
    this.waiting = null;
    if (resolve) resolve(answer);
    else this.early ??= answer;
  }

  #expire() {
    this.timer = null;
    this.closed = true;
    this.worker.terminate();
    this.#settle({ type: 'timeout', step: this.step, what: this.what, lines: this.lines });
  }

  /** The worker's next answer: 'ready', 'unusable', 'result', 'timeout' or 'error'. */
  next() {
    if (this.early) {
      const answer = this.early;
      this.early = null;
      return Promise.resolve(answer);
    }
    return new Promise((resolve) => {
      this.waiting = resolve;
    });
  }

  /** Runs a scenario: its result, or 'timeout' (the worker is gone then). */
  run(scenario) {
    this.step = 0;
    this.what = 'start';
    this.lines = [];
    this.worker.postMessage({ type: 'run', scenario });
    return this.next();
  }

  /** Ends the worker, letting what the policy logged reach stderr. */
  async close() {
    if (this.closed) return;
    this.closed = true;
    const exited = new Promise((resolve) => this.worker.once('exit', resolve));
    this.worker.postMessage({ type: 'close' });
    const stuck = setTimeout(() => this.worker.terminate(), 5000);
    await exited;
    clearTimeout(stuck);
  }
}

async function main(argv) {
  let opts;
  try {
    opts = parseArgs(argv);
  } catch (e) {
    return usage(e.message);
  }
  if (opts.help) {
    process.stdout.write(USAGE + '\n');
    return 0;
  }
  if (!opts.component) return usage('no component given');
  // Before anything is installed or loaded: what the arguments name must be there.
  if (!existsSync(opts.component)) {
    process.stderr.write(`error: cannot read policy ${opts.component}: no such file\n`);
    return 2;
  }
  if (opts.transcripts) {
    try {
      mkdirSync(opts.transcripts, { recursive: true });
      if (!statSync(opts.transcripts).isDirectory()) throw new Error('not a directory');
    } catch (e) {
      const why = e.code === 'EEXIST' || e.code === 'ENOTDIR' || e.message === 'not a directory' ? 'it is not a directory' : e.message;
      return usage(`--transcripts ${opts.transcripts}: cannot write transcripts there: ${why}`);
    }
  }

  let scenarios;
  try {
    scenarios = loadScenarios(opts.scenarios, opts.only);
  } catch (e) {
    process.stderr.write(`conformance.mjs: ${e.message}\n`);
    return 2;
  }

  try {
    ensureInstalled();
  } catch (e) {
    process.stderr.write(`conformance.mjs: ${e.message}\n`);
    return 2;
  }
  // The transpiled component is cached for the workers (a fresh one loads it from there);
  // --no-cache: in a directory of this run, removed at its end.
  let cacheDir;
  if (!opts.cache) {
    cacheDir = mkdtempSync(join(tmpdir(), 'tether-policy-host-js-run-'));
    process.once('exit', () => rmSync(cacheDir, { recursive: true, force: true }));
  }
  const data = { component: opts.component, log: opts.log, cacheDir, settings: opts.settings };
  const seconds = opts.callTimeout;
  const noAnswer = (step, what) => `at step ${step} (${what}): no answer within ${seconds} s (the policy may loop)`;

  // Preflight (in the worker): loads, and one instance is given the settings, as every scenario starts.
  let runner = new PolicyWorker({ ...data, preflight: true }, seconds);
  try {
    const ready = await runner.next();
    if (ready.type === 'error') throw ready.error;
    if (ready.type === 'unusable') {
      process.stderr.write(`error: ${ready.message}\n`);
      return 2;
    }
    if (ready.type === 'timeout') {
      process.stderr.write(`error: policy ${opts.component} gave no answer to ${ready.what} within ${seconds} s (the policy may loop)\n`);
      return 2;
    }
    const { info } = ready;
    process.stdout.write(`checking ${opts.component} (${info.name} ${info.version}, ${ready.exportName}, contract ${ready.contract})\n`);

    let passed = 0;
    let failed = 0;
    for (const scenario of scenarios) {
      if (!runner) {
        // The previous scenario's call did not end: a fresh worker (the settings were checked).
        runner = new PolicyWorker({ ...data, preflight: false }, seconds);
        const again = await runner.next();
        if (again.type === 'error') throw again.error;
        if (again.type !== 'ready') {
          process.stderr.write(`error: ${again.message ?? `loading ${opts.component} again gave no answer`}\n`);
          return 2;
        }
      }
      const answer = await runner.run(scenario);
      let result;
      if (answer.type === 'result') {
        result = answer.result;
      } else if (answer.type === 'timeout') {
        runner = null;
        result = { failure: noAnswer(answer.step, answer.what), transcript: answer.lines };
      } else {
        throw answer.error ?? new Error(`unexpected answer from the worker: ${answer.type}`);
      }
      if (result.applicable === false) {
        // What it checks came after the component's contract: passed without running, and no
        // transcript (as Tether counts and writes it).
        passed++;
        process.stdout.write(`n/a  ${scenario.name} (needs contract ${scenario.since}; the policy predates what it checks)\n`);
        continue;
      }
      if (opts.transcripts) {
        const text = result.transcript.map((line) => line + '\n').join('');
        writeFileSync(join(opts.transcripts, `${scenario.name}.jsonl`), text);
      }
      if (result.unusable) {
        process.stderr.write(`error: ${result.unusable}\n`);
        return 2;
      }
      if (result.malformed) {
        process.stderr.write(`error: the scenario file ${join(opts.scenarios, `${scenario.name}.json`)} is malformed: ${result.malformed}\n`);
        return 2;
      }
      if (result.failure === null) {
        passed++;
        process.stdout.write(`pass ${scenario.name}\n`);
      } else {
        failed++;
        process.stdout.write(`FAIL ${scenario.name}: ${result.failure}\n`);
      }
    }
    process.stdout.write(`${passed} passed, ${failed} failed\n`);
    return failed === 0 ? 0 : 1;
  } finally {
    await runner?.close();
  }
}

const code = await main(process.argv.slice(2)).catch((e) => {
  process.stderr.write(`conformance.mjs: internal error: ${e?.stack ?? e}\n`);
  return 2;
});
// Flush stdout before exiting: preview2-shim's I/O may otherwise keep the process alive.
process.stdout.write('', () => process.exit(code));
