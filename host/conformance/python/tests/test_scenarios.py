"""The scenario interpreter, against a fake policy written in Python. Pure: no wasmtime."""

import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tether_policy_host.scenarios import (  # noqa: E402
    MalformedScenario, Run, Scenario, ScenarioFailure, run_scenario,
)


class Refused(Exception):
    pass


class FakePolicy:
    """A tiny policy: connect on configure; back off 500 ms per failure, park after 3 (or at once
    on spawn-failed); publish on connect (prefix server__); a breaker that opens after 2
    transport errors and half-opens 10 s later; snapshot as JSON."""

    generation = 0  # bumped per instance when `nondeterministic`
    label = "fake.wasm"

    def __init__(self, nondeterministic=False, bad_restore=False):
        self.nondeterministic = nondeterministic
        self.bad_restore = bad_restore
        self.servers = {}
        self.token = 0
        FakePolicy.generation += 1
        self.gen = FakePolicy.generation

    # -- the instance interface the interpreter uses --
    def normalize(self, function, value):
        return [value]

    def init(self, settings):
        if json.loads(settings).get("bad"):
            raise Refused("unknown setting bad")
        self.servers = {}
        return self

    def _wake(self, server, at):
        self.token += 1
        return {"tag": "wake-at", "val": {"server": server, "at": at, "token": self.token}}

    def handle(self, event):
        now, kind = event["now"], event["kind"]
        tag, val = kind["tag"], kind.get("val")
        if tag == "server-configured":
            self.servers[val["name"]] = {"state": "connecting", "failures": 0, "tools": [], "breaker": 0,
                                         "open-until": None, "session": False, "probe": None}
            return [{"tag": "connect", "val": val["name"]}]
        if tag == "server-removed":
            self.servers.pop(val, None)
            return [{"tag": "withdraw-tools", "val": val}, {"tag": "disconnect", "val": val}]
        if tag == "shutdown":
            return [{"tag": "withdraw-tools", "val": s} for s in self.servers]
        if tag == "connected":
            s = self.servers[val["server"]]
            s.update(state="connected", session=True, tools=[t["name"] for t in val["tools"]], breaker=0, **{"open-until": None})
            tools = [{"advertised": "%s__%s" % (val["server"], t.replace(" ", "_")), "original": t, "read-only": False}
                     for t in s["tools"]]
            return [{"tag": "publish-tools", "val": {"server": val["server"], "tools": tools}}]
        if tag in ("connect-failed", "disconnected"):
            name = val["server"]
            s = self.servers[name]
            out = [{"tag": "withdraw-tools", "val": name}] if s["session"] else []
            s["session"] = False
            s["failures"] += 1
            if s["failures"] >= 3 or val["fault"]["tag"] == "spawn-failed":
                s["state"] = "parked"
                return out + [self._wake(name, now + 60000)]
            s["state"] = "backing-off"
            delay = 500 + (self.gen if self.nondeterministic else 0)
            return out + [self._wake(name, now + delay)]
        if tag == "timer":
            self.servers[val["server"]]["state"] = "connecting"
            return [{"tag": "connect", "val": val["server"]}]
        if tag == "call-finished":
            s = self.servers[val["server"]]
            outcome = val["outcome"]["tag"]
            if s["probe"] == val["call-id"]:
                s["probe"] = None
            if outcome == "transport-error":
                s["breaker"] += 1
                if s["breaker"] >= 2:
                    s["open-until"] = now + 10000
            elif outcome == "ok":
                s["breaker"], s["open-until"] = 0, None
            return []
        if tag == "reconnect-requested":
            return [{"tag": "connect", "val": val["server"]}]
        return []

    def admit(self, request):
        name = request["server"]
        s = self.servers.get(name)
        if s is None:
            return {"tag": "reject", "val": "unknown server %s" % name}
        if not s["session"]:
            return {"tag": "hold", "val": {"wait-ms": 5000, "message": "%s is reconnecting" % name}}
        if s["open-until"] is not None:
            if request["now"] >= s["open-until"] and s["probe"] is None:
                s["probe"] = request["call-id"]
                return {"tag": "probe"}
            return {"tag": "reconnect" if request["now"] >= s["open-until"] else "reject", "val": "%s is failing" % name}
        return {"tag": "allow"}

    def status(self, now):
        return [{"server": n, "state": s["state"], "failures": s["failures"]} for n, s in sorted(self.servers.items())]

    def snapshot(self):
        return json.dumps({"servers": self.servers, "token": self.token}).encode()

    def restore(self, snapshot):
        data = json.loads(snapshot)
        self.servers, self.token = data["servers"], data["token"]
        if self.bad_restore:
            for s in self.servers.values():
                s["failures"] += 1

    def take_over(self, handover):
        out = []
        for entry in handover["servers"]:
            name = entry["config"]["name"]
            session = entry["session"]
            self.servers[name] = {"state": entry["state"], "failures": entry["failures"], "breaker": 0,
                                  "open-until": None, "session": session is not None, "probe": None,
                                  "tools": [t["name"] for t in (session or {}).get("tools", [])]}
            if session is not None:
                tools = [{"advertised": "%s__%s" % (name, t), "original": t, "read-only": False}
                         for t in self.servers[name]["tools"]]
                out.append({"tag": "publish-tools", "val": {"server": name, "tools": tools}})
            elif entry["next-attempt-at"] is not None:
                out.append(self._wake(name, entry["next-attempt-at"]))
        return out


