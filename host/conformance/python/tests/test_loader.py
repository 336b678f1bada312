"""The loader against a real policy component. Needs wasmtime (run inside host/conformance/python/.venv)
and a component: TETHER_POLICY_WASM=path/to/policy.wasm, and for the misbehaving one
TETHER_HOSTILE_POLICY_WASM=path/to/tether_policy_hostile.wasm; skipped otherwise."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WASM = os.environ.get("TETHER_POLICY_WASM")
HOSTILE = os.environ.get("TETHER_HOSTILE_POLICY_WASM")
#: A component of contract 0.2.0 (Tether's guest/test-policies/previous-minor).
PREVIOUS_MINOR = os.environ.get("TETHER_PREVIOUS_MINOR_POLICY_WASM")
try:
    import wasmtime  # noqa: F401
    HAVE_WASMTIME = True
except ImportError:
    HAVE_WASMTIME = False


def configured(name, now=1000):
    return {"now": now, "kind": {"tag": "server-configured", "val": {
        "name": name, "transport": "stdio", "include": [], "exclude": [], "settings": ""}}}


@unittest.skipUnless(HAVE_WASMTIME and WASM, "needs wasmtime and TETHER_POLICY_WASM")
class Loader(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from tether_policy_host import PolicyComponent
        cls.component = PolicyComponent(WASM)

    def test_library_use(self):
        from tether_policy_host import PolicyRefused
        policy = self.component.instantiate().init("{}")
        info = policy.info()
        self.assertEqual(sorted(info), ["name", "version"])
        actions = policy.handle(configured("alpha"))
        self.assertIn({"tag": "connect", "val": "alpha"}, actions)
        big = 2**64 - 1
        actions = policy.handle({"now": 1001, "kind": {"tag": "connected", "val": {
            "server": "alpha", "server-info": "x", "tools": [{"name": "work", "read-only": True, "revision": big}]}}})
        self.assertTrue(any(a["tag"] == "publish-tools" for a in actions))
        admission = policy.admit({"now": 1002, "call-id": 1, "server": "alpha", "tool": "work"})
        self.assertEqual(admission, {"tag": "allow"})
        status = policy.status(1003)
        self.assertEqual(list(status[0])[:3], ["server", "state", "breaker"])
        snapshot = policy.snapshot()
        self.assertIsInstance(snapshot, bytes)
        fresh = self.component.instantiate().init({})
        fresh.restore(snapshot)
        self.assertEqual(fresh.status(1003), status)
        with self.assertRaises(PolicyRefused):
            self.component.instantiate().init('{"no such setting": 1}')

    def test_every_signature_converts(self):
        policy = self.component.instantiate()
        expected = {"info", "init", "set-settings", "handle", "admit", "status", "snapshot", "restore", "take-over"}
        if policy.naming:
            expected |= {"set-naming", "name-prompts"}
        self.assertEqual(set(policy.sigs), expected)
        self.assertEqual([p for p, _ in policy.sigs["handle"].params], ["event"])
        self.assertEqual(self.component.contract, "0.2.1" if policy.naming else "0.2.0")

    def test_the_operators_naming(self):
        # Whichever contract the component speaks: 0.2.1 takes the naming, 0.2.0 cannot be asked.
        from tether_policy_host import PolicyError
        policy = self.component.instantiate().init()
        if not policy.naming:
            with self.assertRaises(PolicyError) as caught:
                policy.set_naming({"server": "alpha", "prefix": ""})
            self.assertIn("has no set-naming (contract 0.2.0)", str(caught.exception))
            return
        self.assertEqual(policy.sigs["set-naming"].result, None)
        policy.set_naming({"server": "alpha", "prefix": ""})
        policy.set_naming('{"server": "beta", "prefix": null}')
        policy.handle(configured("alpha"))
        actions = policy.handle({"now": 1001, "kind": {"tag": "connected", "val": {
            "server": "alpha", "server-info": "x", "tools": [{"name": "work", "read-only": True, "revision": 1}]}}})
        published = [a["val"]["tools"] for a in actions if a["tag"] == "publish-tools"]
        self.assertEqual(published, [[{"advertised": "work", "original": "work", "read-only": True}]])
        before = policy.snapshot()
        self.assertEqual(policy.name_prompts("alpha", ["ask"]), [{"advertised": "ask", "original": "ask"}])
        self.assertEqual(policy.snapshot(), before, "name-prompts changes nothing")
        fresh = self.component.instantiate().init()
        fresh.restore(before)
        self.assertEqual(fresh.name_prompts("alpha", ["ask"]), [{"advertised": "ask", "original": "ask"}])

    def test_bad_input_is_an_encoding_error(self):
        from tether_policy_host.values import EncodingError
        policy = self.component.instantiate().init()
        with self.assertRaises(EncodingError):
            policy.handle({"now": -1, "kind": {"tag": "shutdown"}})


@unittest.skipUnless(HAVE_WASMTIME and PREVIOUS_MINOR, "needs wasmtime and TETHER_PREVIOUS_MINOR_POLICY_WASM")
class PreviousMinor(unittest.TestCase):
    def test_a_component_of_0_2_0_is_told_by_what_it_exports(self):
        from tether_policy_host import PolicyComponent, PolicyError
        component = PolicyComponent(PREVIOUS_MINOR)
        policy = component.instantiate().init()
        self.assertFalse(policy.naming)
        self.assertEqual(component.contract, "0.2.0")
        self.assertNotIn("set-naming", policy.sigs)
        for call in (lambda: policy.set_naming({"server": "a", "prefix": ""}), lambda: policy.name_prompts("a", ["p"])):
            with self.assertRaises(PolicyError):
                call()
        self.assertIn({"tag": "connect", "val": "alpha"}, policy.handle(configured("alpha")))


@unittest.skipUnless(HAVE_WASMTIME and HOSTILE, "needs wasmtime and TETHER_HOSTILE_POLICY_WASM")
class Hostile(unittest.TestCase):
    def test_a_loop_runs_out_of_fuel(self):
        from tether_policy_host import PolicyComponent, PolicyTrap
        # A small budget per call (the default is 2e9), so that the loop ends in a moment.
        component = PolicyComponent(HOSTILE, fuel_per_call=20_000_000)
        policy = component.instantiate().init({"hostile": {"loop_on_event": 2}})
        self.assertIn({"tag": "connect", "val": "alpha"}, policy.handle(configured("alpha")))
        with self.assertRaises(PolicyTrap) as caught:
            policy.handle(configured("beta", now=1001))
        self.assertEqual(caught.exception.function, "handle")
        self.assertIn("ran out of fuel", caught.exception.fault)
        self.assertIn("ran out of fuel", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
