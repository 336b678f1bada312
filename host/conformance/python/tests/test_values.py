"""The JSON encoding of WIT values (docs/CONFORMANCE.md). Pure: runs without wasmtime."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tether_policy_host import values as v  # noqa: E402
from tether_policy_host.values import Record, Variant  # noqa: E402

# A few types of wit/0.2/policy.wit, written out by hand.
FAULT = v.variant([
    ("spawn-failed", v.STRING), ("handshake-failed", v.STRING), ("handshake-timed-out", None),
    ("auth-required", v.U16), ("not-mcp-endpoint", v.STRING), ("process-exited", v.option(v.S32)),
    ("transport-closed", v.STRING), ("session-expired", None), ("keepalive-failed", v.STRING),
])
TOOL = v.record([("name", v.STRING), ("read-only", v.BOOL), ("revision", v.U64)])
CALL_OUTCOME = v.variant([("ok", None), ("tool-error", v.STRING), ("transport-error", FAULT),
                          ("timeout", None), ("cancelled", None)])
HOLD = v.record([("wait-ms", v.U64), ("message", v.STRING)])
ADMISSION = v.variant([("allow", None), ("probe", None), ("reject", v.STRING),
                       ("reconnect", v.STRING), ("hold", HOLD)])
SERVER_STATE = v.enum(["connecting", "connected", "healthy", "backing-off", "parked", "stopped"])
STATUS = v.record([
    ("server", v.STRING), ("state", SERVER_STATE), ("failures", v.U32),
    ("last-fault", v.option(v.STRING)), ("next-attempt-at", v.option(v.U64)),
])
SESSION = v.record([("server", v.STRING), ("server-info", v.STRING), ("tools", v.list_of(TOOL))])
EVENT_KIND = v.variant([("connected", SESSION), ("server-removed", v.STRING), ("shutdown", None),
                        ("call-finished", v.record([("server", v.STRING), ("call-id", v.U64),
                                                    ("outcome", CALL_OUTCOME), ("duration-ms", v.U64)]))])
EVENT = v.record([("now", v.U64), ("kind", EVENT_KIND)])
# Added in 0.2.1.
NAMING = v.record([("server", v.STRING), ("prefix", v.option(v.STRING))])
NAMED_PROMPTS = v.list_of(v.record([("advertised", v.STRING), ("original", v.STRING)]))
UNIT_RESULT = v.result(None, v.STRING)
LIST_RESULT = v.result(v.list_of(ADMISSION), v.STRING)
BYTES = v.list_of(v.U8)


class TaggingRule(unittest.TestCase):
    """wasmtime-py tags a variant only when its cases' Python classes overlap."""

    def test_which_types_are_tagged(self):
        self.assertTrue(FAULT.tagged)  # several string cases
        self.assertTrue(CALL_OUTCOME.tagged)  # two cases without payload
        self.assertTrue(ADMISSION.tagged)
        self.assertTrue(EVENT_KIND.tagged)
        self.assertFalse(UNIT_RESULT.tagged)  # None or str
        self.assertFalse(LIST_RESULT.tagged)  # list or str
        self.assertFalse(v.option(v.STRING).tagged)
        self.assertFalse(v.option(v.U64).tagged)
        self.assertTrue(v.option(v.option(v.U64)).tagged)  # None would be ambiguous

    def test_untagged_values_are_bare(self):
        self.assertIsNone(v.to_wasm(UNIT_RESULT, {"tag": "ok"}))
        self.assertEqual(v.to_wasm(UNIT_RESULT, {"tag": "err", "val": "no"}), "no")
        self.assertEqual(v.from_wasm(UNIT_RESULT, None), {"tag": "ok"})
        self.assertEqual(v.from_wasm(UNIT_RESULT, "no"), {"tag": "err", "val": "no"})
        self.assertEqual(v.from_wasm(LIST_RESULT, []), {"tag": "ok", "val": []})
        self.assertEqual(v.to_wasm(v.option(v.U64), None), None)
        self.assertEqual(v.to_wasm(v.option(v.U64), 7), 7)
        nested = v.option(v.option(v.U64))
        self.assertEqual(v.to_wasm(nested, None), Variant("none"))
        self.assertEqual(v.from_wasm(nested, Variant("some", None)), None)

    def test_tagged_values_are_variants(self):
        self.assertEqual(v.to_wasm(ADMISSION, {"tag": "allow"}), Variant("allow"))
        hold = v.to_wasm(ADMISSION, {"tag": "hold", "val": {"wait-ms": 5000, "message": "wait"}})
        self.assertEqual(hold.tag, "hold")
        self.assertEqual((hold.payload.__dict__), {"wait-ms": 5000, "message": "wait"})
        self.assertEqual(v.from_wasm(FAULT, Variant("process-exited", None)), {"tag": "process-exited", "val": None})
        self.assertEqual(v.from_wasm(FAULT, Variant("session-expired")), {"tag": "session-expired"})