def factory(**options):
    return lambda: FakePolicy(**options)


def ev(tag, val=None):
    return {"do": "event", "kind": {"tag": tag} if val is None else {"tag": tag, "val": val}}


def configure(name, include=(), exclude=()):
    return ev("server-configured", {"name": name, "transport": "stdio", "include": list(include),
                                    "exclude": list(exclude), "settings": ""})


def connected(name, tools):
    return ev("connected", {"server": name, "server-info": "t 1.0",
                            "tools": [{"name": t, "read-only": False, "revision": 2**63 + 1} for t in tools]})


def failed(name, fault=None):
    return ev("connect-failed", {"server": name, "fault": fault or {"tag": "handshake-timed-out"}})


def expect(pred, message="nope"):
    return {"do": "expect", "that": pred, "else": message}


def run(steps, settings="{}", **options):
    return run_scenario(Scenario("t", "contract", "", steps), factory(**options), settings)


class Steps(unittest.TestCase):
    def assertPasses(self, steps, **options):
        outcome = run(steps, **options)
        self.assertIsNone(outcome.failure, "\n".join(outcome.transcript))
        return outcome

    def test_event_and_transcript_lines(self):
        outcome = self.assertPasses([configure("a"), expect({"connects": "a"})])
        self.assertEqual(outcome.transcript, [
            '{"do":"init","settings":"{}"}',
            '{"do":"handle","event":{"now":1000,"kind":{"tag":"server-configured","val":{"name":"a",'
            '"transport":"stdio","include":[],"exclude":[],"settings":""}}},"actions":[{"tag":"connect","val":"a"}]}',
        ])

    def test_fire_timer_moves_time_and_sends_the_token(self):
        outcome = self.assertPasses([
            configure("a"), failed("a"), expect({"timer-armed": "a"}), expect({"timer-not-in-the-past": "a"}),
            {"do": "fire-timer", "server": "a", "optional": False}, expect({"connects": "a"}),
            expect({"not": {"timer-armed": "a"}}, "the fired timer is removed"),
            {"do": "fire-timer", "server": "a", "optional": True},  # none armed: skipped
        ])
        self.assertEqual(len(outcome.transcript), 4)
        self.assertIn('"event":{"now":1500,"kind":{"tag":"timer","val":{"server":"a","token":1}}}', outcome.transcript[3])

    def test_fire_timer_without_a_timer_fails(self):
        outcome = run([configure("a"), {"do": "fire-timer", "server": "a", "optional": False}])
        self.assertEqual(outcome.failure, "at step 1 (configure a): expected a timer armed for a, none is")

    def test_timer_in_the_past(self):
        self.assertIsNone(run([configure("a"), failed("a"), {"do": "advance", "ms": 501},
                               expect({"not": {"timer-not-in-the-past": "a"}})]).failure)

    def test_admit_finish_and_call(self):
        outcome = self.assertPasses([
            configure("a"), connected("a", ["work"]),
            {"do": "admit", "server": "a", "tool": "work", "name": "first"}, expect({"admission": "allow"}),
            {"do": "call", "server": "a", "tool": "work", "outcome": {"tag": "transport-error", "val": {"tag": "session-expired"}}},
            {"do": "call", "server": "a", "tool": "work", "outcome": {"tag": "transport-error", "val": {"tag": "session-expired"}}},
            {"do": "admit", "server": "a", "tool": "work", "name": None},
            expect({"admission": "reject"}), expect({"refused-naming": "a"}), expect({"not": {"refused-naming": "zzz"}}),
            {"do": "call", "server": "a", "tool": "work", "outcome": {"tag": "ok"}},  # refused: not finished
            {"do": "advance", "ms": 10000},
            {"do": "admit", "server": "a", "tool": "work", "name": "probe"}, expect({"admission": "probe"}),
            {"do": "admit", "server": "a", "tool": "work", "name": None}, expect({"admission": "reconnect"}),
            {"do": "finish", "server": "a", "call": "probe", "outcome": {"tag": "ok"}},
            {"do": "admit", "server": "a", "tool": "work", "name": None}, expect({"admission": "allow"}),
            {"do": "finish", "server": "a", "call": None, "outcome": {"tag": "cancelled"}},
            {"do": "finish", "server": "a", "call": "first", "outcome": {"tag": "ok"}},
        ])
        lines = [json.loads(l) for l in outcome.transcript]
        admits = [l["request"]["call-id"] for l in lines if l["do"] == "admit"]
        self.assertEqual(admits, [1, 2, 3, 4, 5, 6, 7, 8])
        finished = [l["event"]["kind"]["val"]["call-id"] for l in lines
                    if l["do"] == "handle" and l["event"]["kind"]["tag"] == "call-finished"]
        self.assertEqual(finished, [2, 3, 6, 8, 1])
        self.assertEqual(lines[-1]["event"]["kind"]["val"]["duration-ms"], 5)
        self.assertEqual(list(lines[3]["request"]), ["now", "call-id", "server", "tool"])

    def test_hold_is_a_refusal_naming_the_server(self):
        self.assertPasses([configure("a"), {"do": "admit", "server": "a", "tool": "t", "name": None},
                           expect({"admission": "hold"}), expect({"refused-naming": "a"})])

    def test_finish_unknown_call_fails(self):
        finish = {"do": "finish", "server": "a", "call": "x", "outcome": {"tag": "ok"}}
        self.assertEqual(run([finish]).failure, "at step 0 (start): no call named x was admitted")
        finish["call"] = None
        self.assertEqual(run([finish]).failure, "at step 0 (start): no call was admitted")

    def test_status_predicates(self):
        outcome = self.assertPasses([
            configure("a"), configure("b"), failed("b", {"tag": "spawn-failed", "val": "nope"}), {"do": "status"},
            expect({"lists": "a"}), expect({"not": {"lists": "zzz"}}),
            expect({"state": {"server": "b", "in": ["parked"]}}),
            expect({"state": {"server": "a", "in": ["connecting", "connected"]}}),
            expect({"not": {"state": {"server": "a", "in": ["parked"]}}}),
        ])
        self.assertEqual(json.loads(outcome.transcript[-1]),
                         {"do": "status", "now": 1000, "status": [
                             {"server": "a", "state": "connecting", "failures": 0},
                             {"server": "b", "state": "parked", "failures": 1}]})
        missing = run([{"do": "status"}, expect({"not": {"state": {"server": "a", "in": ["parked"]}}})])
        self.assertEqual(missing.failure, "at step 0 (start): status() does not list a")

    def test_publication_predicates(self):
        self.assertPasses([
            configure("a"), connected("a", ["read file", "write"]),
            expect({"publishes": "a"}), expect({"not": {"publishes": "b"}}),
            expect({"publishes-originals": {"server": "a", "originals": ["write", "read file"]}}),
            expect({"not": {"publishes-originals": {"server": "a", "originals": ["write"]}}}),
            expect({"publishes-usable-names": "a"}),
            expect({"not": {"publishes-usable-names": "b"}}, "no publication: does not hold"),
        ])
        # A policy publishing such names fails as invalid output first; the predicate still says no.
        probe = Run(factory())
        for name in ("x" * 70, "é", ""):
            probe.actions = [{"tag": "publish-tools", "val": {"server": "a", "tools": [
                {"advertised": name, "original": "t", "read-only": False}]}}]
            self.assertFalse(probe.holds({"publishes-usable-names": "a"}), name)

    def test_withdraws_and_disconnects(self):
        self.assertPasses([
            configure("a"), connected("a", ["t"]), configure("b"),
            ev("server-removed", "a"), expect({"withdraws": {"server": "a", "times": 1}}),
            expect({"withdraws": {"server": "b", "times": 0}}), expect({"disconnects": "a"}),
            expect({"not": {"disconnects": "b"}}), ev("shutdown"), expect({"withdraws": {"server": "b", "times": 1}}),
        ])

    def test_expect_fails_with_its_message(self):
        outcome = run([configure("a"), expect({"connects": "b"}, "expected connect(b)")])
        self.assertEqual(outcome.failure, 'at step 1 (configure a): expected connect(b); '
                                          'the actions were [{"tag":"connect","val":"a"}]')
        outcome = run([configure("a"), failed("a"), expect({"not": {"timer-armed": "a"}}, "no timer")])
        self.assertEqual(outcome.failure, 'at step 2 (a failed to connect (MCP handshake timed out)): no timer; '
                                          'at 1000 the timers were {"a": (1500, 1)}')
        outcome = run([{"do": "status"}, expect({"lists": "a"}, "missing"), ])
        self.assertEqual(outcome.failure, "at step 0 (start): missing; the status was []")
        outcome = run([configure("a"), expect({"admission": "allow"}, "none")])
        self.assertEqual(outcome.failure, "at step 1 (configure a): none; no call was admitted")
        outcome = run([configure("a"), {"do": "admit", "server": "a", "tool": "t", "name": None},
                       expect({"refused-naming": "b"}, "naming")])
        self.assertEqual(outcome.failure, 'at step 2 (admit a call to a/t): naming; the admission was '
                                          '{"tag":"hold","val":{"wait-ms":5000,"message":"a is reconnecting"}}')

    def test_repeat_stop_if_and_else(self):
        park = [configure("a"), {"do": "repeat", "times": 5, "else": "not parked", "steps": [
            failed("a"), {"do": "status"}, {"do": "stop-if", "that": {"state": {"server": "a", "in": ["parked"]}}},
            {"do": "fire-timer", "server": "a", "optional": False}, expect({"connects": "a"})]}]
        outcome = self.assertPasses(park)
        self.assertEqual(sum('"connect-failed"' in l for l in outcome.transcript), 3)
        too_few = json.loads(json.dumps(park))
        too_few[1]["times"] = 2
        self.assertEqual(run(too_few).failure.split(": ", 1)[1], "not parked")
        too_few[1]["else"] = None
        self.assertIsNone(run(too_few).failure)
        stop_on_last = json.loads(json.dumps(park))
        stop_on_last[1]["times"] = 3
        self.assertIsNone(run(stop_on_last).failure)
        # Outside a repeat, a stop-if that holds ends the scenario (as passed), as in Tether.
        ended = run([configure("a"), failed("a"), {"do": "stop-if", "that": {"timer-armed": "a"}},
                     expect({"connects": "zzz"})])
        self.assertIsNone(ended.failure)
        self.assertEqual(len(ended.transcript), 3)
        self.assertIsNone(run([{"do": "stop-if", "that": {"timer-armed": "a"}}]).failure)  # does not hold: nothing

    def test_snapshot_restore(self):
        steps = [configure("a"), failed("a"), {"do": "snapshot-restore"},
                 expect({"not": {"lists": "a"}}, "snapshot-restore does not set the status"),
                 {"do": "status"}, expect({"state": {"server": "a", "in": ["backing-off"]}}, "restored"),
                 {"do": "fire-timer", "server": "a", "optional": False}, expect({"connects": "a"})]
        outcome = self.assertPasses(steps)
        self.assertEqual(outcome.transcript[3], '{"do":"snapshot-restore"}')
        self.assertEqual(sum('"init"' in l for l in outcome.transcript), 1)
        changed = run(steps, bad_restore=True)
        self.assertTrue(changed.failure.startswith("at step 3 (snapshot and restore into a fresh instance): "
                                                   "status changed across snapshot/restore: "), changed.failure)

    def test_snapshot_restore_with_steps_compares_what_the_restored_instance_answers(self):
        steps = [configure("a"), failed("a"), {"do": "snapshot-restore", "steps": [
            {"do": "fire-timer", "server": "a", "optional": False}, expect({"connects": "a"}), failed("a")]},
            expect({"timer-armed": "a"}, "the restored instance goes on")]
        outcome = self.assertPasses(steps)
        lines = outcome.transcript
        self.assertEqual(len(lines), 3 + 2 + 1 + 2)
        self.assertEqual(lines[5], '{"do":"snapshot-restore"}')
        self.assertEqual(lines[3:5], lines[6:8], "the same time, tokens and answers")

        class ForgetsTokens(FakePolicy):
            def restore(self, snapshot):
                super().restore(snapshot)
                self.token = 0
        outcome = run_scenario(Scenario("t", "contract", "", steps), ForgetsTokens)
        self.assertTrue(outcome.failure.startswith(
            "at step 8 (a failed to connect (MCP handshake timed out)): the restored instance answered otherwise "
            "than the original (line 2 of the block's transcript): "), outcome.failure)
        # A status that changes is found before the steps run again, at the restore.
        changed = run(steps, bad_restore=True)
        self.assertTrue(changed.failure.startswith("at step 6 (restore the snapshot into a fresh instance): "
                                                   "status changed across snapshot/restore: "), changed.failure)

    def test_published_redundant_and_attempting(self):
        class Noisy(FakePolicy):
            """Publishes again on a keepalive (in another order), withdraws on every failure."""

            def handle(self, event):
                kind = event["kind"]
                if kind["tag"] == "keepalive-ok":
                    name = kind["val"]
                    tools = [{"advertised": "%s__%s" % (name, t), "original": t, "read-only": False}
                             for t in reversed(self.servers[name]["tools"])]
                    return [{"tag": "publish-tools", "val": {"server": name, "tools": tools}},
                            {"tag": "withdraw-tools", "val": "b"}]
                actions = super().handle(event)
                if kind["tag"] == "connect-failed":
                    actions.insert(0, {"tag": "withdraw-tools", "val": kind["val"]["server"]})
                return actions
        steps = [
            configure("a"), expect({"attempting": "a"}), configure("b"),
            expect({"not": {"published": "a"}}), connected("a", ["x", "y"]), expect({"not": {"attempting": "a"}}),
            expect({"published": "a"}), expect({"not": {"redundant": "a"}}), expect({"not": {"published": "b"}}),
            ev("keepalive-ok", "a"), expect({"redundant": "a"}, "the same tools in another order"),
            expect({"redundant": "b"}, "a withdrawal of nothing"), expect({"published": "a"}),
            # Another revision of a tool is another publication.
            ev("connected", {"server": "a", "server-info": "t 1.0", "tools": [
                {"name": "x", "read-only": False, "revision": 1}, {"name": "y", "read-only": False, "revision": 2**63 + 1}]}),
            expect({"not": {"redundant": "a"}}), ev("disconnected", {"server": "a", "fault": {"tag": "session-expired"}}),
            expect({"not": {"published": "a"}}), expect({"not": {"redundant": "a"}}),
            {"do": "fire-timer", "server": "a", "optional": False}, expect({"attempting": "a"}),
            failed("a"), expect({"redundant": "a"}), expect({"not": {"attempting": "a"}}),
        ]
        outcome = run_scenario(Scenario("t", "contract", "", steps), Noisy)
        self.assertIsNone(outcome.failure, "\n".join(outcome.transcript))
        # `twice` starts its second run from what the host showed before it: there, the
        # publication is new again.
        outcome = run_scenario(Scenario("t", "contract", "", [
            {"do": "twice", "steps": [
                configure("a"), configure("b"), connected("a", ["x"]), expect({"not": {"redundant": "a"}}),
                ev("keepalive-ok", "a"), expect({"redundant": "a"})]},
            expect({"published": "b"}, "b shows nothing")]), Noisy)
        self.assertEqual(outcome.failure, 'at step 8 (a answered a keepalive): b shows nothing; '
                                          'the host holds publications of ["a"]')

    def test_take_over(self):
        handover = {"now": 1000, "servers": [
            {"config": {"name": "a", "transport": "stdio", "include": [], "exclude": [], "settings": ""},
             "session": {"server-info": "t", "tools": [{"name": "w", "read-only": False, "revision": 1}], "proven": True},
             "connecting": False, "state": "healthy", "breaker": "closed", "breaker-until": None, "failures": 0,
             "breaker-failures": 0, "tool-errors": 0, "last-fault": None, "since": 3, "next-attempt-at": None},
            {"config": {"name": "b", "transport": "stdio", "include": [], "exclude": [], "settings": ""},
             "session": None, "connecting": False, "state": "backing-off", "breaker": "closed", "breaker-until": None,
             "failures": 1, "breaker-failures": 0, "tool-errors": 0, "last-fault": "x", "since": 5, "next-attempt-at": 1505}],
            "previous": {"name": "p", "version": "1"}}
        outcome = self.assertPasses([
            configure("z"), {"do": "take-over", "handover": handover},
            expect({"publishes": "a"}), expect({"not": {"connects": "a"}}), expect({"timer-armed": "b"}),
            {"do": "status"}, expect({"not": {"lists": "z"}}, "a fresh instance took over"),
            {"do": "fire-timer", "server": "b", "optional": False}, expect({"connects": "b"}),
        ])
        self.assertEqual(outcome.transcript[2], '{"do":"init","settings":"{}"}')
        self.assertTrue(outcome.transcript[3].startswith('{"do":"take-over","handover":{"now":1000,"servers":[{"config":'))
        self.assertIn('"actions":[{"tag":"publish-tools"', outcome.transcript[3])
        self.assertIn('"now":1505', outcome.transcript[-1])

    def test_twice(self):
        story = [configure("a"), failed("a"), {"do": "fire-timer", "server": "a", "optional": True},
                 {"do": "admit", "server": "a", "tool": "t", "name": "x"}, {"do": "status"}]
        outcome = self.assertPasses([{"do": "advance", "ms": 5}, {"do": "twice", "steps": story}])
        lines = outcome.transcript
        self.assertEqual(len(lines), 1 + 5 + 1 + 5)
        self.assertEqual(lines[6], '{"do":"init","settings":"{}"}')
        self.assertEqual(lines[1:6], lines[7:12])  # same time, call ids, tokens
        self.assertIn('"now":1005', lines[1])
        differs = run([{"do": "twice", "steps": story}], nondeterministic=True)
        self.assertIn("the same inputs gave other outputs in a fresh instance (line 2 of the block's transcript)",
                      differs.failure)

    def test_policy_errors_fail_the_scenario(self):
        class Trapping(FakePolicy):
            def handle(self, event):
                raise RuntimeError("handle trapped: wasm trap: unreachable")
        outcome = run_scenario(Scenario("t", "contract", "", [configure("a")]), Trapping)
        self.assertEqual(outcome.failure, "at step 1 (configure a): handle trapped: wasm trap: unreachable")
        refused = run([configure("a")], settings='{"bad":true}')
        self.assertEqual(refused.failure, "unknown setting bad")  # as Tether: no step, no transcript
        self.assertEqual(refused.transcript, [])

    def test_bad_steps(self):
        def malformed(steps):
            with self.assertRaises(MalformedScenario) as caught:
                run(steps)
            return str(caught.exception)
        self.assertEqual(malformed([{"do": "dance"}]), 'malformed scenario t: steps[0]: unknown step "dance"')
        self.assertIn('unknown predicate "sings"', malformed([expect({"sings": "a"})]))
        self.assertIn('steps[0] lacks "server"', malformed([{"do": "fire-timer"}]))
        # Wrong types and unhashable values: reported, never a traceback.
        self.assertIn("steps[0].server must be a string", malformed([{"do": "fire-timer", "server": ["a"]}]))
        self.assertIn("steps[0].name must be a string or null",
                      malformed([{"do": "admit", "server": "a", "tool": "t", "name": {"x": 1}}]))
        self.assertIn("steps[0].that.connects must be a server name",
                      malformed([expect({"connects": ["a"]})]))
        self.assertIn("steps[0].steps[0].that.not.state.in: unknown state",
                      malformed([{"do": "twice", "steps": [expect({"not": {"state": {"server": "a", "in": ["x"]}}})]}]))
        self.assertIn("steps[0].times must be a non-negative integer",
                      malformed([{"do": "repeat", "times": -1, "steps": [], "else": None}]))
        self.assertIn("steps[0].ms must be a non-negative integer", malformed([{"do": "advance", "ms": "5"}]))
        self.assertIn("unknown field", malformed([{"do": "status", "now": 5}]))
        self.assertIn("is not a step", malformed(["status"]))
        self.assertIn('steps[0].steps[0]: unknown step "dance"',
                      malformed([{"do": "snapshot-restore", "steps": [{"do": "dance"}]}]))
        self.assertIn("steps[0].steps must be an array", malformed([{"do": "snapshot-restore", "steps": 5}]))

    def test_arguments_that_do_not_fit_the_contract_are_malformed(self):
        class Strict(FakePolicy):
            def normalize(self, function, value):
                if function == "handle" and not isinstance(value["kind"].get("val"), dict):
                    raise ValueError("event.kind.val: expected an object")
                return [value]
        with self.assertRaises(MalformedScenario) as caught:
            run_scenario(Scenario("odd", "contract", "", [ev("server-configured", 5)]), Strict)
        self.assertEqual(str(caught.exception), "malformed scenario odd: the handle argument does not fit the "
                                                "contract: event.kind.val: expected an object")

    def test_publications_must_name_offered_tools(self):
        class Inventive(FakePolicy):
            def handle(self, event):
                actions = super().handle(event)
                if event["kind"]["tag"] == "keepalive-ok":
                    server = event["kind"]["val"]
                    actions.append({"tag": "publish-tools", "val": {"server": server, "tools": [
                        {"advertised": "x__ghost", "original": "ghost", "read-only": False}]}})
                return actions
        steps = [configure("a"), connected("a", ["t"]), ev("keepalive-ok", "a")]
        outcome = run_scenario(Scenario("t", "contract", "", steps), Inventive)
        self.assertEqual(outcome.failure, 'at step 3 (a answered a keepalive): policy fake.wasm failed during handle: '
                                          'returned invalid output: published x__ghost as "ghost", '
                                          'which server "a" does not offer')
        ledger_steps = [configure("a"), connected("a", ["t"]), failed("a"), connected("a", ["t"])]
        self.assertIsNone(run(ledger_steps).failure)


