// The JSON encoding of WIT values: exact parsing and printing, and the conversion to and from
// jco's values for every type of the WIT.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { T, TYPES, camel, fromJco, normalize, parse, stringify, toJco } from '../wit-json.mjs';

const BIG = 18446744073709551615n; // u64::MAX
const DIGEST = 12345678901234567891n; // > 2^63

describe('parse', () => {
  test('keeps integers beyond 2^53 exact, as BigInt', () => {
    const v = parse('{"a":18446744073709551615,"b":9007199254740993,"c":9007199254740991,"d":-5,"e":0}');
    assert.equal(v.a, BIG);
    assert.equal(v.b, 9007199254740993n);
    assert.equal(v.c, 9007199254740991);
    assert.equal(v.d, -5);
    assert.equal(v.e, 0);
  });
  test('reads every JSON form', () => {
    assert.deepEqual(parse(' [1, 2.5, -1e3, true, false, null, "x", {}, []] '), [1, 2.5, -1000, true, false, null, 'x', {}, []]);
    assert.equal(parse('"\\u00e9\\n\\"\\\\\\/\\ud83d\\ude00"'), 'é\n"\\/😀');
    assert.deepEqual(Object.keys(parse('{"z":1,"a":2,"m":3}')), ['z', 'a', 'm']);
    assert.deepEqual(parse('{"__proto__":1}').__proto__, 1);
  });
  test('refuses what is not JSON', () => {
    for (const bad of ['', '{', '[1,]', '{"a":1,}', '01', '1.', 'tru', '"a', '"\u0001"', '{"a" 1}', '1 2', "'a'", 'NaN']) {
      assert.throws(() => parse(bad), SyntaxError, bad);
    }
  });
});

describe('stringify', () => {
  test('prints compactly, keys in insertion order, BigInt as digits', () => {
    assert.equal(stringify({ b: 1, a: [true, null, 'x'], c: BIG, d: -3 }), '{"b":1,"a":[true,null,"x"],"c":18446744073709551615,"d":-3}');
  });
  test('escapes only what JSON requires, as serde_json does', () => {
    const s = 'q"b\\s/é😀\u0000\u0001\u001f\u007f\b\f\n\r\t\u2028';
    assert.equal(stringify(s), '"q\\"b\\\\s/é😀\\u0000\\u0001\\u001f\u007f\\b\\f\\n\\r\\t\u2028"');
  });
  test('never prints exponents or undefined', () => {
    assert.equal(stringify(1e21), '1000000000000000000000');
    assert.equal(stringify(-0), '0');
    assert.throws(() => stringify({ a: undefined }));
    assert.throws(() => stringify(NaN));
  });
  test('round-trips exactly', () => {
    const text = '{"now":18446744073709551615,"kind":{"tag":"timer","val":{"server":"a","token":9007199254740993}}}';
    assert.equal(stringify(parse(text)), text);
  });
});

test('camel follows jco: kebab-case to lowerCamelCase', () => {
  assert.equal(camel('breaker-until'), 'breakerUntil');
  assert.equal(camel('next-attempt-at'), 'nextAttemptAt');
  assert.equal(camel('read-only'), 'readOnly');
  assert.equal(camel('server'), 'server');
});

// A JSON value of every named type, and what jco takes/gives for it.
const tool = { name: 'echo', 'read-only': true, revision: DIGEST };
const toolJ = { name: 'echo', readOnly: true, revision: DIGEST };
const config = { name: 'alpha', transport: 'streamable-http', include: ['read_*'], exclude: [], settings: '' };
const handover = {
  now: 5,
  servers: [
    {
      config,
      session: { 'server-info': 'x 1', tools: [tool], proven: true },
      connecting: false,
      state: 'healthy',
      breaker: 'open',
      'breaker-until': BIG,
      failures: 1,
      'breaker-failures': 2,
      'tool-errors': 3,
      'last-fault': 'boom',
      since: 4,
      'next-attempt-at': null,
    },
  ],
  previous: { name: 'p', version: '1' },
};
const handoverJ = {
  now: 5n,
  servers: [
    {
      config: { name: 'alpha', transport: 'streamable-http', include: ['read_*'], exclude: [], settings: '' },
      session: { serverInfo: 'x 1', tools: [toolJ], proven: true },
      connecting: false,
      state: 'healthy',
      breaker: 'open',
      breakerUntil: BIG,
      failures: 1,
      breakerFailures: 2,
      toolErrors: 3,
      lastFault: 'boom',
      since: 4n,
      nextAttemptAt: undefined,
    },
  ],
  previous: { name: 'p', version: '1' },
};

