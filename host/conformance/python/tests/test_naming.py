"""Contract 0.2.1 in the interpreter: `since`, the steps `set-naming` and `name-prompts`, the
`namings` of `take-over`, the predicates `publishes-advertised` and `names-prompts`, the invalid
outputs of `name-prompts` and the transcript lines, against fake policies of 0.2.1 and 0.2.0.
Pure: no wasmtime. (`naming-scenarios/` holds a copy of Tether's 0.2.1 scenario and a scenario
of before, as an export of 0.2.1 writes them.)"""

import io
import json
import os
import sys
import tempfile
import types
import unittest
from contextlib import redirect_stderr, redirect_stdout
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from tether_policy_host.outputs import check_prompt_names  # noqa: E402
from tether_policy_host.scenarios import (  # noqa: E402
    MalformedScenario, Scenario, load_scenarios, run_scenario,
)
from test_scenarios import FakePolicy, configure, connected, ev, expect  # noqa: E402

SCENARIOS = os.path.join(HERE, "naming-scenarios")


class NamingPolicy(FakePolicy):
    """The fake policy of contract 0.2.1: an operator's prefix replaces `server__` in its
    publications and prompt names; the namings are in its snapshot."""

    naming = True
    answer = None  # a fixed answer of name-prompts, for the invalid outputs

    def __init__(self, **options):
        super().__init__(**options)
        self.namings = {}

    def init(self, settings):
        self.namings = {}
        return super().init(settings)

    def set_naming(self, naming):
        if naming["prefix"] is None:
            self.namings.pop(naming["server"], None)
        else:
            self.namings[naming["server"]] = naming["prefix"]

    def name(self, server, original):
        return self.namings.get(server, server + "__") + original.replace(" ", "_")

    def name_prompts(self, server, originals):
        if self.answer is not None:
            return self.answer
        return [{"advertised": self.name(server, o), "original": o} for o in dict.fromkeys(originals)]

    def _renamed(self, actions):
        for action in actions:
            if action["tag"] == "publish-tools":
                val = action["val"]
                for tool in val["tools"]:
                    tool["advertised"] = self.name(val["server"], tool["original"])
        return actions

    def handle(self, event):
        kind = event["kind"]
        if kind["tag"] == "tools-changed":
            tools = [{"advertised": "", "original": t["name"], "read-only": False} for t in kind["val"]["tools"]]
            return self._renamed([{"tag": "publish-tools", "val": {"server": kind["val"]["server"], "tools": tools}}])
        if kind["tag"] == "server-removed":
            self.namings.pop(kind["val"], None)
        return self._renamed(super().handle(event))

    def take_over(self, handover):
        return self._renamed(super().take_over(handover))

    def snapshot(self):
        return json.dumps({"servers": self.servers, "token": self.token, "namings": self.namings}).encode()

    def restore(self, snapshot):
        super().restore(snapshot)
        self.namings = json.loads(snapshot).get("namings", {})


class PreviousMinor(FakePolicy):
    """A fake policy of contract 0.2.0: no set-naming, no name-prompts."""

    naming = False


def run(steps, policy=NamingPolicy, since=None):
    return run_scenario(Scenario("t", "contract", "", steps, since=since), policy)


def naming(server, prefix):
    return {"do": "set-naming", "naming": {"server": server, "prefix": prefix}}


def prompts(server, *originals):
    return {"do": "name-prompts", "server": server, "originals": list(originals)}


def advertised(server, *pairs):
    return {"publishes-advertised": {"server": server, "names": [list(p) for p in pairs]}}


HANDOVER = {"now": 1000, "previous": {"name": "p", "version": "1"}, "servers": [
    {"config": {"name": "a", "transport": "stdio", "include": [], "exclude": [], "settings": ""},
     "session": {"server-info": "t", "tools": [{"name": "w", "read-only": False, "revision": 1}], "proven": True},
     "connecting": False, "state": "healthy", "breaker": "closed", "breaker-until": None, "failures": 0,
     "breaker-failures": 0, "tool-errors": 0, "last-fault": None, "since": 3, "next-attempt-at": None}]}


