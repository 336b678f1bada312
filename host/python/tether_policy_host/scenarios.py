"""The interpreter of conformance scenarios (docs/CONFORMANCE.md): steps, predicates and the
transcript. It follows Tether's own interpreter (host/src/policy/conformance/interpreter.rs)
step for step, so that both write the same transcript and the same failure messages.

Pure Python: it drives any object with the instance methods of ``loader.py`` (``init``,
``handle``, ``admit``, ``status``, ``call("snapshot")``, ``restore``, ``take_over`` and
``normalize``), so the unit tests run it against a fake policy.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from .values import dumps

#: Host time at the start of every scenario.
START_NOW = 1000
#: The duration reported for every finished call.
DURATION_MS = 5
_USABLE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")

# How a list of steps ended.
RAN, STOP = "ran", "stop"


class ScenarioFailure(Exception):
    """The scenario failed; the message says why."""


@dataclass
class Scenario:
    name: str
    level: str
    summary: str
    steps: List[Dict[str, Any]]

    @classmethod
    def from_json(cls, data: Any, name: Optional[str] = None) -> "Scenario":
        if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
            raise ValueError("a scenario is an object with a steps array")
        return cls(
            name=str(data.get("name", name or "?")),
            level=str(data.get("level", "contract")),
            summary=str(data.get("summary", "")),
            steps=data["steps"],
        )


@dataclass
class Outcome:
    name: str
    level: str
    failure: Optional[str]
    transcript: List[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.failure is None


def load_scenarios(directory: str) -> List[Scenario]:
    """The scenarios of ``directory``, in the order of its ``index.json``."""
    with open(os.path.join(directory, "index.json"), encoding="utf-8") as f:
        names = json.load(f)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError("index.json must be a JSON array of scenario names")
    out = []
    for name in names:
        with open(os.path.join(directory, name + ".json"), encoding="utf-8") as f:
            out.append(Scenario.from_json(json.load(f), name))
    return out


# ---------------------------------------------------------------------------------------------
# Descriptions, for failure messages (as Tether's interpreter words them)


def describe_fault(fault: Any) -> str:
    if not isinstance(fault, dict):
        return dumps(fault)
    tag, val = fault.get("tag"), fault.get("val")
    if tag == "spawn-failed":
        return "could not start the server process: %s" % val
    if tag == "handshake-failed":
        return "MCP handshake failed: %s" % val
    if tag == "handshake-timed-out":
        return "MCP handshake timed out"
    if tag == "auth-required":
        return "the server requires authorization (HTTP %s)" % val
    if tag == "not-mcp-endpoint":
        return "not an MCP endpoint: %s" % val
    if tag == "process-exited":
        return "the server process was killed by a signal" if val is None else "the server process exited with code %s" % val
    if tag == "transport-closed":
        return "the connection closed: %s" % val
    if tag == "session-expired":
        return "the server no longer knows the session"
    if tag == "keepalive-failed":
        return "keepalive failed: %s" % val
    return dumps(fault)


def describe_event(kind: Any) -> str:
    if not isinstance(kind, dict):
        return "event %s" % dumps(kind)
    tag, val = kind.get("tag"), kind.get("val")
    v = val if isinstance(val, dict) else {}
    if tag == "server-configured":
        return "configure %s" % v.get("name")
    if tag == "server-removed":
        return "remove %s" % val
    if tag == "connected":
        return "%s connected" % v.get("server")
    if tag == "connect-failed":
        return "%s failed to connect (%s)" % (v.get("server"), describe_fault(v.get("fault")))
    if tag == "disconnected":
        return "%s disconnected (%s)" % (v.get("server"), describe_fault(v.get("fault")))
    if tag == "tools-changed":
        return "%s changed its tools" % v.get("server")
    if tag == "keepalive-ok":
        return "%s answered a keepalive" % val
    if tag == "keepalive-failed":
        return "%s keepalive failed" % v.get("server")
    if tag == "call-finished":
        return "call %s on %s finished: %s" % (v.get("call-id"), v.get("server"), dumps(v.get("outcome")))
    if tag == "timer":
        return "timer for %s" % v.get("server")
    if tag == "reconnect-requested":
        source = str(v.get("source", ""))
        return "reconnect %s requested by %s" % (v.get("server"), "".join(p.capitalize() for p in source.split("-")))
    if tag == "shutdown":
        return "shutdown"
    return "event %s" % dumps(kind)


def _rust_debug_str(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# What the host knows of its servers (Tether's ledger): a publication may only name tools of
# the server's latest tool list.


class Ledger:
    """Each configured server's live session and its latest tool list, from events, actions and
    handovers; ``offers(server, original)`` says whether a publication may name that tool."""

    def __init__(self) -> None:
        self.servers: Dict[str, Optional[List[str]]] = {}  # name -> tool names of its live session

    def copy(self) -> "Ledger":
        other = Ledger()
        other.servers = dict(self.servers)
        return other

    def offers(self, server: str, original: str) -> bool:
        tools = self.servers.get(server)
        return tools is not None and original in tools

    def note_event(self, kind: Dict[str, Any]) -> None:
        tag, val = kind.get("tag"), kind.get("val")
        if tag == "server-configured":
            self.servers.setdefault(val["name"], None)
        elif tag == "server-removed":
            self.servers.pop(val, None)
        elif tag == "connected":
            if val["server"] in self.servers:
                self.servers[val["server"]] = [t["name"] for t in val["tools"]]
        elif tag in ("connect-failed", "disconnected"):
            if val["server"] in self.servers:
                self.servers[val["server"]] = None
        elif tag == "tools-changed":
            if self.servers.get(val["server"]) is not None:
                self.servers[val["server"]] = [t["name"] for t in val["tools"]]

    def note_actions(self, actions: List[Any]) -> None:
        for action in actions:
            if action.get("tag") in ("connect", "disconnect") and action.get("val") in self.servers:
                self.servers[action["val"]] = None  # the host tears the session down

    def note_handover(self, handover: Dict[str, Any]) -> None:
        self.servers = {
            s["config"]["name"]: None if s["session"] is None else [t["name"] for t in s["session"]["tools"]]
            for s in handover["servers"]
        }

    def check(self, actions: List[Any], during: str, label: str) -> None:
        """Fails on a publication of a tool the server's latest list lacks (invalid output)."""
        for action in actions:
            if action.get("tag") != "publish-tools":
                continue
            server = action["val"]["server"]
            for tool in action["val"]["tools"]:
                if not self.offers(server, tool["original"]):
                    raise ScenarioFailure(
                        "policy %s failed during %s: returned invalid output: published %s as %s, "
                        "which server %s does not offer"
                        % (label, during, tool["advertised"][:80], _rust_debug_str(tool["original"][:80]),
                           _rust_debug_str(server))
                    )