const CASES = [
  ['event', { now: 1000, kind: { tag: 'connected', val: { server: 'a', 'server-info': 'i', tools: [tool] } } },
    { now: 1000n, kind: { tag: 'connected', val: { server: 'a', serverInfo: 'i', tools: [toolJ] } } }],
  ['event', { now: 1, kind: { tag: 'shutdown' } }, { now: 1n, kind: { tag: 'shutdown' } }],
  ['event', { now: 1, kind: { tag: 'call-finished', val: { server: 'a', 'call-id': BIG, outcome: { tag: 'transport-error', val: { tag: 'process-exited', val: null } }, 'duration-ms': 5 } } },
    { now: 1n, kind: { tag: 'call-finished', val: { server: 'a', callId: BIG, outcome: { tag: 'transport-error', val: { tag: 'process-exited', val: undefined } }, durationMs: 5n } } }],
  ['event', { now: 1, kind: { tag: 'server-configured', val: config } }, { now: 1n, kind: { tag: 'server-configured', val: { ...config } } }],
  ['event', { now: 1, kind: { tag: 'reconnect-requested', val: { server: 'a', source: 'probe' } } }, { now: 1n, kind: { tag: 'reconnect-requested', val: { server: 'a', source: 'probe' } } }],
  ['event', { now: 1, kind: { tag: 'tools-changed', val: { server: 'a', tools: [] } } }, { now: 1n, kind: { tag: 'tools-changed', val: { server: 'a', tools: [] } } }],
  ['event', { now: 1, kind: { tag: 'timer', val: { server: 'a', token: BIG } } }, { now: 1n, kind: { tag: 'timer', val: { server: 'a', token: BIG } } }],
  ['fault', { tag: 'auth-required', val: 401 }, { tag: 'auth-required', val: 401 }],
  ['fault', { tag: 'process-exited', val: -2147483648 }, { tag: 'process-exited', val: -2147483648 }],
  ['fault', { tag: 'session-expired' }, { tag: 'session-expired' }],
  ['call-outcome', { tag: 'cancelled' }, { tag: 'cancelled' }],
  ['call-outcome', { tag: 'tool-error', val: 'bad' }, { tag: 'tool-error', val: 'bad' }],
  ['action', { tag: 'wake-at', val: { server: 'a', at: 7, token: BIG } }, { tag: 'wake-at', val: { server: 'a', at: 7n, token: BIG } }],
  ['action', { tag: 'publish-tools', val: { server: 'a', tools: [{ advertised: 'a_x', original: 'x', 'read-only': false }] } },
    { tag: 'publish-tools', val: { server: 'a', tools: [{ advertised: 'a_x', original: 'x', readOnly: false }] } }],
  ['action', { tag: 'state-changed', val: { server: 'a', state: 'backing-off', detail: 'd' } }, { tag: 'state-changed', val: { server: 'a', state: 'backing-off', detail: 'd' } }],
  ['action', { tag: 'withdraw-tools', val: 'a' }, { tag: 'withdraw-tools', val: 'a' }],
  ['call-request', { now: 1, 'call-id': 2, server: 'a', tool: 't' }, { now: 1n, callId: 2n, server: 'a', tool: 't' }],
  ['admission', { tag: 'hold', val: { 'wait-ms': 60000, message: 'm' } }, { tag: 'hold', val: { waitMs: 60000n, message: 'm' } }],
  ['admission', { tag: 'allow' }, { tag: 'allow' }],
  ['server-status',
    { server: 'a', state: 'parked', breaker: 'half-open', failures: 4294967295, 'breaker-failures': 0, 'tool-errors': 1, 'last-fault': null, since: BIG, 'published-tools': 3, 'next-attempt-at': 99, 'breaker-until': null },
    { server: 'a', state: 'parked', breaker: 'half-open', failures: 4294967295, breakerFailures: 0, toolErrors: 1, lastFault: undefined, since: BIG, publishedTools: 3, nextAttemptAt: 99n, breakerUntil: undefined }],
  ['handover', handover, handoverJ],
  ['policy-info', { name: 'n', version: 'v' }, { name: 'n', version: 'v' }],
  ['level', 'warn', 'warn'],
  // Added in 0.2.1: a prefix of none is null in JSON, undefined in jco; "" is a prefix.
  ['naming', { server: 'a', prefix: null }, { server: 'a', prefix: undefined }],
  ['naming', { server: 'a', prefix: '' }, { server: 'a', prefix: '' }],
  ['named-prompt', { advertised: 'x-ask', original: 'ask' }, { advertised: 'x-ask', original: 'ask' }],
  ['namedPrompts', [{ advertised: 'ask', original: 'ask' }], [{ advertised: 'ask', original: 'ask' }]],
];

