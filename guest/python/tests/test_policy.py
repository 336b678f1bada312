"""Unit tests of the failure-window policy's logic, in plain Python (no wasm, no dependencies).

Run: python3 -m unittest discover -s guest/python/tests
"""

import json
import os
import sys
import unittest

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "policy"))

from windowpolicy import Policy, PolicyError  # noqa: E402
from windowpolicy import faults, naming, settings  # noqa: E402

HANDSHAKE = ("handshake-timed-out", None)
CRASH = ("process-exited", 1)
RESET = ("transport-closed", "connection reset")
BROKEN = ("transport-error", ("transport-closed", "broken pipe"))


def config(name, include=(), exclude=(), server_settings=""):
    return {
        "name": name,
        "transport": "stdio",
        "include": list(include),
        "exclude": list(exclude),
        "settings": server_settings,
    }


def tools(*names):
    return [(n, False, 7) for n in names]


class Script:
    """Drives a Policy in virtual time, remembering the latest wake per server."""

    def __init__(self, settings_json=""):
        self.p = Policy(settings_json)
        self.now = 1_000
        self.wakes = {}
        self.call_id = 0

    def ev(self, kind, payload=None):
        actions = self.p.handle(self.now, (kind, payload))
        for a in actions:
            if a[0] == "wake":
                self.wakes[a[1]] = (a[2], a[3])
        return actions

    def configure(self, name, **kw):
        return self.ev("server-configured", config(name, **kw))

    def connected(self, name, names=("work",)):
        return self.ev("connected", (name, "test 1.0", tools(*names)))

    def failed(self, name, fault=HANDSHAKE):
        return self.ev("connect-failed", (name, fault))

    def disconnected(self, name, fault=CRASH):
        return self.ev("disconnected", (name, fault))

    def keepalive(self, name):
        return self.ev("keepalive-ok", name)

    def fire(self, name):
        at, token = self.wakes.pop(name)
        self.now = max(self.now, at)
        return self.ev("timer", (name, token))

    def admit(self, name, tool="work"):
        self.call_id += 1
        return self.call_id, self.p.admit(self.now, self.call_id, name, tool)

    def call(self, name, outcome):
        call_id, admission = self.admit(name)
        if admission[0] in ("allow", "probe"):
            self.ev("call-finished", (name, call_id, outcome))
        return admission

    def status(self, name):
        return next(s for s in self.p.status(self.now) if s["server"] == name)

    def state(self, name):
        return self.status(name)["state"]

    def healthy(self, name, names=("work",)):
        self.configure(name)
        self.connected(name, names)
        self.keepalive(name)


def kinds(actions, kind, server=None):
    return [a for a in actions if a[0] == kind and (server is None or a[1] == server)]


def published(actions, server):
    pubs = kinds(actions, "publish", server)
    return pubs[-1][2] if pubs else None


class NamingTest(unittest.TestCase):
    def test_names_follow_tethers_convention(self):
        self.assertEqual(naming.advertised_name("files", "read_file"), "files__read_file")
        self.assertEqual(naming.advertised_name("a.b", "c d/é"), "a_b__c_d__")

    def test_fnv_reference_vectors(self):
        self.assertEqual(naming.fnv64(b""), 0xCBF29CE484222325)
        self.assertEqual(naming.fnv64(b"a"), 0xAF63DC4C8601EC8C)

    def test_long_names_are_clamped_with_a_hash(self):
        name = naming.advertised_name("server", "t" * 100)
        self.assertEqual(len(name), 64)
        self.assertTrue(naming.valid_name(name))
        other = naming.advertised_name("server", "t" * 99 + "u")
        self.assertNotEqual(name, other)

    def test_globs(self):
        m = naming.glob_match
        self.assertTrue(m("read_*", "read_file"))
        self.assertFalse(m("read_*", "write_file"))
        self.assertTrue(m("*", ""))
        self.assertTrue(m("a?c", "abc"))
        self.assertTrue(m("[a-c]x", "bx"))
        self.assertFalse(m("[!a-c]x", "bx"))
        self.assertTrue(m("[x", "[x"))
        self.assertTrue(m("*_file*", "read_file_v2"))
        self.assertTrue(m("a\\*", "a*"))
        self.assertFalse(m("a\\*", "ab"))
        self.assertTrue(naming.allowed(["read_*"], ["read_secret"], "read_file"))
        self.assertFalse(naming.allowed(["read_*"], ["read_secret"], "read_secret"))
        self.assertTrue(naming.allowed([], [], "anything"))
        self.assertTrue(m("[]]", "]"))
        self.assertTrue(m("a*b*c", "aXbYc"))
        self.assertFalse(m("a*b*c", "aXbY"))
        self.assertTrue(m("*?", "x"))
        self.assertFalse(m("*?", ""))
        self.assertFalse(m("{a,b}", "a"))  # no braces: literal characters
        self.assertTrue(m("{a,b}", "{a,b}"))

    def test_globs_take_linear_time(self):
        import time
        start = time.monotonic()
        self.assertFalse(naming.glob_match("*a" * 30 + "b", "a" * 200))
        self.assertLess(time.monotonic() - start, 2.0)