class Answering(FakePolicy):
    """The fake policy, with answers injected per event tag / for admissions / on take-over."""

    extra = {}
    admission = None
    over = None

    def handle(self, event):
        actions = super().handle(event)
        add = self.extra.get(event["kind"]["tag"])
        return actions + (add(event) if callable(add) else list(add or []))

    def admit(self, request):
        return self.admission if self.admission is not None else super().admit(request)

    def take_over(self, handover):
        actions = super().take_over(handover)
        return actions if self.over is None else self.over


def answering(**attrs):
    return type("Custom", (Answering,), attrs)


def handover(*servers):
    def entry(name, session=None, connecting=False):
        return {"config": {"name": name}, "session": session, "connecting": connecting, "state": "connected",
                "failures": 0, "next-attempt-at": None}
    return {"now": 1000, "previous": {"name": "old", "version": "1"},
            "servers": [entry(*s) if isinstance(s, tuple) else entry(s) for s in servers]}


PREFIX = "policy fake.wasm failed during %s: returned invalid output: "


class InvalidOutputs(unittest.TestCase):
    """outputs.rs: what Tether's runtime refuses live fails the scenario, worded as Tether words it."""

    def fails(self, policy, steps, during, why, at=None):
        outcome = run_scenario(Scenario("t", "contract", "", steps), policy)
        self.assertIsNotNone(outcome.failure)
        self.assertTrue(outcome.failure.endswith(PREFIX % during + why), outcome.failure)
        if at is not None:
            self.assertTrue(outcome.failure.startswith("at step %d " % at), outcome.failure)
        return outcome

    def publishing(self, *tools):
        return answering(extra={"keepalive-ok": lambda e: [{"tag": "publish-tools", "val": {
            "server": e["kind"]["val"], "tools": [{"advertised": a, "original": o, "read-only": False}
                                                  for a, o in tools]}}]})

    def test_unknown_server_in_any_action(self):
        steps = [configure("a"), ev("shutdown")]
        for action in ({"tag": "connect", "val": "ghost"}, {"tag": "disconnect", "val": "ghost"},
                       {"tag": "withdraw-tools", "val": "ghost"},
                       {"tag": "wake-at", "val": {"server": "ghost", "at": 1, "token": 1}},
                       {"tag": "state-changed", "val": {"server": "ghost", "state": "parked", "detail": "d"}}):
            policy = answering(extra={"shutdown": [action]})
            self.fails(policy, steps, "handle", 'acted on a server the host never configured: "ghost"', at=2)

    def test_publications(self):
        steps = [configure("a"), connected("a", ["t", "u"]), ev("keepalive-ok", "a")]
        self.fails(self.publishing(("bad name", "t")), steps, "handle", 'published an unusable tool name "bad name"')
        self.fails(self.publishing(("x" * 65, "t")), steps, "handle",
                   'published an unusable tool name "%s"' % ("x" * 65))
        self.fails(self.publishing(("a\nb", "t")), steps, "handle", 'published an unusable tool name "a\\nb"')
        self.fails(self.publishing(("x", "t"), ("x", "u")), steps, "handle", "published x twice")
        # The original is looked up first (as Tether converts the answer before checking it).
        self.fails(self.publishing(("x", "")), steps, "handle", 'published x as "", which server "a" does not offer')
        ok = run_scenario(Scenario("t", "contract", "", steps), self.publishing(("x", "t"), ("y", "u")))
        self.assertIsNone(ok.failure)

    def test_empty_original_when_the_server_offers_one(self):
        steps = [configure("a"), connected("a", [""])]  # the fake publishes a__ for it
        self.fails(FakePolicy, steps, "handle", "published a__ without its original name", at=2)

    def test_admissions(self):
        steps = [configure("a"), {"do": "admit", "server": "a", "tool": "t", "name": None}]
        hold = lambda ms, msg="wait": {"tag": "hold", "val": {"wait-ms": ms, "message": msg}}  # noqa: E731
        self.fails(answering(admission=hold(60001)), steps, "admit", "held a call for 60001 ms (limit 60000)", at=2)
        self.assertIsNone(run_scenario(Scenario("t", "contract", "", steps), answering(admission=hold(60000))).failure)
        for bad in ({"tag": "reject", "val": ""}, {"tag": "reconnect", "val": " \t\n"}, hold(5, "\u3000")):
            self.fails(answering(admission=bad), steps, "admit", "a refusal without a message for the model")
        self.fails(answering(admission={"tag": "reject", "val": "é" * 2049}), steps, "admit",
                   "a refusal message of 4098 bytes (limit 4096)")
        self.assertIsNone(run_scenario(Scenario("t", "contract", "", steps),
                                       answering(admission={"tag": "reject", "val": "x" * 4096})).failure)

    def test_invalid_admissions_write_no_line(self):
        steps = [configure("a"), {"do": "admit", "server": "a", "tool": "t", "name": None}]
        outcome = self.fails(answering(admission={"tag": "reject", "val": ""}), steps, "admit",
                             "a refusal without a message for the model")
        self.assertEqual(len(outcome.transcript), 2)

    def test_take_over_must_not_replace_live_sessions(self):
        tools = {"server-info": "s", "tools": [], "proven": False}
        for live, action in ((("a", tools), "connect"), (("a", None, True), "disconnect")):
            step = {"do": "take-over", "handover": handover(live, "b")}
            self.fails(answering(over=[{"tag": action, "val": "a"}]), [step], "take-over",
                       'asked to connect or disconnect "a", whose session (or attempt) the host keeps', at=1)
        # Neither a session nor an attempt: the policy may connect it; an unknown server it may not.
        step = {"do": "take-over", "handover": handover("a")}
        self.assertIsNone(run_scenario(Scenario("t", "contract", "", [step]),
                                       answering(over=[{"tag": "connect", "val": "a"}])).failure)
        self.fails(answering(over=[{"tag": "connect", "val": "z"}]), [step], "take-over",
                   'acted on a server the host never configured: "z"')

    def test_removal_is_heard_after_the_answer(self):
        # The policy still acts on the server it forgets (withdraw, disconnect); then it is gone.
        steps = [configure("a"), connected("a", ["t"]), ev("server-removed", "a"),
                 expect({"withdraws": {"server": "a", "times": 1}})]
        self.assertIsNone(run_scenario(Scenario("t", "contract", "", steps), FakePolicy).failure)
        late = answering(extra={"shutdown": [{"tag": "withdraw-tools", "val": "a"}]})
        self.fails(late, steps + [ev("shutdown")], "handle", 'acted on a server the host never configured: "a"', at=4)

    def test_the_ledger_tracks_attempts(self):
        from tether_policy_host.scenarios import Ledger
        ledger = Ledger()
        ledger.note_event({"tag": "server-configured", "val": {"name": "a"}})
        self.assertFalse(ledger.is_live("a"))
        ledger.note_actions([{"tag": "connect", "val": "a"}])
        self.assertTrue(ledger.is_live("a"))
        ledger.note_event({"tag": "disconnected", "val": {"server": "a"}})  # not the attempt's outcome
        self.assertTrue(ledger.is_live("a"))
        ledger.note_event({"tag": "connect-failed", "val": {"server": "a"}})
        self.assertFalse(ledger.is_live("a"))
        ledger.note_event({"tag": "connected", "val": {"server": "a", "tools": []}})
        self.assertTrue(ledger.is_live("a"))
        ledger.note_actions([{"tag": "disconnect", "val": "a"}])
        self.assertFalse(ledger.is_live("a"))
        self.assertFalse(ledger.is_live("ghost"))