describe('conversion', () => {
  for (const [name, json, jco] of CASES) {
    test(`${name}: ${stringify(json).slice(0, 60)}`, () => {
      const type = T[name];
      assert.deepEqual(toJco(type, json), jco);
      const back = fromJco(type, jco);
      // Back in the JSON encoding: every u64 a BigInt, keys in WIT order.
      assert.equal(stringify(back), stringify(json));
      assert.deepEqual(Object.keys(back), Object.keys(json));
    });
  }

  test('every named type has a case above', () => {
    const covered = new Set();
    const visit = (type) => {
      if (typeof type === 'string') return;
      if (type.name) covered.add(type.name);
      for (const [, t] of type.record ?? []) visit(t);
      for (const [, t] of type.variant ?? []) if (t) visit(t);
      if (type.option) visit(type.option);
      if (type.list) visit(type.list);
    };
    for (const [name] of CASES) visit(T[name]);
    assert.deepEqual([...Object.keys(TYPES)].filter((n) => !covered.has(n)), []);
  });

  test('u64 out of jco come back as BigInt, printed exactly', () => {
    const status = fromJco(T.statuses, [{ server: 'a', state: 'connected', breaker: 'closed', failures: 0, breakerFailures: 0, toolErrors: 0, lastFault: 'x', since: 2n ** 60n, publishedTools: 0, nextAttemptAt: 3n, breakerUntil: undefined }]);
    assert.equal(
      stringify(status),
      '[{"server":"a","state":"connected","breaker":"closed","failures":0,"breaker-failures":0,"tool-errors":0,' +
        '"last-fault":"x","since":1152921504606846976,"published-tools":0,"next-attempt-at":3,"breaker-until":null}]',
    );
  });

  test('list<u8> is base64 in JSON, Uint8Array in jco', () => {
    assert.deepEqual(toJco(T.snapshot, 'AAEC/w=='), new Uint8Array([0, 1, 2, 255]));
    assert.equal(fromJco(T.snapshot, new Uint8Array([0, 1, 2, 255])), 'AAEC/w==');
    assert.throws(() => toJco(T.snapshot, 'AAEC/w'), TypeError);
    assert.throws(() => toJco(T.snapshot, 'AA-_'), TypeError);
  });

  test('normalize orders keys as the WIT does', () => {
    const v = normalize(T['call-request'], { tool: 't', server: 's', 'call-id': 3, now: 2 });
    assert.equal(stringify(v), '{"now":2,"call-id":3,"server":"s","tool":"t"}');
  });

  test('is strict about what it is given', () => {
    const bad = [
      ['call-request', { now: 1, 'call-id': 2, server: 'a' }, /lacks the field "tool"/],
      ['call-request', { now: 1, 'call-id': 2, server: 'a', tool: 't', extra: 1 }, /no field "extra"/],
      ['call-request', { now: -1, 'call-id': 2, server: 'a', tool: 't' }, /expected u64/],
      ['call-request', { now: 2n ** 64n, 'call-id': 2, server: 'a', tool: 't' }, /expected u64/],
      ['call-request', { now: 1.5, 'call-id': 2, server: 'a', tool: 't' }, /expected u64/],
      ['call-request', { now: 2 ** 60, 'call-id': 2, server: 'a', tool: 't' }, /expected u64/],
      ['fault', { tag: 'auth-required', val: 65536 }, /expected u16/],
      ['fault', { tag: 'process-exited', val: 2147483648 }, /expected s32/],
      ['fault', { tag: 'nope' }, /no case "nope"/],
      ['fault', { tag: 'spawn-failed' }, /needs a "val"/],
      ['fault', { tag: 'session-expired', val: 'x' }, /has no payload/],
      ['server-state', 'asleep', /expected server-state/],
      ['tool', { name: 'x', 'read-only': 'no', revision: 1 }, /expected bool/],
      ['tool', { name: 'x', readOnly: false, revision: 1 }, /lacks the field "read-only"/],
      ['actions', {}, /expected list<action>/],
    ];
    for (const [name, value, message] of bad) assert.throws(() => toJco(T[name], value), message, stringify(value));
  });

  test('accepts a variant case without payload given val null', () => {
    assert.deepEqual(toJco(T['call-outcome'], { tag: 'ok', val: null }), { tag: 'ok' });
  });
});