class SettingsTest(unittest.TestCase):
    def test_defaults_and_overrides(self):
        s = settings.from_json("")
        self.assertEqual(s, settings.defaults())
        s = settings.from_json('{"backoff_ms": {"crash": 50}, "hold_ms": 0}')
        self.assertEqual(s["backoff_ms"]["crash"], 50)
        self.assertEqual(s["backoff_ms"]["handshake"], 4_000)
        self.assertEqual(s["hold_ms"], 0)

    def test_unknown_and_bad_keys_are_refused_by_name(self):
        for text, word in [
            ('{"retries": 3}', "retries"),
            ('{"backoff_ms": {"permanent": 5}}', "backoff_ms.permanent"),
            ('{"hold_ms": 60001}', "hold_ms"),
            ('{"window_failures": true}', "window_failures"),
            ('{"park_probe_ms": 10, "park_probe_max_ms": 5}', "park_probe_max_ms"),
            ("[1]", "object"),
            ("{", "JSON"),
        ]:
            with self.assertRaises(settings.SettingsError) as cm:
                settings.from_json(text)
            self.assertIn(word, str(cm.exception))
        with self.assertRaises(PolicyError):
            Policy('{"nope": 1}')

    def test_set_settings_keeps_state_and_refuses_atomically(self):
        s = Script()
        s.healthy("alpha")
        s.p.set_settings('{"breaker_threshold": 2}')
        self.assertEqual(s.state("alpha"), "healthy")
        self.assertEqual(s.p.servers["alpha"].settings["breaker_threshold"], 2)
        before = s.p.snapshot()
        with self.assertRaises(PolicyError):
            s.p.set_settings('{"bogus": 1}')
        self.assertEqual(s.p.snapshot(), before)

    def test_per_server_overrides(self):
        s = Script()
        s.configure("alpha", server_settings='{"window_failures": 2}')
        s.failed("alpha")
        s.fire("alpha")
        s.failed("alpha")
        self.assertEqual(s.state("alpha"), "parked")
        # A global change that would break the override is refused.
        with self.assertRaises(PolicyError):
            s.p.set_settings('{"max_failures": 1}')

    def test_invalid_server_settings_park_until_fixed(self):
        s = Script()
        actions = s.configure("alpha", server_settings='{"bogus": 1}')
        self.assertFalse(kinds(actions, "connect"))
        self.assertEqual(s.state("alpha"), "parked")
        self.assertIn("alpha", s.p.admit(s.now, 1, "alpha", "x")[1])
        actions = s.configure("alpha")
        self.assertTrue(kinds(actions, "connect", "alpha"))