class Encoding(unittest.TestCase):
    def test_round_trip_keeps_field_order_and_exact_integers(self):
        big = 2**64 - 59  # above 2^53: a float would lose it
        event = {"kind": {"tag": "connected", "val": {"tools": [{"revision": big, "name": "réad", "read-only": True}],
                                                      "server-info": "x", "server": "a"}}, "now": 1000}
        canon = v.normalize(EVENT, event)
        self.assertEqual(list(canon), ["now", "kind"])
        self.assertEqual(list(canon["kind"]["val"]), ["server", "server-info", "tools"])
        self.assertEqual(list(canon["kind"]["val"]["tools"][0]), ["name", "read-only", "revision"])
        self.assertEqual(v.dumps(canon),
                         '{"now":1000,"kind":{"tag":"connected","val":{"server":"a","server-info":"x",'
                         '"tools":[{"name":"réad","read-only":true,"revision":18446744073709551557}]}}}')

    def test_records_become_objects_with_kebab_attributes(self):
        rec = v.to_wasm(TOOL, {"name": "a", "read-only": False, "revision": 3})
        self.assertIsInstance(rec, Record)
        self.assertEqual(getattr(rec, "read-only"), False)
        self.assertEqual(v.from_wasm(TOOL, rec), {"name": "a", "read-only": False, "revision": 3})

    def test_options_enums_and_payloadless_cases(self):
        status = {"server": "a", "state": "backing-off", "failures": 2, "last-fault": None, "next-attempt-at": 1500}
        self.assertEqual(v.normalize(STATUS, status), status)
        self.assertEqual(v.dumps(v.normalize(EVENT, {"now": 1, "kind": {"tag": "shutdown"}})),
                         '{"now":1,"kind":{"tag":"shutdown"}}')
        outcome = {"tag": "transport-error", "val": {"tag": "process-exited", "val": None}}
        self.assertEqual(v.normalize(CALL_OUTCOME, outcome), outcome)

    def test_the_records_of_0_2_1(self):
        # `prefix` is option<string>: null is none (the default naming), "" is a prefix.
        none = v.to_wasm(NAMING, {"prefix": None, "server": "a"})
        self.assertIsNone(getattr(none, "prefix"))
        self.assertEqual(getattr(v.to_wasm(NAMING, {"server": "a", "prefix": ""}), "prefix"), "")
        self.assertEqual(v.dumps(v.normalize(NAMING, {"prefix": "x-", "server": "a"})), '{"server":"a","prefix":"x-"}')
        self.assertEqual(v.dumps(v.from_wasm(NAMING, none)), '{"server":"a","prefix":null}')
        named = [{"original": "ask", "advertised": "x-ask"}]
        self.assertEqual(v.dumps(v.normalize(NAMED_PROMPTS, named)), '[{"advertised":"x-ask","original":"ask"}]')
        with self.assertRaises(v.EncodingError):
            v.to_wasm(NAMING, {"server": "a"})  # every field present: null, not absent

    def test_bytes_are_base64(self):
        self.assertEqual(v.to_wasm(BYTES, "AAH/"), b"\x00\x01\xff")
        self.assertEqual(v.from_wasm(BYTES, b"\x00\x01\xff"), "AAH/")
        self.assertEqual(v.from_wasm(BYTES, b""), "")
        with self.assertRaises(v.EncodingError):
            v.to_wasm(BYTES, "AAH")  # unpadded
        with self.assertRaises(v.EncodingError):
            v.to_wasm(BYTES, "AA-_")  # URL alphabet

    def test_compact_json_escapes_as_serde_json(self):
        text = 'quote " backslash \\ newline \n tab \t ctl \x01 del \x7f é 😀 \u2028'
        self.assertEqual(v.dumps({"s": text}),
                         '{"s":"quote \\" backslash \\\\ newline \\n tab \\t ctl \\u0001 del \x7f é 😀 \u2028"}')

    def test_errors_name_the_place(self):
        cases = [
            (TOOL, {"name": "a", "read-only": False}, "missing field \"revision\""),
            (TOOL, {"name": "a", "read-only": False, "revision": 1, "extra": 1}, "unknown field \"extra\""),
            (TOOL, {"name": "a", "read-only": 0, "revision": 1}, "read-only: expected true or false"),
            (TOOL, {"name": "a", "read-only": False, "revision": -1}, "revision: expected an integer in u64's range"),
            (TOOL, {"name": "a", "read-only": False, "revision": 2**64}, "revision: expected an integer in u64's range"),
            (TOOL, {"name": "a", "read-only": False, "revision": True}, "revision: expected an integer"),
            (TOOL, {"name": "a", "read-only": False, "revision": 1.0}, "revision: expected an integer"),
            (ADMISSION, {"tag": "maybe"}, "tag: expected one of allow"),
            (ADMISSION, {"tag": "reject"}, "case reject needs a val"),
            (ADMISSION, {"tag": "allow", "val": "x"}, "case allow has no payload"),
            (SERVER_STATE, "sleeping", "expected one of connecting"),
            (EVENT, {"now": 1, "kind": {"tag": "connected", "val": {"server": "a", "server-info": "",
                                                                  "tools": [{"name": 1}]}}},
             "kind.val.tools[0]"),
        ]
        for schema, value, needle in cases:
            with self.subTest(value=value):
                with self.assertRaises(v.EncodingError) as caught:
                    v.to_wasm(schema, value)
                self.assertIn(needle, str(caught.exception))


try:
    import wasmtime  # noqa: F401
    HAVE_WASMTIME = True
except ImportError:
    HAVE_WASMTIME = False


@unittest.skipUnless(HAVE_WASMTIME, "wasmtime is not installed (run inside host/conformance/python/.venv)")
class AgainstWasmtime(unittest.TestCase):
    """The stand-ins are wasmtime-py's own classes when it is installed."""

    def test_classes_are_wasmtimes(self):
        from wasmtime.component import Record as WRecord, Variant as WVariant
        self.assertIs(Record, WRecord)
        self.assertIs(Variant, WVariant)


if __name__ == "__main__":
    unittest.main()
