// The hand-written type table of wit-json.mjs must be the WIT's: same types, fields and cases,
// in the same order. Parses wit/0.2/policy.wit with a small reader of its subset of WIT.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';

import { TYPES } from '../wit-json.mjs';
import { HERE } from '../install.mjs';

const WIT = join(HERE, '..', '..', '..', 'wit', '0.2', 'policy.wit');

/** Named types of the WIT: name -> { kind, items: [[name, typeText|null]...] }, aliases resolved. */
function readWit(text) {
  const code = text.replace(/\/\/[^\n]*/g, '');
  const aliases = {};
  for (const m of code.matchAll(/\btype\s+([a-z0-9-]+)\s*=\s*([^;]+);/g)) aliases[m[1]] = m[2].trim();
  const resolve = (t) => {
    t = t.trim();
    const generic = /^(option|list)<(.+)>$/.exec(t);
    if (generic) return `${generic[1]}<${resolve(generic[2])}>`;
    return aliases[t] ? resolve(aliases[t]) : t;
  };
  const types = {};
  for (const m of code.matchAll(/\b(record|variant|enum)\s+([a-z0-9-]+)\s*\{([^}]*)\}/g)) {
    const [, kind, name, body] = m;
    const items = body
      .split(',')
      .map((x) => x.trim())
      .filter(Boolean)
      .map((item) => {
        if (kind === 'record') {
          const [field, type] = item.split(':').map((x) => x.trim());
          return [field.replace(/^%/, ''), resolve(type)];
        }
        if (kind === 'variant') {
          const c = /^([a-z0-9-]+)(?:\((.+)\))?$/.exec(item);
          return [c[1], c[2] ? resolve(c[2]) : null];
        }
        return [item, null];
      });
    types[name] = { kind, items };
  }
  return types;
}

function witOf(type) {
  if (typeof type === 'string') return type === 'bytes' ? 'list<u8>' : type;
  if (type.name) return type.name;
  if (type.option) return `option<${witOf(type.option)}>`;
  if (type.list) return `list<${witOf(type.list)}>`;
  throw new Error('unknown type');
}

function tableOf(type) {
  if (type.record) return { kind: 'record', items: type.record.map(([f, t]) => [f, witOf(t)]) };
  if (type.variant) return { kind: 'variant', items: type.variant.map(([c, t]) => [c, t === null ? null : witOf(t)]) };
  return { kind: 'enum', items: type.enum.map((c) => [c, null]) };
}

test('the type table is the WIT, type by type, field by field, in order', () => {
  const wit = readWit(readFileSync(WIT, 'utf8'));
  assert.deepEqual(Object.keys(TYPES).sort(), Object.keys(wit).sort(), 'the same named types');
  for (const [name, type] of Object.entries(TYPES)) {
    assert.equal(type.name, name);
    assert.deepEqual(tableOf(type), wit[name], `type ${name}`);
  }
});