class Steps(unittest.TestCase):
    def assertPasses(self, steps, **options):
        outcome = run(steps, **options)
        self.assertIsNone(outcome.failure, "\n".join(outcome.transcript))
        return outcome

    def test_set_naming_and_its_line(self):
        outcome = self.assertPasses([
            naming("a", ""), configure("a"), connected("a", ["read file"]),
            expect(advertised("a", ("read file", "read_file"))),
            naming("b", None), configure("b"), connected("b", ["w"]), expect(advertised("b", ("w", "b__w"))),
        ])
        self.assertEqual(outcome.transcript[1], '{"do":"set-naming","naming":{"server":"a","prefix":""}}')
        self.assertEqual(outcome.transcript[4], '{"do":"set-naming","naming":{"server":"b","prefix":null}}')

    def test_name_prompts_and_its_line(self):
        outcome = self.assertPasses([
            naming("a", "x-"), prompts("a", "ask", "tell"),
            expect({"names-prompts": [["tell", "x-tell"], ["ask", "x-ask"]]}),
            expect({"not": {"names-prompts": [["ask", "x-ask"]]}}, "exactly these"),
            prompts("b"), expect({"names-prompts": []}),
        ])
        self.assertEqual(outcome.transcript[2], '{"do":"name-prompts","server":"a","originals":["ask","tell"],'
                                                '"named":[{"advertised":"x-ask","original":"ask"},'
                                                '{"advertised":"x-tell","original":"tell"}]}')
        failed = run([naming("a", "x-"), prompts("a", "ask"), expect({"names-prompts": [["ask", "ask"]]}, "own names")])
        self.assertEqual(failed.failure, 'at step 2 (name the prompts of a): own names; '
                                         'the prompt names were [{"advertised":"x-ask","original":"ask"}]')
        # As in Tether's interpreter, nothing named yet is the empty list.
        self.assertIsNone(run([expect({"names-prompts": []})]).failure)

    def test_publishes_advertised(self):
        self.assertPasses([
            naming("a", "x-"), configure("a"), connected("a", ["r", "w"]),
            expect(advertised("a", ("w", "x-w"), ("r", "x-r"))),
            expect({"not": advertised("a", ("r", "x-r"))}, "all pairs"),
            expect({"not": advertised("a", ("r", "a__r"), ("w", "a__w"))}, "these names"),
            expect({"not": advertised("b", ("r", "x-r"))}, "no publication: does not hold"),
        ])
        failed = run([configure("a"), connected("a", ["r"]), expect(advertised("a", ("r", "r")), "own")])
        self.assertTrue(failed.failure.startswith("at step 2 (a connected): own; the actions were [{"), failed.failure)

    def test_take_over_gives_its_namings_first(self):
        steps = [{"do": "take-over", "handover": HANDOVER, "namings": [{"server": "a", "prefix": ""}]},
                 expect(advertised("a", ("w", "w")))]
        outcome = self.assertPasses(steps)
        self.assertEqual([json.loads(l)["do"] for l in outcome.transcript], ["init", "init", "set-naming", "take-over"])
        # A 0.2.0 policy is given none, and names as it always did.
        steps[1] = expect(advertised("a", ("w", "a__w")))
        outcome = self.assertPasses(steps, policy=PreviousMinor)
        self.assertEqual([json.loads(l)["do"] for l in outcome.transcript], ["init", "init", "take-over"])
        # Exports before 0.2.1 have no `namings`; null is none.
        for step in ({"do": "take-over", "handover": HANDOVER}, {"do": "take-over", "handover": HANDOVER, "namings": None}):
            self.assertPasses([step, expect(advertised("a", ("w", "a__w")))])

    def test_the_step_counts_and_names_the_calls(self):
        outcome = run([naming("a", ""), prompts("a", "p"), expect({"connects": "a"}, "none")])
        self.assertTrue(outcome.failure.startswith("at step 2 (name the prompts of a): none;"), outcome.failure)
        outcome = run([naming("a", ""), expect({"connects": "a"}, "none")])
        self.assertTrue(outcome.failure.startswith("at step 1 (set the naming of a): none;"), outcome.failure)
        # The namings of a take-over are part of that one step.
        outcome = run([{"do": "take-over", "handover": HANDOVER, "namings": [{"server": "a", "prefix": ""}]},
                       expect({"connects": "a"}, "none")])
        self.assertTrue(outcome.failure.startswith("at step 1 (take over from p): none;"), outcome.failure)

    def test_a_previous_minor_has_neither(self):
        outcome = run([naming("a", "")], policy=PreviousMinor)
        self.assertEqual(outcome.failure, "at step 1 (set the naming of a): the policy has no set-naming (contract 0.2.0)")
        outcome = run([prompts("a", "p")], policy=PreviousMinor)
        self.assertEqual(outcome.failure, "at step 1 (name the prompts of a): the policy has no name-prompts (contract 0.2.0)")

    def test_malformed(self):
        def malformed(steps):
            with self.assertRaises(MalformedScenario) as caught:
                run(steps)
            return str(caught.exception)
        self.assertIn("steps[0].naming is not a naming", malformed([{"do": "set-naming", "naming": {"server": "a"}}]))
        self.assertIn("missing field", malformed([{"do": "set-naming", "naming": {"server": "a"}}]))
        self.assertIn("unknown field", malformed([{"do": "set-naming", "naming": {"server": "a", "prefix": "", "x": 1}}]))
        self.assertIn("expected a string", malformed([naming("a", 5)]))
        self.assertIn("steps[0].naming is not a naming", malformed([{"do": "set-naming"}]))
        self.assertIn("steps[0].originals must be an array of strings", malformed([{"do": "name-prompts", "server": "a", "originals": [1]}]))
        self.assertIn("steps[0].namings[0] is not a naming",
                      malformed([{"do": "take-over", "handover": HANDOVER, "namings": [{"server": 1, "prefix": None}]}]))
        self.assertIn("steps[0].namings must be an array",
                      malformed([{"do": "take-over", "handover": HANDOVER, "namings": {"server": "a", "prefix": None}}]))
        self.assertIn("names must be an array of [original, advertised] pairs",
                      malformed([expect({"publishes-advertised": {"server": "a", "names": [["a"]]}})]))
        self.assertIn("names-prompts must be an array of [original, advertised] pairs",
                      malformed([expect({"names-prompts": [["a", 1]]})]))
        self.assertIn("a string that cannot be encoded as UTF-8", malformed([prompts("a", "\ud800")]))
        with self.assertRaises(MalformedScenario):
            Scenario.from_json({"name": "t", "since": 21, "steps": []}, "t")


