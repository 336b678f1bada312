// The worker thread of conformance.mjs: the policy's instances live here, so that the main
// thread can stop a call that does not end (worker.terminate()) and go on with a fresh worker.
//
// workerData: { component, log, cacheDir, settings, preflight }.
// To the main thread:
//   {type: 'ready', info, contract, exportName}
//                                       loaded (and, with `preflight`, one instance took the
//                                       settings; `contract`: '0.2.1' or '0.2.0', by its exports)
//   {type: 'unusable', message}         the component cannot be used
//   {type: 'call', step, what, lines}   a call into the policy begins (the deadline runs from
//                                       here): step K and WHAT as the interpreter counts them, and
//                                       the transcript lines recorded since the last message
//   {type: 'result', result}            a scenario's result (runScenario's)
// From it: {type: 'run', scenario}, {type: 'close'}.

import { parentPort, workerData } from 'node:worker_threads';

import { FUNCTIONS, NAMING_FUNCTIONS, PolicyComponent, PolicyUnusable } from './policy-host.mjs';
import { runScenario } from './scenario.mjs';

const { component: source, log, cacheDir, settings, preflight } = workerData;

let step = 0;
let what = 'start';
let pending = [];
const beat = () => {
  parentPort.postMessage({ type: 'call', step, what, lines: pending });
  pending = [];
};

// Every call into the instance (and making it) tells the main thread first.
function watched(instance) {
  // label for the interpreter's messages; naming: whether it is of contract 0.2.1
  const out = { label: instance.label, naming: instance.naming };
  for (const name of instance.naming ? [...FUNCTIONS, ...NAMING_FUNCTIONS] : FUNCTIONS) {
    out[name] = (...args) => {
      beat();
      return instance[name](...args);
    };
  }
  return out;
}

async function load() {
  let component;
  try {
    component = await PolicyComponent.load(source, { log, cacheDir });
  } catch (e) {
    if (e instanceof PolicyUnusable) return parentPort.postMessage({ type: 'unusable', message: e.message });
    throw e;
  }
  const instantiate = async () => {
    beat();
    return watched(await component.instantiate());
  };
  let info = null;
  let contract = null;
  if (preflight) {
    // One instance, given the settings, as every scenario starts.
    try {
      what = 'instantiate';
      const first = await instantiate();
      what = 'info';
      info = first.info();
      contract = first.naming ? '0.2.1' : '0.2.0';
      what = 'init';
      first.init(settings);
    } catch (e) {
      const why = e?.kind === 'refused' ? `policy ${component.label} refused the settings ${settings.trim()}: ${e.reason}` : e.message;
      return parentPort.postMessage({ type: 'unusable', message: why });
    }
  }
  parentPort.postMessage({ type: 'ready', info, contract, exportName: component.exportName });

  parentPort.on('message', async (message) => {
    if (message.type === 'close') {
      // Let what the policy logged reach stderr first.
      process.stderr.write('', () => process.exit(0));
      return;
    }
    step = 0;
    what = 'start';
    pending = [];
    const result = await runScenario(message.scenario, {
      newInstance: instantiate,
      settings,
      watch: {
        called(k, w) {
          step = k;
          what = w;
        },
        recorded(line) {
          pending.push(line);
        },
      },
    });
    parentPort.postMessage({ type: 'result', result });
  });
}

await load();