class LifecycleTest(unittest.TestCase):
    def test_configure_connects_and_session_publishes(self):
        s = Script()
        self.assertTrue(kinds(s.configure("alpha"), "connect", "alpha"))
        pub = published(s.connected("alpha", ("b", "a")), "alpha")
        self.assertEqual(pub, [("alpha__a", "a", False), ("alpha__b", "b", False)])
        self.assertEqual(s.p.admit(s.now, 1, "alpha", "a"), ("allow",))

    def test_backoff_depends_on_the_fault_class(self):
        def first_delay(fault):
            s = Script('{"jitter_pct": 0}')
            s.configure("alpha")
            s.failed("alpha", fault)
            return s.wakes["alpha"][0] - s.now

        self.assertEqual(first_delay(("session-expired", None)), 100)
        self.assertEqual(first_delay(RESET), 500)
        self.assertEqual(first_delay(CRASH), 1_000)
        self.assertEqual(first_delay(HANDSHAKE), 4_000)

    def test_backoff_grows_and_jitter_only_shortens(self):
        s = Script()
        s.configure("alpha")
        delays = []
        for _ in range(3):
            s.failed("alpha", RESET)
            delays.append(s.wakes["alpha"][0] - s.now)
            s.fire("alpha")
        for delay, nominal in zip(delays, (500, 1_000, 2_000)):
            self.assertLessEqual(delay, nominal)
            self.assertGreaterEqual(delay, nominal * 80 // 100)

    def test_permanent_faults_park_at_once_with_a_self_probe(self):
        for fault in [("spawn-failed", "ENOENT"), ("auth-required", 401), ("not-mcp-endpoint", "html")]:
            s = Script()
            s.configure("alpha")
            s.failed("alpha", fault)
            self.assertEqual(s.state("alpha"), "parked")
            self.assertIn("alpha", s.wakes)
            self.assertEqual(s.status("alpha")["next_attempt_at"], s.wakes["alpha"][0])

    def test_exit_127_before_the_handshake_is_permanent_but_not_during_a_session(self):
        self.assertEqual(faults.fault_class(("process-exited", 127), True), "permanent")
        self.assertEqual(faults.fault_class(("process-exited", 127), False), "crash")

    def test_a_storm_parks_within_the_window(self):
        s = Script()
        s.configure("alpha")
        for attempt in range(1, 5):
            s.failed("alpha", RESET)
            if attempt < 4:
                self.assertEqual(s.state("alpha"), "backing-off")
                s.fire("alpha")
        self.assertEqual(s.state("alpha"), "parked")
        self.assertIn("4 times within", s.p.servers["alpha"].park_reason)

    def test_slow_failures_park_on_the_consecutive_budget(self):
        # Failures further apart than the window still exhaust max_failures.
        s = Script('{"window_ms": 1000, "window_failures": 3, "max_failures": 5, "jitter_pct": 0}')
        s.configure("alpha")
        for attempt in range(1, 6):
            s.failed("alpha", HANDSHAKE)
            if attempt < 5:
                s.fire("alpha")
        self.assertEqual(s.state("alpha"), "parked")
        self.assertIn("5 times in a row", s.p.servers["alpha"].park_reason)

    def test_parked_self_probe_never_gives_up_and_slows_down(self):
        s = Script('{"jitter_pct": 0}')
        s.configure("alpha")
        s.failed("alpha", ("spawn-failed", "x"))
        delays = []
        for _ in range(6):
            delays.append(s.wakes["alpha"][0] - s.now)
            self.assertTrue(kinds(s.fire("alpha"), "connect", "alpha"))
            s.failed("alpha", HANDSHAKE)
            self.assertEqual(s.state("alpha"), "parked")
        self.assertEqual(delays, [60_000, 120_000, 240_000, 480_000, 900_000, 900_000])
        s.fire("alpha")
        self.assertTrue(published(s.connected("alpha"), "alpha"))

    def test_handshake_alone_does_not_reset_the_budget(self):
        s = Script()
        s.configure("alpha")
        for cycle in range(10):
            s.connected("alpha")
            s.disconnected("alpha")
            if s.state("alpha") == "parked":
                break
            s.fire("alpha")
        self.assertEqual(s.state("alpha"), "parked")
        self.assertLess(cycle, 8)

    def test_proven_sessions_never_park_and_reset_the_window(self):
        s = Script()
        s.configure("alpha")
        for _ in range(50):
            s.connected("alpha")
            s.keepalive("alpha")
            self.assertEqual(s.status("alpha")["failures"], 0)
            s.disconnected("alpha")
            self.assertNotEqual(s.state("alpha"), "parked")
            self.assertEqual(s.p.servers["alpha"].window, [s.now])
            s.fire("alpha")

    def test_an_answered_call_proves_the_session(self):
        s = Script()
        s.configure("alpha")
        s.failed("alpha")
        s.fire("alpha")
        s.connected("alpha")
        self.assertEqual(s.status("alpha")["failures"], 1)
        s.call("alpha", ("tool-error", "bad"))
        self.assertEqual(s.state("alpha"), "healthy")
        self.assertEqual(s.status("alpha")["failures"], 0)

    def test_revival_on_request_is_one_attempt(self):
        s = Script()
        s.configure("alpha")
        s.failed("alpha", ("auth-required", 401))
        self.assertTrue(kinds(s.ev("reconnect-requested", ("alpha", "operator")), "connect", "alpha"))
        s.failed("alpha", RESET)
        self.assertEqual(s.state("alpha"), "parked")

    def test_withdrawn_exactly_once_and_refusals_name_the_server(self):
        s = Script()
        s.configure("alpha")
        s.connected("alpha")
        withdrawn = len(kinds(s.disconnected("alpha"), "withdraw", "alpha"))
        while s.state("alpha") != "parked":
            withdrawn += len(kinds(s.fire("alpha"), "withdraw", "alpha"))
            withdrawn += len(kinds(s.failed("alpha"), "withdraw", "alpha"))
        self.assertEqual(withdrawn, 1)
        kind, message = s.admit("alpha")[1]
        self.assertEqual(kind, "reject")
        self.assertIn('"alpha"', message)

    def test_removal_and_shutdown(self):
        s = Script()
        s.configure("alpha")
        s.connected("alpha")
        s.configure("beta")
        s.connected("beta")
        actions = s.ev("server-removed", "alpha")
        self.assertEqual(len(kinds(actions, "withdraw", "alpha")), 1)
        self.assertTrue(kinds(actions, "disconnect", "alpha"))
        self.assertEqual(s.admit("alpha")[1][0], "reject")
        actions = s.ev("shutdown")
        self.assertEqual(len(kinds(actions, "withdraw", "beta")), 1)
        self.assertEqual(s.state("beta"), "stopped")
        self.assertFalse(s.ev("shutdown"))

    def test_stale_timers_are_ignored(self):
        s = Script()
        s.configure("alpha")
        s.failed("alpha")
        _, token = s.wakes["alpha"]
        s.ev("reconnect-requested", ("alpha", "operator"))
        self.assertFalse(s.ev("timer", ("alpha", token)))


class PublicationTest(unittest.TestCase):
    def test_republish_only_on_a_difference(self):
        s = Script()
        s.configure("alpha")
        s.connected("alpha", ("one", "two"))
        self.assertIsNone(published(s.ev("tools-changed", ("alpha", tools("two", "one"))), "alpha"))
        changed = published(s.ev("tools-changed", ("alpha", tools("one", "three"))), "alpha")
        self.assertEqual([t[1] for t in changed], ["one", "three"])
        # A new revision (description or schema) republishes; so does a read-only flip.
        newer = [("one", False, 8), ("three", False, 7)]
        self.assertIsNotNone(published(s.ev("tools-changed", ("alpha", newer)), "alpha"))
        flipped = [("one", True, 8), ("three", False, 7)]
        pub = published(s.ev("tools-changed", ("alpha", flipped)), "alpha")
        self.assertEqual(pub[0], ("alpha__one", "one", True))

    def test_filters_and_reconfiguration(self):
        s = Script()
        s.configure("alpha", include=["read_*"], exclude=["read_secret"])
        pub = published(s.connected("alpha", ("read_file", "read_secret", "write_file")), "alpha")
        self.assertEqual([t[1] for t in pub], ["read_file"])
        self.assertIsNone(published(s.configure("alpha", include=["read_*"], exclude=["read_secret"]), "alpha"))
        pub = published(s.configure("alpha", exclude=["read_secret"]), "alpha")
        self.assertEqual([t[1] for t in pub], ["read_file", "write_file"])

    def test_usable_unique_names_without_hiding_tools(self):
        s = Script()
        s.configure("files.v2")
        long = "x" * 100
        pub = published(s.connected("files.v2", ("read file", "read_file", "write", long)), "files.v2")
        names = [t[0] for t in pub]
        self.assertEqual(len(pub), 4)
        self.assertEqual(len(set(names)), 4)
        self.assertTrue(all(naming.valid_name(n) for n in names))
        self.assertEqual(sorted(t[1] for t in pub), sorted(["read file", "read_file", "write", long]))

    def test_collisions_across_servers_give_the_newcomer_another_name(self):
        s = Script()
        s.configure("a.b")
        s.configure("a_b")
        first = published(s.connected("a.b", ("x",)), "a.b")
        second = published(s.connected("a_b", ("x",)), "a_b")
        self.assertEqual(first[0][0], "a_b__x")
        self.assertNotEqual(second[0][0], "a_b__x")
        self.assertTrue(naming.valid_name(second[0][0]))
        # The names stay stable while the tools do.
        self.assertIsNone(published(s.ev("tools-changed", ("a_b", tools("x"))), "a_b"))

    def test_an_empty_list_is_published_and_withdrawn_once(self):
        s = Script()
        s.configure("alpha")
        self.assertEqual(published(s.connected("alpha", ()), "alpha"), [])
        self.assertEqual(len(kinds(s.disconnected("alpha"), "withdraw", "alpha")), 1)


class OperatorNamingTest(unittest.TestCase):
    """Contract 0.2.1: the operator's prefix per server (`set-naming`) and prompt names."""

    def test_an_empty_prefix_gives_the_servers_own_names(self):
        s = Script()
        s.p.set_naming("files", "")  # before its configuration, as the host gives it
        s.configure("files")
        pub = published(s.connected("files", ("read_file", "list dir")), "files")
        self.assertEqual(sorted(pub), [("list_dir", "list dir", False), ("read_file", "read_file", False)])

    def test_a_prefix_goes_before_each_name(self):
        s = Script()
        s.p.set_naming("files", "x-")
        s.configure("files")
        pub = published(s.connected("files", ("read_file", "é")), "files")
        self.assertEqual(sorted(pub), [("x-_", "é", False), ("x-read_file", "read_file", False)])

    def test_no_naming_gives_todays_names(self):
        s = Script()
        s.p.set_naming("files", None)
        s.configure("files")
        pub = published(s.connected("files", ("read_file",)), "files")
        self.assertEqual(pub, [("files__read_file", "read_file", False)])
        self.assertEqual(naming.advertised_name("files", "t" * 100, None), naming.advertised_name("files", "t" * 100))

    def test_long_names_with_a_prefix_are_clamped_with_a_hash(self):
        s = Script()
        s.p.set_naming("files", "prefix-")
        s.configure("files")
        long = "t" * 100
        pub = published(s.connected("files", (long, long + "u")), "files")
        names = [adv for adv, _orig, _ro in pub]
        self.assertTrue(all(len(n) == 64 and naming.valid_name(n) and n.startswith("prefix-ttt") for n in names))
        self.assertEqual(len(set(names)), 2)
        self.assertEqual(names[0], naming.advertised_name("files", long, "prefix-"))
        # An empty name under an empty prefix still gets a usable one.
        self.assertTrue(naming.valid_name(naming.advertised_name("files", "", "")))

    def test_a_new_naming_renames_at_the_next_configuration(self):
        s = Script()
        s.configure("files")
        s.connected("files", ("read",))
        s.p.set_naming("files", "x-")
        self.assertEqual(published(s.configure("files"), "files"), [("x-read", "read", False)])
        self.assertIsNone(published(s.configure("files"), "files"))  # nothing new: no republication
        s.p.set_naming("files", None)
        self.assertEqual(published(s.configure("files"), "files"), [("files__read", "read", False)])

    def test_collisions_still_fail_closed(self):
        # Two servers whose own names clash: the newcomer gets another name, never the same one;
        # the first keeps its name; nothing is hidden.
        s = Script()
        for name in ("a", "b"):
            s.p.set_naming(name, "")
            s.configure(name)
        first = published(s.connected("a", ("read",)), "a")
        second = published(s.connected("b", ("read",)), "b")
        self.assertEqual(first, [("read", "read", False)])
        self.assertNotEqual(second[0][0], "read")
        self.assertTrue(naming.valid_name(second[0][0]))
        self.assertEqual(s.p.owners, {"read": "a", second[0][0]: "b"})
        # And within one server: a prefix may map two tools to one name.
        s.p.set_naming("c", "")
        s.configure("c")
        pub = published(s.connected("c", ("x y", "x_y")), "c")
        self.assertEqual(len({adv for adv, _o, _r in pub}), 2)

    def test_prompts_are_named_by_the_same_rule_and_change_nothing(self):
        s = Script()
        s.p.set_naming("files", "x-")
        s.configure("files")
        s.connected("files", ("read",))
        s.p.take_logs()
        before = s.p.snapshot()
        named = s.p.name_prompts("files", ["summarize", "a b", "a_b", "summarize", "t" * 100])
        self.assertEqual(s.p.snapshot(), before)
        self.assertEqual(s.p.take_logs(), [])
        self.assertEqual([orig for _adv, orig in named], ["summarize", "a b", "a_b", "t" * 100])
        advertised = [adv for adv, _orig in named]
        self.assertEqual(advertised[0], "x-summarize")
        self.assertEqual(advertised[3], naming.advertised_name("files", "t" * 100, "x-"))
        self.assertEqual(len(set(advertised)), 4)
        self.assertTrue(all(naming.valid_name(n) for n in advertised))
        # The order of the list does not decide who gets the plain name.
        self.assertEqual(sorted(s.p.name_prompts("files", ["a_b", "a b"])), sorted(named[1:3]))
        self.assertEqual(s.p.name_prompts("other", ["p"]), [("other__p", "p")])
        s.p.set_naming("mine", "")
        self.assertEqual(s.p.name_prompts("mine", ["p"]), [("p", "p")])

    def test_naming_survives_snapshots_and_ends_with_the_server(self):
        s = Script()
        s.p.set_naming("files", "x-")
        s.p.set_naming("later", "")  # not configured yet: kept all the same
        s.configure("files")
        s.connected("files", ("read",))
        blob = s.p.snapshot()
        restored = Policy.restore(blob)
        self.assertEqual(restored.snapshot(), blob)
        self.assertEqual(restored.namings, {"files": "x-", "later": ""})
        self.assertEqual(restored.name_prompts("files", ["p"]), [("x-p", "p")])
        removed = s.ev("server-removed", "files")
        self.assertEqual(len(kinds(removed, "withdraw", "files")), 1)
        self.assertEqual(s.p.namings, {"later": ""})
        s.configure("files")
        self.assertEqual(published(s.connected("files", ("read",)), "files"), [("files__read", "read", False)])
        s.ev("server-removed", "later")  # never configured: its naming ends too
        self.assertEqual(s.p.namings, {})

    def test_a_snapshot_without_namings_restores(self):
        # As a build before contract 0.2.1 wrote it: no `namings`, no `named_by`.
        s = Script()
        s.healthy("alpha")
        old = json.loads(s.p.snapshot())
        del old["namings"]
        for server in old["servers"]:
            del server["named_by"]
        restored = Policy.restore(json.dumps(old).encode())
        self.assertEqual(restored.namings, {})
        self.assertEqual(restored.status(s.now), s.p.status(s.now))
        self.assertIsNone(published(restored.handle(s.now, ("tools-changed", ("alpha", tools("work")))), "alpha"))
        for damaged in ({"alpha": 3}, ["alpha"]):
            bad = dict(old, namings=damaged)
            with self.assertRaises(PolicyError):
                Policy.restore(json.dumps(bad).encode())

    def test_take_over_keeps_namings_given_before_it(self):
        p = Policy()
        p.set_naming("alpha", "")
        actions = p.take_over(SnapshotAndTakeOverTest.handover(None))
        self.assertEqual(published(actions, "alpha"), [("work", "work", False)])
        self.assertEqual(p.namings, {"alpha": ""})


class BreakerTest(unittest.TestCase):
    def open_breaker(self, s):
        for _ in range(10):
            admission = s.call("alpha", BROKEN)
            if admission[0] not in ("allow", "probe"):
                return admission
        self.fail("the breaker did not open")

    def test_opens_after_the_threshold_and_fails_fast(self):
        s = Script()
        s.healthy("alpha")
        admission = self.open_breaker(s)
        self.assertEqual(admission[0], "reject")
        self.assertIn('"alpha"', admission[1])
        st = s.status("alpha")
        self.assertEqual((st["breaker"], st["breaker_failures"]), ("open", 5))
        self.assertEqual(st["breaker_until"], s.now + 30_000)
        self.assertEqual(s.p.status(s.now + 30_000)[0]["breaker"], "half-open")

    def test_exactly_one_half_open_probe_and_a_failed_probe_doubles_the_cooldown(self):
        s = Script()
        s.healthy("alpha")
        self.open_breaker(s)
        s.now += 30_000
        probe_id, first = s.admit("alpha")
        self.assertEqual(first, ("probe",))
        self.assertEqual(s.admit("alpha")[1][0], "reject")
        s.ev("call-finished", ("alpha", probe_id, ("timeout",)))
        self.assertEqual(s.status("alpha")["breaker_until"], s.now + 60_000)
        s.now += 60_000
        probe_id, again = s.admit("alpha")
        self.assertEqual(again, ("probe",))
        s.ev("call-finished", ("alpha", probe_id, ("cancelled",)))
        probe_id, third = s.admit("alpha")
        self.assertEqual(third, ("probe",))  # a cancelled probe frees the probe
        s.ev("call-finished", ("alpha", probe_id, ("ok",)))
        self.assertEqual(s.admit("alpha")[1], ("allow",))
        self.assertEqual(s.status("alpha")["breaker"], "closed")

    def test_a_probe_without_a_session_signals_reconnect(self):
        s = Script()
        s.healthy("alpha")
        self.open_breaker(s)
        s.disconnected("alpha")
        s.now += 24 * 3600 * 1000
        kind, message = s.admit("alpha")[1]
        self.assertEqual(kind, "reconnect")
        self.assertIn('"alpha"', message)
        self.assertNotEqual(s.admit("alpha")[1][0], "reconnect")  # only one
        self.assertTrue(kinds(s.ev("reconnect-requested", ("alpha", "probe")), "connect", "alpha"))
        s.connected("alpha")
        self.assertEqual(s.admit("alpha")[1], ("allow",))

    def test_a_failed_reconnect_probe_reopens(self):
        s = Script()
        s.healthy("alpha")
        self.open_breaker(s)
        s.disconnected("alpha")
        s.now += 30_000
        self.assertEqual(s.admit("alpha")[1][0], "reconnect")
        s.ev("reconnect-requested", ("alpha", "probe"))
        s.failed("alpha", RESET)
        self.assertEqual(s.status("alpha")["breaker"], "open")

    def test_tool_errors_never_open_it(self):
        s = Script()
        s.healthy("alpha")
        for _ in range(30):
            self.assertEqual(s.call("alpha", ("tool-error", "bad args")), ("allow",))
        self.assertEqual(s.status("alpha")["tool_errors"], 30)
        s.call("alpha", ("ok",))
        self.assertEqual(s.status("alpha")["tool_errors"], 0)


class HoldTest(unittest.TestCase):
    def test_holds_while_connecting_or_an_attempt_is_due_soon(self):
        s = Script('{"jitter_pct": 0}')
        s.configure("alpha")
        kind, wait, message = s.admit("alpha")[1]
        self.assertEqual((kind, wait), ("hold", 3_000))
        self.assertIn('"alpha"', message)
        s.failed("alpha", RESET)  # next attempt in 500 ms
        self.assertEqual(s.admit("alpha")[1][:2], ("hold", 3_500))
        s.configure("beta")
        s.failed("beta", HANDSHAKE)  # next attempt in 4 s: too far
        kind, message = s.admit("beta")[1]
        self.assertEqual(kind, "reject")
        self.assertIn("about 4 s", message)

    def test_hold_can_be_turned_off(self):
        s = Script('{"hold_ms": 0}')
        s.configure("alpha")
        self.assertEqual(s.admit("alpha")[1][0], "reject")

    def test_messages_never_carry_the_hosts_fault_text(self):
        s = Script()
        s.configure("alpha")
        s.failed("alpha", ("transport-closed", "https://user:secret@example.com"))
        self.assertNotIn("secret", s.admit("alpha")[1][-1])
        self.assertIn("secret", s.status("alpha")["last_fault"])  # operators see it


def story(settings_json=""):
    s = Script(settings_json)
    out = [s.configure("alpha"), s.failed("alpha", RESET), s.fire("alpha"), s.connected("alpha", ("work", "read"))]
    for outcome in [("ok",), BROKEN, ("timeout",), ("tool-error", "bad")]:
        out.append(s.call("alpha", outcome))
    out += [s.keepalive("alpha"), s.disconnected("alpha"), s.fire("alpha"), s.p.status(s.now)]
    return out, s


class SnapshotAndTakeOverTest(unittest.TestCase):
    def test_deterministic(self):
        # Two runs in separate interpreters with different string hashing: nothing may depend
        # on hash() or set order.
        import subprocess

        code = (
            "import sys; sys.dont_write_bytecode = True; sys.path.insert(0, %r); "
            "import test_policy; print(repr(test_policy.story()[0]))" % os.path.dirname(os.path.abspath(__file__))
        )
        runs = []
        for seed in ("1", "2"):
            env = dict(os.environ, PYTHONHASHSEED=seed)
            done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            runs.append(done.stdout)
        self.assertEqual(runs[0], runs[1])
        self.assertEqual(runs[0], repr(story()[0]) + "\n")

    def test_snapshot_round_trips_exactly(self):
        s = Script()
        s.healthy("alpha")
        BreakerTest.open_breaker(self, s)
        s.configure("beta")
        s.failed("beta")
        blob = s.p.snapshot()
        restored = Policy.restore(blob)
        self.assertEqual(restored.snapshot(), blob)
        self.assertEqual(restored.status(s.now), s.p.status(s.now))
        # Both continue identically.
        for p in (s.p, restored):
            p.now = s.now
        self.assertEqual(
            s.p.handle(s.now + 5, ("connect-failed", ("beta", HANDSHAKE))),
            restored.handle(s.now + 5, ("connect-failed", ("beta", HANDSHAKE))),
        )

    def test_deep_json_is_refused_not_a_crash(self):
        deep = "[" * 100_000 + "]" * 100_000
        for text in ('{"a": %s}' % deep, '{"a": ' + "[" * 33 + "]" * 33 + "}"):
            with self.assertRaises(PolicyError) as caught:
                Policy(text)
            self.assertIn("nested deeper than 32", str(caught.exception))
        p = Policy("")
        with self.assertRaises(PolicyError):
            p.set_settings('{"x": %s}' % deep)
        with self.assertRaises(PolicyError):
            Policy.restore(('{"format": %s}' % deep).encode())
        # Brackets inside strings do not count.
        with self.assertRaises(PolicyError) as caught:
            Policy('{"%s": 1}' % ("[" * 100))
        self.assertIn("unknown setting", str(caught.exception))
        s = Script()
        s.configure("alpha", server_settings='{"a": %s}' % deep)
        self.assertEqual(s.state("alpha"), "parked")

    def test_times_never_exceed_u64(self):
        u64 = (1 << 64) - 1
        s = Script()
        s.healthy("alpha")
        s.now = u64 - 10
        BreakerTest.open_breaker(self, s)
        for entry in s.p.status(s.now):
            for key in ("breaker_until", "next_attempt_at"):
                value = entry.get(key)
                self.assertTrue(value is None or 0 <= value <= u64, (key, value))

    def test_the_failure_window_is_bounded(self):
        s = Script('{"window_failures": 3, "max_failures": 1000, "window_ms": 1000000000}')
        s.configure("alpha")
        for _ in range(50):
            s.failed("alpha", RESET)
            s.fire("alpha")
            self.assertLessEqual(len(s.p.servers["alpha"].window), 3)

    def test_restore_refuses_what_it_did_not_write(self):
        for blob in [b"", b"not json", b"{}", json.dumps({"format": "x"}).encode()]:
            with self.assertRaises(PolicyError):
                Policy.restore(blob)
        good = json.loads(Policy().snapshot())
        good["version"] = 99
        with self.assertRaises(PolicyError):
            Policy.restore(json.dumps(good).encode())
        s = Script()
        s.healthy("alpha")
        damaged = json.loads(s.p.snapshot())
        damaged["servers"][0]["failures"] = "many"
        with self.assertRaises(PolicyError):
            Policy.restore(json.dumps(damaged).encode())

    def handover(self):
        base = {
            "breaker": "closed", "breaker_until": None, "failures": 0, "breaker_failures": 0,
            "tool_errors": 0, "last_fault": None, "since": 1, "next_attempt_at": None,
        }
        return {
            "now": 100,
            "previous": ("tether-default-policy", "1.0"),
            "servers": [
                dict(base, config=config("alpha"), connecting=False, state="healthy",
                     session={"info": "x", "tools": tools("work"), "proven": True}),
                dict(base, config=config("beta"), session=None, connecting=False,
                     state="backing-off", failures=2, last_fault="handshake timed out",
                     next_attempt_at=5_000),
                dict(base, config=config("gamma"), session=None, connecting=True, state="connecting"),
                dict(base, config=config("delta"), session=None, connecting=False, state="parked",
                     next_attempt_at=50),
                dict(base, config=config("eps"), session=None, connecting=False,
                     state="backing-off", breaker="open", breaker_until=9_000, breaker_failures=4),
            ],
        }

    def test_take_over_keeps_sessions_and_arms_planned_attempts(self):
        p = Policy()
        actions = p.take_over(self.handover())
        connects = [a[1] for a in kinds(actions, "connect")]
        self.assertNotIn("alpha", connects)
        self.assertNotIn("gamma", connects)
        self.assertEqual(connects, ["eps"])  # no planned time: attempted now
        self.assertEqual(published(actions, "alpha"), [("alpha__work", "work", False)])
        wakes = {a[1]: a[2] for a in kinds(actions, "wake")}
        self.assertEqual(wakes, {"beta": 5_000, "delta": 100})
        status = {st["server"]: st for st in p.status(100)}
        self.assertEqual(status["alpha"]["state"], "healthy")
        self.assertEqual(status["beta"]["failures"], 2)
        self.assertEqual(status["gamma"]["state"], "connecting")
        self.assertEqual(status["delta"]["state"], "parked")
        self.assertEqual((status["eps"]["breaker"], status["eps"]["breaker_until"]), ("open", 9_000))
        self.assertEqual(p.admit(10, 1, "alpha", "work"), ("allow",))

    def test_take_over_refuses_a_busy_policy_or_duplicates(self):
        p = Policy()
        p.take_over(self.handover())
        with self.assertRaises(PolicyError):
            p.take_over(self.handover())
        h = self.handover()
        h["servers"].append(h["servers"][0])
        with self.assertRaises(PolicyError):
            Policy().take_over(h)


if __name__ == "__main__":
    unittest.main()