class Since(unittest.TestCase):
    def test_what_a_component_predates_passes_without_running(self):
        steps = [naming("a", ""), prompts("a", "p")]
        outcome = run(steps, policy=PreviousMinor, since="0.2.1")
        self.assertEqual((outcome.failure, outcome.applicable, outcome.transcript), (None, False, []))
        outcome = run(steps, since="0.2.1")
        self.assertEqual((outcome.failure, outcome.applicable), (None, True))
        self.assertEqual(len(outcome.transcript), 3)
        # A version this host does not know is not implemented (as Tether's host decides).
        outcome = run(steps, since="0.2.7")
        self.assertEqual((outcome.failure, outcome.applicable, outcome.transcript), (None, False, []))
        # No `since`: every component runs it, and a 0.2.0 one fails where it lacks a function.
        self.assertIsNotNone(run(steps, policy=PreviousMinor).failure)

    def test_the_exported_scenarios_of_0_2_1(self):
        scenarios = load_scenarios(SCENARIOS)
        self.assertEqual([(s.name, s.since) for s in scenarios], [
            ("takes-over-another-policy-keeping-sessions", None),
            ("names-follow-the-operators-naming", "0.2.1"),
        ])
        for policy, applicable in ((NamingPolicy, [True, True]), (PreviousMinor, [True, False])):
            outcomes = [run_scenario(s, policy) for s in scenarios]
            self.assertEqual([(o.failure, o.applicable) for o in outcomes], [(None, a) for a in applicable],
                             [o.transcript for o in outcomes])
        transcript = run_scenario(scenarios[1], NamingPolicy).transcript
        self.assertEqual([json.loads(l)["do"] for l in transcript][-3:], ["init", "set-naming", "take-over"])

    def test_the_command_prints_it_and_writes_no_transcript(self):
        from tether_policy_host import cli

        class Component:
            """Stands in for the loader's: a 0.2.0 component of fake instances."""

            interface = "tether:policy/policy@0.2.0"
            contract = "0.2.0"

            def __init__(self, *args, **kwargs):
                pass

            def instantiate(self):
                instance = PreviousMinor()
                instance.info = lambda: {"name": "fake", "version": "1"}
                return instance

        loader = types.ModuleType("tether_policy_host.loader")
        loader.PolicyComponent = Component
        loader.LoadError = loader.PolicyError = loader.PolicyRefused = type("Never", (Exception,), {})
        loader.default_cache_dir = lambda: None
        out, err = io.StringIO(), io.StringIO()
        with mock.patch.dict(sys.modules, {"tether_policy_host.loader": loader}):
            with tempfile.TemporaryDirectory() as tmp, redirect_stdout(out), redirect_stderr(err):
                code = cli.main(["fake.wasm", "--scenarios", SCENARIOS, "--transcripts", tmp, "--no-cache"])
                written = sorted(os.listdir(tmp))
        self.assertEqual(code, 0, err.getvalue())
        self.assertIn("n/a  names-follow-the-operators-naming (needs contract 0.2.1", out.getvalue())
        self.assertIn("2 passed, 0 failed", out.getvalue())
        self.assertEqual(written, ["takes-over-another-policy-keeping-sessions.jsonl"])


