#!/usr/bin/env node
// Runs Tether's conformance scenarios (docs/CONFORMANCE.md) against a policy component in jco.
//
//   node host/js/conformance.mjs COMPONENT [--scenarios DIR] [--settings JSON]
//                                [--transcripts DIR] [--only NAME]... [--log LEVEL] [--no-cache]
//
// Exit status: 0 every scenario passed, 1 one failed, 2 the component cannot be used (it does
// not load, transpile or instantiate, or refuses the settings) or the arguments or scenario files
// are wrong.

import { existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';

import { HERE, ensureInstalled } from './install.mjs';
import { runScenario } from './scenario.mjs';
import { parse } from './wit-json.mjs';

const USAGE = `usage: node host/js/conformance.mjs COMPONENT [--scenarios DIR] [--settings JSON]
       [--transcripts DIR] [--only NAME]... [--log LEVEL] [--no-cache]

  COMPONENT          the policy component (.wasm), contract tether:policy@0.2.x
  --scenarios DIR    the exported scenarios: index.json and NAME.json (default: host/conformance)
  --settings JSON    settings given to the policy's init in every scenario (default: {})
  --transcripts DIR  write DIR/NAME.jsonl, every call into the policy, per scenario
  --only NAME        run only this scenario (repeatable)
  --log LEVEL        print the policy's log records from LEVEL up on stderr
                     (trace, debug, info, warn, error, off; default: warn)
  --no-cache         transpile even if the component is in the cache, and cache nothing

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
    scenarios: join(HERE, '..', 'conformance'),
    settings: '{}',
    transcripts: null,
    only: [],
    log: 'warn',
    cache: true,
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
        if (!['trace', 'debug', 'info', 'warn', 'error', 'off'].includes(opts.log)) {
          throw new Error(`--log: unknown level ${opts.log}`);
        }
        break;
      case '--no-cache':
        opts.cache = false;
        break;
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
  // Imported only now: it needs node_modules.
  const { PolicyComponent, PolicyUnusable } = await import('./policy-host.mjs');

  let component;
  try {
    component = await PolicyComponent.load(opts.component, {
      log: opts.log,
      cacheDir: opts.cache ? undefined : false,
    });
  } catch (e) {
    if (!(e instanceof PolicyUnusable)) throw e;
    process.stderr.write(`error: ${e.message}\n`);
    return 2;
  }

  // Preflight: one instance, given the settings, as every scenario starts.
  let info;
  try {
    const first = await component.instantiate();
    info = first.info();
    first.init(opts.settings);
  } catch (e) {
    const why = e?.kind === 'refused' ? `policy ${component.label} refused the settings ${opts.settings.trim()}: ${e.reason}` : e.message;
    process.stderr.write(`error: ${why}\n`);
    return 2;
  }

  process.stdout.write(`checking ${opts.component} (${info.name} ${info.version}, ${component.exportName})\n`);

  let passed = 0;
  let failed = 0;
  for (const scenario of scenarios) {
    const result = await runScenario(scenario, {
      newInstance: () => component.instantiate(),
      settings: opts.settings,
    });
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
}

const code = await main(process.argv.slice(2)).catch((e) => {
  process.stderr.write(`conformance.mjs: internal error: ${e?.stack ?? e}\n`);
  return 2;
});
// Flush stdout before exiting: preview2-shim's I/O may otherwise keep the process alive.
process.stdout.write('', () => process.exit(code));