class SnapshotRestore(unittest.TestCase):
    def test_status_is_compared_server_by_server(self):
        class Shuffled(FakePolicy):
            restored = False

            def restore(self, snapshot):
                super().restore(snapshot)
                self.restored = True

            def status(self, now):
                out = super().status(now)
                return list(reversed(out)) if self.restored else out
        steps = [configure("a"), configure("b"), {"do": "snapshot-restore"}]
        self.assertIsNone(run_scenario(Scenario("t", "contract", "", steps), Shuffled).failure)
        bad = run_scenario(Scenario("t", "contract", "", steps), factory(bad_restore=True))
        self.assertIn('status changed across snapshot/restore: [{"server":"a"', bad.failure)


class Encoding(unittest.TestCase):
    def test_lone_surrogates_are_a_host_error_naming_the_path(self):
        from tether_policy_host import values as v
        with self.assertRaises(v.EncodingError) as caught:
            v.to_wasm(v.record([("server", v.STRING)]), {"server": "a\ud800"}, "event")
        self.assertIn("event.server: a string that cannot be encoded as UTF-8", str(caught.exception))
        with self.assertRaises(v.EncodingError):
            v.normalize(v.list_of(v.STRING), json.loads('["ok", "\\udfff"]'), "x")

    def test_in_a_scenario_it_is_a_malformed_scenario(self):
        from tether_policy_host import values as v

        class Typed(FakePolicy):
            def normalize(self, function, value):
                if function == "handle":
                    return [v.normalize(v.record([("now", v.U64), ("kind", v.record([
                        ("tag", v.STRING), ("val", v.STRING)]))]), value, "event")]
                return [value]
        with self.assertRaises(MalformedScenario) as caught:
            run_scenario(Scenario("s", "contract", "", [ev("server-removed", "\ud800")]), Typed)
        self.assertIn("event.kind.val: a string that cannot be encoded as UTF-8", str(caught.exception))