class InvalidPromptNames(unittest.TestCase):
    """outputs.rs `check_prompt_names`: worded as Tether words it; the call writes no line."""

    def fails(self, answer, why):
        policy = type("Answering", (NamingPolicy,), {"answer": answer})
        outcome = run([prompts("s", "a", "b")], policy=policy)
        self.assertEqual(outcome.failure, "at step 1 (name the prompts of s): policy fake.wasm failed during "
                                          "name-prompts: returned invalid output: " + why)
        self.assertEqual(outcome.transcript, ['{"do":"init","settings":"{}"}'])

    def test_each_refusal(self):
        named = lambda adv, orig: {"advertised": adv, "original": orig}  # noqa: E731
        self.fails([named("a b", "a")], 'named a prompt with an unusable name "a b"')
        self.fails([named("", "a")], 'named a prompt with an unusable name ""')
        self.fails([named("x" * 65, "a")], 'named a prompt with an unusable name "%s"' % ("x" * 65)[:80])
        self.fails([named("c", "c")], 'named a prompt it was not asked about: "c"')
        self.fails([named("a", "a"), named("a2", "a")], 'named prompt "a" twice')
        self.fails([named("p", "a"), named("p", "b")], "gave two prompts the name p")

    def test_what_may_be_answered(self):
        self.assertIsNone(check_prompt_names(["a", "b"], []))  # a prompt left out is not shown
        self.assertIsNone(check_prompt_names(["a", "a"], [{"advertised": "x", "original": "a"}]))


if __name__ == "__main__":
    unittest.main()