# ---------------------------------------------------------------------------------------------
# The interpreter


Factory = Callable[[], Any]


class Run:
    """One scenario's run: the interpreter's state (docs/CONFORMANCE.md) and the transcript."""

    def __init__(self, factory: Factory, settings: str = "{}"):
        self.factory = factory
        self.settings = settings
        self.transcript: List[str] = []
        self.now = START_NOW
        self.wakes: Dict[str, Tuple[int, int]] = {}
        self.next_call_id = 1
        self.calls: Dict[str, int] = {}
        self.last_call: Optional[int] = None
        self.ledger = Ledger()
        self.actions: List[Any] = []
        self.admission: Any = None
        self.status: List[Any] = []
        # Calls into the policy so far, and the latest, for failure messages.
        self.step_no = 0
        self.last = "start"
        self.instance: Any = None

    # -- recording and calling ----------------------------------------------------------------

    def _record(self, line: Dict[str, Any]) -> None:
        self.transcript.append(dumps(line))

    def _label(self) -> str:
        return str(getattr(self.instance, "label", "the policy"))

    def _called(self, what: str) -> None:
        self.step_no += 1
        self.last = what

    @staticmethod
    def _policy(what: Callable[[], Any], prefix: str = "") -> Any:
        try:
            return what()
        except ScenarioFailure:
            raise
        except Exception as e:  # the loader's PolicyError, EncodingError, ...
            raise ScenarioFailure(prefix + str(e)) from None

    def _fresh(self) -> Any:
        instance = self._policy(self.factory)
        self._policy(lambda: instance.init(self.settings))
        return instance

    def _normalize(self, function: str, value: Any) -> Any:
        try:
            return self.instance.normalize(function, value)[0]
        except Exception as e:
            raise ScenarioFailure("the scenario's %s argument does not fit the contract: %s" % (function, e)) from None

    def _took(self, actions: List[Any]) -> None:
        self.ledger.note_actions(actions)
        for action in actions:
            if action.get("tag") == "wake-at":
                wake = action["val"]
                self.wakes[wake["server"]] = (wake["at"], wake["token"])
        self.actions = actions

    def _handle(self, kind: Any) -> None:
        self._called(describe_event(kind))
        event = self._normalize("handle", {"now": self.now, "kind": kind})
        self.ledger.note_event(event["kind"])
        actions = self._policy(lambda: self.instance.handle(event))
        self.ledger.check(actions, "handle", self._label())
        self._took(actions)
        self._record({"do": "handle", "event": event, "actions": actions})

    def _admit(self, server: Any, tool: Any) -> int:
        self._called("admit a call to %s/%s" % (server, tool))
        call_id = self.next_call_id
        request = self._normalize("admit", {"now": self.now, "call-id": call_id, "server": server, "tool": tool})
        self.next_call_id += 1
        self.last_call = call_id
        admission = self._policy(lambda: self.instance.admit(request))
        self._record({"do": "admit", "request": request, "admission": admission})
        self.admission = admission
        return call_id

    def _finish(self, server: Any, call_id: int, outcome: Any) -> None:
        self._handle({
            "tag": "call-finished",
            "val": {"server": server, "call-id": call_id, "outcome": outcome, "duration-ms": DURATION_MS},
        })

    # -- running ------------------------------------------------------------------------------

    def start(self) -> None:
        self.instance = self._fresh()
        self._record({"do": "init", "settings": self.settings})

    def run(self, steps: List[Any]) -> None:
        """Runs a scenario's steps; a failure says at which call into the policy it happened."""
        try:
            self.steps(steps)
        except ScenarioFailure as e:
            raise ScenarioFailure("at step %d (%s): %s" % (self.step_no, self.last, e)) from None

    def steps(self, steps: List[Any]) -> str:
        for step in steps:
            flow = self.step(step)
            if flow != RAN:
                return flow
        return RAN

    def step(self, step: Any) -> str:
        if not isinstance(step, dict) or not isinstance(step.get("do"), str):
            raise ScenarioFailure("not a step: %s" % dumps(step))
        do = step["do"]
        if do == "event":
            self._handle(_need(step, "kind"))
        elif do == "fire-timer":
            server = _need(step, "server")
            wake = self.wakes.pop(server, None)
            if wake is not None:
                at, token = wake
                self.now = max(self.now, at)
                self._handle({"tag": "timer", "val": {"server": server, "token": token}})
            elif not step.get("optional", False):
                raise ScenarioFailure("expected a timer armed for %s, none is" % server)
        elif do == "advance":
            ms = _need(step, "ms")
            if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
                raise ScenarioFailure("advance needs a non-negative integer ms")
            self.now += ms
        elif do == "admit":
            call_id = self._admit(_need(step, "server"), _need(step, "tool"))
            if step.get("name") is not None:
                self.calls[step["name"]] = call_id
        elif do == "finish":
            name = step.get("call")
            call_id = self.last_call if name is None else self.calls.get(name)
            if call_id is None:
                raise ScenarioFailure("no call %s was admitted" % (name or ""))
            self._finish(_need(step, "server"), call_id, _need(step, "outcome"))
        elif do == "call":
            server = _need(step, "server")
            call_id = self._admit(server, _need(step, "tool"))
            if isinstance(self.admission, dict) and self.admission.get("tag") in ("allow", "probe"):
                self._finish(server, call_id, _need(step, "outcome"))
        elif do == "status":
            self.status = self._policy(lambda: self.instance.status(self.now))
            self._record({"do": "status", "now": self.now, "status": self.status})
        elif do == "snapshot-restore":
            self._snapshot_restore()
        elif do == "take-over":
            self._take_over(_need(step, "handover"))
        elif do == "twice":
            return self._twice(_steps(step))
        elif do == "repeat":
            times = _need(step, "times")
            if isinstance(times, bool) or not isinstance(times, int) or times < 0:
                raise ScenarioFailure("repeat needs a non-negative integer times")
            steps = _steps(step)
            for _ in range(times):
                if self.steps(steps) == STOP:
                    return RAN
            if step.get("else") is not None:
                raise ScenarioFailure(str(step["else"]))
        elif do == "stop-if":
            if self.holds(_need(step, "that")):
                return STOP
        elif do == "expect":
            that = _need(step, "that")
            if not self.holds(that):
                raise ScenarioFailure("%s; %s" % (step.get("else"), self.context(that)))
        else:
            raise ScenarioFailure("unknown step %s" % dumps(do))
        return RAN

    def _snapshot_restore(self) -> None:
        self._called("snapshot and restore into a fresh instance")
        now = self.now
        before = self._policy(lambda: self.instance.status(now))
        snapshot = self._policy(lambda: self.instance.call("snapshot"))
        fresh = self._fresh()
        self._policy(lambda: fresh.restore(snapshot), "moving the state into a fresh instance failed: ")
        self.instance = fresh
        after = self._policy(lambda: self.instance.status(now))
        self._record({"do": "snapshot-restore"})
        if before != after:
            raise ScenarioFailure("status changed across snapshot/restore: %s -> %s" % (dumps(before), dumps(after)))

    def _take_over(self, handover: Any) -> None:
        previous = handover.get("previous", {}).get("name") if isinstance(handover, dict) else None
        self._called("take over from %s" % previous)
        handover = self._normalize("take-over", handover)
        self.instance = self._fresh()
        self._record({"do": "init", "settings": self.settings})
        self.ledger.note_handover(handover)
        actions = self._policy(lambda: self.instance.take_over(handover), "the handover was refused: ")
        self.ledger.check(actions, "take-over", self._label())
        self._took(actions)
        self._record({"do": "take-over", "handover": handover, "actions": actions})

    def _twice(self, steps: List[Any]) -> str:
        saved = (self.now, dict(self.wakes), self.next_call_id, dict(self.calls), self.last_call, self.ledger.copy())
        first_from = len(self.transcript)
        flow = self.steps(steps)
        first = self.transcript[first_from:]
        self.now, self.wakes, self.next_call_id, self.calls, self.last_call, self.ledger = saved
        self.instance = self._fresh()
        self._record({"do": "init", "settings": self.settings})
        second_from = len(self.transcript)
        self.steps(steps)
        second = self.transcript[second_from:]
        if first != second:
            at = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), min(len(first), len(second)))
            raise ScenarioFailure(
                "the same inputs gave other outputs in a fresh instance (call %d): %s vs %s"
                % (at + 1, first[at] if at < len(first) else "nothing", second[at] if at < len(second) else "nothing")
            )
        return flow

    # -- predicates ---------------------------------------------------------------------------

    def _count(self, tag: str, server: Any) -> int:
        return sum(1 for a in self.actions if a.get("tag") == tag and a.get("val") == server)

    def _publication(self, server: Any) -> Optional[List[Dict[str, Any]]]:
        for action in reversed(self.actions):
            if action.get("tag") == "publish-tools" and action["val"]["server"] == server:
                return action["val"]["tools"]
        return None

    def holds(self, pred: Any) -> bool:
        if not isinstance(pred, dict) or len(pred) != 1:
            raise ScenarioFailure("not a predicate: %s" % dumps(pred))
        (key, arg), = pred.items()
        if key == "connects":
            return self._count("connect", arg) > 0
        if key == "disconnects":
            return self._count("disconnect", arg) > 0
        if key == "withdraws":
            return self._count("withdraw-tools", _need(arg, "server")) == _need(arg, "times")
        if key == "publishes":
            return self._publication(arg) is not None
        if key == "publishes-originals":
            tools = self._publication(_need(arg, "server"))
            if tools is None:
                return False
            published = {t["original"] for t in tools}
            return len(published) == len(tools) and published == set(_need(arg, "originals"))
        if key == "publishes-usable-names":
            tools = self._publication(arg)
            if tools is None:
                return False
            names = [t["advertised"] for t in tools]
            return all(_USABLE_NAME.fullmatch(n) for n in names) and len(set(names)) == len(names)
        if key == "timer-armed":
            return arg in self.wakes
        if key == "timer-not-in-the-past":
            return arg in self.wakes and self.wakes[arg][0] >= self.now
        if key == "admission":
            return isinstance(self.admission, dict) and self.admission.get("tag") == arg
        if key == "refused-naming":
            a = self.admission
            if not isinstance(a, dict):
                return False
            if a.get("tag") in ("reject", "reconnect"):
                return arg in a["val"]
            if a.get("tag") == "hold":
                return arg in a["val"]["message"]
            return False
        if key == "lists":
            return any(entry.get("server") == arg for entry in self.status)
        if key == "state":
            server = _need(arg, "server")
            for entry in self.status:
                if entry.get("server") == server:
                    return entry["state"] in _need(arg, "in")
            raise ScenarioFailure("status() does not list %s" % server)
        if key == "not":
            return not self.holds(arg)
        raise ScenarioFailure("unknown predicate %s" % dumps(key))

    def context(self, pred: Dict[str, Any]) -> str:
        """What the predicate looked at, for a failure's message."""
        (key, arg), = pred.items()
        if key == "not":
            return self.context(arg)
        if key in ("admission", "refused-naming"):
            return "no call was admitted" if self.admission is None else "the admission was %s" % dumps(self.admission)
        if key in ("lists", "state"):
            return "the status was %s" % dumps(self.status)
        if key in ("timer-armed", "timer-not-in-the-past"):
            timers = ", ".join("%s: (%d, %d)" % (_rust_debug_str(s), at, token) for s, (at, token) in sorted(self.wakes.items()))
            return "at %d the timers were {%s}" % (self.now, timers)
        return "the actions were %s" % dumps(self.actions)


def _need(obj: Any, key: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise ScenarioFailure("the scenario lacks %s in %s" % (dumps(key), dumps(obj)))
    return obj[key]


def _steps(step: Dict[str, Any]) -> List[Any]:
    steps = _need(step, "steps")
    if not isinstance(steps, list):
        raise ScenarioFailure("%s needs a steps array" % step.get("do"))
    return steps


def run_scenario(scenario: Scenario, factory: Factory, settings: str = "{}") -> Outcome:
    """Runs one scenario in fresh instances from ``factory``; never raises for the policy's faults."""
    run = Run(factory, settings)
    try:
        run.start()
    except ScenarioFailure as e:
        return Outcome(scenario.name, scenario.level, str(e), [])
    failure = None
    try:
        run.run(scenario.steps)
    except ScenarioFailure as e:
        failure = str(e)
    return Outcome(scenario.name, scenario.level, failure, run.transcript)