class Cli(unittest.TestCase):
    def test_malformed_scenarios_exit_2_without_a_traceback(self):
        import contextlib
        import io
        import tempfile
        from tether_policy_host.cli import main
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "index.json"), "w") as f:
                json.dump(["s"], f)
            with open(os.path.join(d, "s.json"), "w") as f:
                json.dump({"name": "s", "level": "contract", "summary": "", "steps": [{"do": "fly"}]}, f)
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                code = main(["missing.wasm", "--scenarios", d])
            self.assertEqual(code, 2)
            self.assertEqual(err.getvalue(), 'malformed scenario s: steps[0]: unknown step "fly"\n')


class Loading(unittest.TestCase):
    def test_index_order_and_bad_files(self):
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            for name in ("b", "a"):
                with open(os.path.join(d, name + ".json"), "w") as f:
                    json.dump({"name": name, "level": "invariant", "summary": "s", "steps": []}, f)
            with open(os.path.join(d, "index.json"), "w") as f:
                json.dump(["b", "a"], f)
            from tether_policy_host.scenarios import load_scenarios
            self.assertEqual([s.name for s in load_scenarios(d)], ["b", "a"])
            with open(os.path.join(d, "index.json"), "w") as f:
                json.dump({"not": "a list"}, f)
            with self.assertRaises(ValueError):
                load_scenarios(d)

    def test_names_and_malformed_files(self):
        import tempfile
        from tether_policy_host.scenarios import load_scenarios

        def write(d, name, data):
            with open(os.path.join(d, name), "w") as f:
                f.write(data if isinstance(data, str) else json.dumps(data))
        with tempfile.TemporaryDirectory() as d:
            for bad in (["../escape"], ["a/b"], [""], ["a.b"], ["a", "a"], [1]):
                write(d, "index.json", bad)
                with self.assertRaises(ValueError) as caught:
                    load_scenarios(d)
                self.assertNotIsInstance(caught.exception, MalformedScenario, bad)
            write(d, "index.json", ["s"])
            cases = [
                ("{", "malformed scenario s: not JSON"),
                ({"name": "s", "steps": {}}, "malformed scenario s: a scenario is an object with a steps array"),
                ({"name": "other", "steps": []}, 'malformed scenario s: its name is "other", index.json says "s"'),
                ({"name": "s", "level": 3, "steps": []}, "malformed scenario s: level must be"),
                ({"name": "s", "steps": [{"do": "jump"}]}, 'malformed scenario s: steps[0]: unknown step "jump"'),
                ({"name": "s", "steps": [{"do": "expect", "that": {"lists": {"a": 1}}, "else": "x"}]},
                 "malformed scenario s: steps[0].that.lists must be a server name"),
            ]
            for data, message in cases:
                write(d, "s.json", data)
                with self.assertRaises(MalformedScenario) as caught:
                    load_scenarios(d)
                self.assertTrue(str(caught.exception).startswith(message), str(caught.exception))


if __name__ == "__main__":
    unittest.main()


class LedgerRules(unittest.TestCase):
    def test_what_a_server_offers(self):
        from tether_policy_host.scenarios import Ledger
        ledger = Ledger()
        tools = [{"name": "t", "read-only": False, "revision": 1}]
        ledger.note_event({"tag": "connected", "val": {"server": "a", "server-info": "", "tools": tools}})
        self.assertFalse(ledger.offers("a", "t"))  # not configured: ignored
        ledger.note_event({"tag": "server-configured", "val": {"name": "a"}})
        ledger.note_event({"tag": "connected", "val": {"server": "a", "server-info": "", "tools": tools}})
        self.assertTrue(ledger.offers("a", "t"))
        ledger.note_event({"tag": "tools-changed", "val": {"server": "a", "tools": [dict(tools[0], name="u")]}})
        self.assertFalse(ledger.offers("a", "t"))
        self.assertTrue(ledger.offers("a", "u"))
        ledger.note_actions([{"tag": "connect", "val": "a"}])  # the host tears the session down
        self.assertFalse(ledger.offers("a", "u"))
        ledger.note_event({"tag": "tools-changed", "val": {"server": "a", "tools": tools}})
        self.assertFalse(ledger.offers("a", "t"))  # no session: no list to change
        ledger.note_handover({"servers": [{"config": {"name": "b"}, "session": {"tools": tools}},
                                          {"config": {"name": "c"}, "session": None}]})
        self.assertTrue(ledger.offers("b", "t"))
        self.assertFalse(ledger.offers("a", "u"))
        ledger.note_event({"tag": "server-removed", "val": "b"})
        self.assertFalse(ledger.offers("b", "t"))
