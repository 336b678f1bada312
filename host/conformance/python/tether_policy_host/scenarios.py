"""The interpreter of conformance scenarios (docs/CONFORMANCE.md): steps, predicates and the
transcript. It follows Tether's own interpreter (host/src/policy/conformance/interpreter.rs)
step for step, so that both write the same transcript and the same failure messages.

Pure Python: it drives any object with the instance methods of ``loader.py`` (``init``,
``handle``, ``admit``, ``status``, ``snapshot``, ``restore`` (bytes), ``take_over``,
``normalize``, and for contract 0.2.1 ``set_naming`` and ``name_prompts``), so the unit tests
run it against a fake policy.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, List, NamedTuple, Optional, Tuple

from . import values
from .outputs import (
    check_actions, check_admission, check_prompt_names, check_take_over, rust_debug, valid_tool_name,
)
from .values import EncodingError, dumps

#: Host time at the start of every scenario.
START_NOW = 1000
#: The duration reported for every finished call.
DURATION_MS = 5
#: What names a scenario (and its transcript file) in index.json.
_SCENARIO_NAME = re.compile(r"[A-Za-z0-9_-]+")

# How a list of steps ended.
RAN, STOP = "ran", "stop"


class ScenarioFailure(Exception):
    """The scenario failed; the message says why."""


class MalformedScenario(ValueError):
    """The scenario itself is wrong (not the policy): ``malformed scenario NAME: why``."""

    def __init__(self, name: str, reason: str):
        super().__init__("malformed scenario %s: %s" % (name, reason))
        self.name = name
        self.reason = reason


class _Malformed(Exception):
    """Raised inside the interpreter; ``run_scenario`` names the scenario."""


@dataclass
class Scenario:
    name: str
    level: str
    summary: str
    steps: List[Dict[str, Any]]
    #: The contract version that added what it checks ("0.2.1"), or None.
    since: Optional[str] = None

    @classmethod
    def from_json(cls, data: Any, name: Optional[str] = None) -> "Scenario":
        """A scenario file's contents, checked (``MalformedScenario`` when it is not one)."""
        label = name if name is not None else "?"
        if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
            raise MalformedScenario(label, "a scenario is an object with a steps array")
        given = data.get("name", name)
        if not isinstance(given, str) or (name is not None and given != name):
            raise MalformedScenario(label, "its name is %s, index.json says %s" % (dumps(given), dumps(name)))
        level, summary = data.get("level", "contract"), data.get("summary", "")
        if level not in ("contract", "invariant"):
            raise MalformedScenario(given, "level must be \"contract\" or \"invariant\", not %s" % _show(level))
        if not isinstance(summary, str):
            raise MalformedScenario(given, "summary must be a string, not %s" % _show(summary))
        since = data.get("since")  # (absent in exports before contract 0.2.1)
        if since is not None and not isinstance(since, str):
            raise MalformedScenario(given, "since must be a contract version or null, not %s" % _show(since))
        try:
            check_steps(data["steps"], "steps")
        except _Malformed as e:
            raise MalformedScenario(given, str(e)) from None
        return cls(name=given, level=level, summary=summary, steps=data["steps"], since=since)


@dataclass
class Outcome:
    name: str
    level: str
    failure: Optional[str]
    transcript: List[str] = field(default_factory=list)
    #: False when the scenario checks what the component's contract version lacks (its
    #: ``since``): it passes without running, and has no transcript to write.
    applicable: bool = True

    @property
    def passed(self) -> bool:
        return self.failure is None


def load_scenarios(directory: str) -> List[Scenario]:
    """The scenarios of ``directory``, in the order of its ``index.json``. Raises ``OSError``
    (a file cannot be read), ``ValueError`` (index.json is not a list of names) or
    ``MalformedScenario``. The names, which also name the transcript files, are
    ``[A-Za-z0-9_-]+``: no path leaves the directory."""
    with open(os.path.join(directory, "index.json"), encoding="utf-8") as f:
        names = json.load(f)
    if not isinstance(names, list) or not all(isinstance(n, str) and _SCENARIO_NAME.fullmatch(n) for n in names):
        raise ValueError("index.json must be a JSON array of scenario names ([A-Za-z0-9_-]+)")
    if len(set(names)) != len(names):
        raise ValueError("index.json names a scenario twice")
    out = []
    for name in names:
        with open(os.path.join(directory, name + ".json"), encoding="utf-8") as f:
            try:
                data = json.load(f)
            except ValueError as e:  # not JSON, or not UTF-8
                raise MalformedScenario(name, "not JSON: %s" % e) from None
        out.append(Scenario.from_json(data, name))
    return out


# ---------------------------------------------------------------------------------------------
# The shape of steps and predicates (script.rs): checked before a scenario runs, so that a
# malformed one is reported as such, not as a failure of the policy (or a Python traceback).

_STATES = ("connecting", "connected", "healthy", "backing-off", "parked", "stopped")
_ADMISSIONS = ("allow", "probe", "reject", "reconnect", "hold")
_U64 = 2 ** 64 - 1


def _show(value: Any) -> str:
    try:
        text = dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _field(obj: Dict[str, Any], key: str, where: str, kind: str, nullable: bool = False,
           default: Any = None, required: bool = True) -> Any:
    if key not in obj:
        if required and not nullable:
            raise _Malformed("%s lacks %s" % (where, dumps(key)))
        return default
    value = obj[key]
    if value is None and nullable:
        return None
    ok = {
        "string": lambda x: isinstance(x, str),
        "bool": lambda x: isinstance(x, bool),
        "count": lambda x: isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= _U64,
        "object": lambda x: isinstance(x, dict),
        "array": lambda x: isinstance(x, list),
        "strings": lambda x: isinstance(x, list) and all(isinstance(i, str) for i in x),
    }[kind](value)
    if not ok:
        want = {"string": "a string", "bool": "true or false", "count": "a non-negative integer",
                "object": "an object", "array": "an array", "strings": "an array of strings"}[kind]
        raise _Malformed("%s.%s must be %s%s, not %s" % (where, key, want, " or null" if nullable else "", _show(value)))
    return value


_STEP_FIELDS = {
    "event": {"kind": "object"},
    "fire-timer": {"server": "string", "optional": "bool?"},
    "advance": {"ms": "count"},
    "admit": {"server": "string", "tool": "string", "name": "string|null"},
    "finish": {"server": "string", "call": "string|null", "outcome": "object"},
    "call": {"server": "string", "tool": "string", "outcome": "object"},
    "status": {},
    "snapshot-restore": {"steps": "steps?"},
    "take-over": {"handover": "object", "namings": "namings|null"},
    "set-naming": {"naming": "naming"},
    "name-prompts": {"server": "string", "originals": "strings"},
    "twice": {"steps": "steps"},
    "repeat": {"times": "count", "steps": "steps", "else": "string|null"},
    "stop-if": {"that": "predicate"},
    "expect": {"that": "predicate", "else": "string"},
}


def check_steps(steps: Any, where: str) -> None:
    """Raises ``_Malformed`` unless ``steps`` is a list of well-formed steps."""
    if not isinstance(steps, list):
        raise _Malformed("%s must be an array of steps, not %s" % (where, _show(steps)))
    for i, step in enumerate(steps):
        here = "%s[%d]" % (where, i)
        if not isinstance(step, dict) or not isinstance(step.get("do"), str):
            raise _Malformed("%s is not a step: %s" % (here, _show(step)))
        fields = _STEP_FIELDS.get(step["do"])
        if fields is None:
            raise _Malformed("%s: unknown step %s" % (here, dumps(step["do"])))
        extra = [k for k in step if k != "do" and k not in fields]
        if extra:
            raise _Malformed("%s: unknown field %s of a %s step" % (here, dumps(extra[0]), step["do"]))
        for key, kind in fields.items():
            if kind == "steps":
                check_steps(_field(step, key, here, "array"), "%s.%s" % (here, key))
            elif kind == "steps?":  # absent in exports of before it was there: no steps
                check_steps(_field(step, key, here, "array", required=False) or [], "%s.%s" % (here, key))
            elif kind == "predicate":
                check_predicate(_field(step, key, here, "object"), "%s.%s" % (here, key))
            elif kind == "bool?":
                _field(step, key, here, "bool", required=False)
            elif kind == "string|null":
                _field(step, key, here, "string", nullable=True)
            elif kind == "naming":
                naming_value(step.get(key), "%s.%s" % (here, key))
            elif kind == "namings|null":
                for i, naming in enumerate(_field(step, key, here, "array", nullable=True) or []):
                    naming_value(naming, "%s.%s[%d]" % (here, key, i))
            else:
                _field(step, key, here, kind)
        if step["do"] == "repeat" and step["times"] > 2 ** 32 - 1:
            raise _Malformed("%s.times must fit a u32, not %s" % (here, step["times"]))


_STRING_PREDICATES = ("connects", "disconnects", "publishes", "publishes-usable-names", "timer-armed",
                      "timer-not-in-the-past", "refused-naming", "lists", "published", "redundant",
                      "attempting")


def check_predicate(pred: Any, where: str) -> None:
    """Raises ``_Malformed`` unless ``pred`` is a well-formed predicate."""
    if not isinstance(pred, dict) or len(pred) != 1:
        raise _Malformed("%s is not a predicate (an object with one key): %s" % (where, _show(pred)))
    (key, arg), = pred.items()
    here = "%s.%s" % (where, key)
    if key in _STRING_PREDICATES:
        if not isinstance(arg, str):
            raise _Malformed("%s must be a server name (a string), not %s" % (here, _show(arg)))
    elif key == "admission":
        if arg not in _ADMISSIONS:
            raise _Malformed("%s must be one of %s, not %s" % (here, ", ".join(_ADMISSIONS), _show(arg)))
    elif key == "withdraws":
        _field(_object(arg, here), "server", here, "string")
        _field(arg, "times", here, "count")
    elif key == "publishes-originals":
        _field(_object(arg, here), "server", here, "string")
        _field(arg, "originals", here, "strings")
    elif key == "publishes-advertised":
        _field(_object(arg, here), "server", here, "string")
        _pairs(_field(arg, "names", here, "array"), here + ".names")
    elif key == "names-prompts":
        _pairs(arg, here)
    elif key == "state":
        _field(_object(arg, here), "server", here, "string")
        states = _field(arg, "in", here, "strings")
        unknown = [s for s in states if s not in _STATES]
        if unknown:
            raise _Malformed("%s.in: unknown state %s" % (here, dumps(unknown[0])))
    elif key == "not":
        check_predicate(arg, here)
    else:
        raise _Malformed("%s: unknown predicate %s" % (where, dumps(key)))


def _object(arg: Any, where: str) -> Dict[str, Any]:
    if not isinstance(arg, dict):
        raise _Malformed("%s must be an object, not %s" % (where, _show(arg)))
    return arg


def _pairs(arg: Any, where: str) -> None:
    """``[[ORIGINAL, ADVERTISED]...]``."""
    if not isinstance(arg, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in arg
    ):
        raise _Malformed("%s must be an array of [original, advertised] pairs, not %s" % (where, _show(arg)))


#: Contract 0.2.1's ``naming`` record. Checked here rather than by the component's own types:
#: a 0.2.0 component has none, and is handed the namings of a take-over as nothing.
NAMING = values.record([("server", values.STRING), ("prefix", values.option(values.STRING))])


def naming_value(value: Any, where: str) -> Dict[str, Any]:
    """A scenario's ``naming``, checked and in WIT field order (``_Malformed`` if it is not one)."""
    try:
        return values.normalize(NAMING, value, where)
    except EncodingError as e:
        raise _Malformed("%s is not a naming: %s" % (where, e)) from None


def speaks_naming(instance: Any) -> bool:
    """Whether an instance has contract 0.2.1's ``set-naming`` and ``name-prompts`` (a
    ``PolicyInstance`` says so; a stand-in by having both methods)."""
    said = getattr(instance, "naming", None)
    if isinstance(said, bool):
        return said
    return callable(getattr(instance, "set_naming", None)) and callable(getattr(instance, "name_prompts", None))


def implements(instance: Any, since: Optional[str]) -> bool:
    """Whether a scenario of this ``since`` applies to the instance's component: what 0.2.1 added
    needs its functions; a version this host does not know is not implemented (as Tether's
    host decides it)."""
    if since is None:
        return True
    return since == "0.2.1" and speaks_naming(instance)


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


# ---------------------------------------------------------------------------------------------
# What the host knows of its servers (Tether's ledger): a publication may only name tools of
# the server's latest tool list.


class _Server(NamedTuple):
    """What the host knows of one configured server."""

    # Its live session's tools: each name's revision, the first tool of a name counting (None:
    # no session). Never changed once made: entries are replaced.
    tools: Optional[Dict[str, int]]
    connecting: bool  # a connect went out, its outcome has not come back


_IDLE = _Server(None, False)


def _names(tools: List[Dict[str, Any]]) -> Dict[str, int]:
    revisions: Dict[str, int] = {}
    for t in tools:
        revisions.setdefault(t["name"], t["revision"])
    return revisions


class Ledger:
    """What the host knows of each configured server, as Tether's runtime keeps it: its live
    session's latest tool list (None: no session) and whether an attempt is in flight."""

    def __init__(self) -> None:
        self.servers: Dict[str, _Server] = {}

    def copy(self) -> "Ledger":
        other = Ledger()
        other.servers = dict(self.servers)  # the entries are immutable
        return other

    def is_configured(self, server: str) -> bool:
        return server in self.servers

    def is_live(self, server: str) -> bool:
        """A session or an attempt in flight, which a policy taking over must not replace."""
        entry = self.servers.get(server)
        return entry is not None and (entry.tools is not None or entry.connecting)

    def offers(self, server: str, original: str) -> bool:
        entry = self.servers.get(server)
        return entry is not None and entry.tools is not None and original in entry.tools

    def revision(self, server: str, original: str) -> Optional[int]:
        """The revision of ``original`` in the server's latest tool list."""
        entry = self.servers.get(server)
        return None if entry is None or entry.tools is None else entry.tools.get(original)

    def is_connecting(self, server: str) -> bool:
        """Whether a ``connect`` went out and its outcome has not come back."""
        entry = self.servers.get(server)
        return entry is not None and entry.connecting

    def note_event(self, kind: Dict[str, Any]) -> None:
        tag, val = kind.get("tag"), kind.get("val")
        if tag == "server-configured":
            self.servers.setdefault(val["name"], _IDLE)
        elif tag == "server-removed":
            self.servers.pop(val, None)
        elif tag in ("connected", "connect-failed", "disconnected", "tools-changed"):
            server = val["server"]
            entry = self.servers.get(server)
            if entry is None:
                return
            if tag == "connected":
                self.servers[server] = _Server(_names(val["tools"]), False)
            elif tag == "connect-failed":
                self.servers[server] = _IDLE
            elif tag == "disconnected":  # says nothing of an attempt already asked for
                self.servers[server] = entry._replace(tools=None)
            elif entry.tools is not None:  # tools-changed
                self.servers[server] = entry._replace(tools=_names(val["tools"]))

    def note_actions(self, actions: List[Any]) -> None:
        for action in actions:
            tag, server = action.get("tag"), action.get("val")
            if tag in ("connect", "disconnect") and server in self.servers:
                # the host tears the session down
                self.servers[server] = _Server(None, tag == "connect")

    def note_handover(self, handover: Dict[str, Any]) -> None:
        self.servers = {
            s["config"]["name"]: _Server(
                None if s["session"] is None else _names(s["session"]["tools"]), bool(s.get("connecting")))
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
                    raise ScenarioFailure(invalid(
                        label, during,
                        "published %s as %s, which server %s does not offer"
                        % (tool["advertised"][:80], rust_debug(tool["original"][:80]), rust_debug(server)),
                    ))


def invalid(label: str, during: str, why: str) -> str:
    """An answer no correct policy gives, worded as Tether's runtime words it."""
    return "policy %s failed during %s: returned invalid output: %s" % (label, during, why)


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
        # What the host shows of each server: its publication in force, as a set of (advertised,
        # original, read-only, revision); and the servers the latest actions changed nothing of.
        self.published: Dict[str, FrozenSet[Tuple[str, str, bool, Optional[int]]]] = {}
        self.redundant: set = set()
        self.actions: List[Any] = []
        self.admission: Any = None
        self.status: List[Any] = []
        self.prompt_names: List[Any] = []
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
        except (ScenarioFailure, _Malformed):
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
            raise _Malformed("the %s argument does not fit the contract: %s" % (function, e)) from None

    def _took(self, actions: List[Any]) -> None:
        """Does what the policy asked: arms its timers, and shows or hides tools as Tether's
        host does, absorbing what changes nothing (host/src/registry.rs)."""
        self.redundant = set()
        for action in actions:
            tag, val = action.get("tag"), action.get("val")
            if tag == "wake-at":
                self.wakes[val["server"]] = (val["at"], val["token"])
            elif tag == "publish-tools":
                server = val["server"]
                shown = frozenset(
                    (t["advertised"], t["original"], t["read-only"], self.ledger.revision(server, t["original"]))
                    for t in val["tools"]
                )
                if self.published.get(server) == shown:
                    self.redundant.add(server)
                else:
                    self.published[server] = shown
            elif tag == "withdraw-tools":
                if self.published.pop(val, None) is None:
                    self.redundant.add(val)
        self.ledger.note_actions(actions)
        self.actions = actions

    def _handle(self, kind: Any) -> None:
        self._called(describe_event(kind))
        event = self._normalize("handle", {"now": self.now, "kind": kind})
        # As Tether's runtime does: the ledger hears the event first (a publication needs the
        # tools it brings), except a removal (the policy still acts on the server it forgets).
        removal = event["kind"].get("tag") == "server-removed"
        if not removal:
            self.ledger.note_event(event["kind"])
        actions = self._policy(lambda: self.instance.handle(event))
        self.ledger.check(actions, "handle", self._label())
        why = check_actions(actions, self.ledger.is_configured)
        if why is not None:
            raise ScenarioFailure(invalid(self._label(), "handle", why))
        if removal:
            self.ledger.note_event(event["kind"])
        self._took(actions)
        self._record({"do": "handle", "event": event, "actions": actions})

    def _admit(self, server: Any, tool: Any) -> int:
        self._called("admit a call to %s/%s" % (server, tool))
        call_id = self.next_call_id
        request = self._normalize("admit", {"now": self.now, "call-id": call_id, "server": server, "tool": tool})
        self.next_call_id += 1
        self.last_call = call_id
        admission = self._policy(lambda: self.instance.admit(request))
        why = check_admission(admission)
        if why is not None:
            raise ScenarioFailure(invalid(self._label(), "admit", why))
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

    def step(self, step: Dict[str, Any]) -> str:
        """One step; ``run_scenario`` has checked its shape (``check_steps``)."""
        do = step["do"]
        if do == "event":
            self._handle(step["kind"])
        elif do == "fire-timer":
            server = step["server"]
            wake = self.wakes.pop(server, None)
            if wake is not None:
                at, token = wake
                self.now = max(self.now, at)
                self._handle({"tag": "timer", "val": {"server": server, "token": token}})
            elif not step.get("optional", False):
                raise ScenarioFailure("expected a timer armed for %s, none is" % server)
        elif do == "advance":
            self.now = min(self.now + step["ms"], _U64)  # as Tether: saturating
        elif do == "admit":
            call_id = self._admit(step["server"], step["tool"])
            if step.get("name") is not None:
                self.calls[step["name"]] = call_id
        elif do == "finish":
            name = step.get("call")
            call_id = self.last_call if name is None else self.calls.get(name)
            if call_id is None:
                raise ScenarioFailure("no call was admitted" if name is None else "no call named %s was admitted" % name)
            self._finish(step["server"], call_id, step["outcome"])
        elif do == "call":
            server = step["server"]
            call_id = self._admit(server, step["tool"])
            if isinstance(self.admission, dict) and self.admission.get("tag") in ("allow", "probe"):
                self._finish(server, call_id, step["outcome"])
        elif do == "status":
            self.status = self._policy(lambda: self.instance.status(self.now))
            self._record({"do": "status", "now": self.now, "status": self.status})
        elif do == "snapshot-restore":
            return self._snapshot_restore(step.get("steps") or [])
        elif do == "take-over":
            self._take_over(step["handover"], step.get("namings") or [])
        elif do == "set-naming":
            naming = naming_value(step["naming"], "naming")
            self._called("set the naming of %s" % naming["server"])
            self._set_naming(naming)
        elif do == "name-prompts":
            self._name_prompts(step["server"], step["originals"])
        elif do == "twice":
            return self._twice(step["steps"])
        elif do == "repeat":
            for _ in range(step["times"]):
                if self.steps(step["steps"]) == STOP:
                    return RAN
            if step.get("else") is not None:
                raise ScenarioFailure(str(step["else"]))
        elif do == "stop-if":
            if self.holds(step["that"]):
                return STOP
        else:  # expect
            that = step["that"]
            if not self.holds(that):
                raise ScenarioFailure("%s; %s" % (step["else"], self.context(that)))
        return RAN

    def _saved(self) -> Tuple[Any, ...]:
        """The host's own state, which ``twice`` and ``snapshot-restore`` start again from."""
        return (self.now, dict(self.wakes), self.next_call_id, dict(self.calls), self.last_call, self.ledger.copy(),
                dict(self.published))

    def _resume(self, saved: Tuple[Any, ...]) -> None:
        self.now, self.wakes, self.next_call_id, self.calls, self.last_call, self.ledger, self.published = saved

    def _snapshot_restore(self, steps: List[Any]) -> str:
        self._called("snapshot and restore into a fresh instance")
        now = self.now
        before = self._policy(lambda: self.instance.status(now))
        snapshot = self._policy(self.instance.snapshot)  # bytes, handed on as they are
        # The original answers the steps first; the restored instance answers them again from
        # the host's state as it was at the snapshot.
        saved = self._saved()
        first_from = len(self.transcript)
        flow = self.steps(steps)
        first = self.transcript[first_from:]
        if steps:
            self._called("restore the snapshot into a fresh instance")
            self._resume(saved)
        fresh = self._fresh()
        self._policy(lambda: fresh.restore(snapshot), "moving the state into a fresh instance failed: ")
        self.instance = fresh
        after = self._policy(lambda: self.instance.status(now))
        self._record({"do": "snapshot-restore"})
        # The contract does not order `status`: compare server by server.
        before, after = _by_server(before), _by_server(after)
        if before != after:
            raise ScenarioFailure("status changed across snapshot/restore: %s -> %s" % (dumps(before), dumps(after)))
        second_from = len(self.transcript)
        self.steps(steps)
        _same_runs(first, self.transcript[second_from:], "the restored instance answered otherwise than the original")
        return flow

    def _set_naming(self, naming: Dict[str, Any]) -> None:
        """``set-naming`` (contract 0.2.1); a 0.2.0 component has none to call."""
        if not speaks_naming(self.instance):
            raise ScenarioFailure("the policy has no set-naming (contract 0.2.0)")
        self._policy(lambda: self.instance.set_naming(naming))
        self._record({"do": "set-naming", "naming": naming})

    def _name_prompts(self, server: str, originals: List[str]) -> None:
        self._called("name the prompts of %s" % server)
        try:
            server = values.normalize(values.STRING, server, "server")
            originals = values.normalize(values.list_of(values.STRING), originals, "originals")
        except EncodingError as e:
            raise _Malformed("the name-prompts arguments do not fit the contract: %s" % e) from None
        if not speaks_naming(self.instance):
            raise ScenarioFailure("the policy has no name-prompts (contract 0.2.0)")
        named = self._policy(lambda: self.instance.name_prompts(server, originals))
        why = check_prompt_names(originals, named)
        if why is not None:
            raise ScenarioFailure(invalid(self._label(), "name-prompts", why))
        self._record({"do": "name-prompts", "server": server, "originals": originals, "named": named})
        self.prompt_names = named

    def _take_over(self, handover: Any, namings: List[Any]) -> None:
        previous = handover.get("previous", {}).get("name") if isinstance(handover, dict) else None
        self._called("take over from %s" % previous)
        handover = self._normalize("take-over", handover)
        namings = [naming_value(n, "naming") for n in namings]
        self.instance = self._fresh()
        self._record({"do": "init", "settings": self.settings})
        # The operator's namings come first, on the fresh instance; a 0.2.0 one is given none.
        if speaks_naming(self.instance):
            for naming in namings:
                self._set_naming(naming)
        self.ledger.note_handover(handover)
        # The handover says nothing of what the host shows: the policy's publications are new.
        self.published = {}
        actions = self._policy(lambda: self.instance.take_over(handover), "the handover was refused: ")
        self.ledger.check(actions, "take-over", self._label())
        why = check_take_over(actions, self.ledger.is_configured, self.ledger.is_live)
        if why is not None:
            raise ScenarioFailure(invalid(self._label(), "take-over", why))
        self._took(actions)
        self._record({"do": "take-over", "handover": handover, "actions": actions})

    def _twice(self, steps: List[Any]) -> str:
        saved = self._saved()
        first_from = len(self.transcript)
        flow = self.steps(steps)
        first = self.transcript[first_from:]
        self._resume(saved)
        self.instance = self._fresh()
        self._record({"do": "init", "settings": self.settings})
        second_from = len(self.transcript)
        self.steps(steps)
        _same_runs(first, self.transcript[second_from:], "the same inputs gave other outputs in a fresh instance")
        return flow

    # -- predicates ---------------------------------------------------------------------------

    def _count(self, tag: str, server: Any) -> int:
        return sum(1 for a in self.actions if a.get("tag") == tag and a.get("val") == server)

    def _publication(self, server: Any) -> Optional[List[Dict[str, Any]]]:
        for action in reversed(self.actions):
            if action.get("tag") == "publish-tools" and action["val"]["server"] == server:
                return action["val"]["tools"]
        return None

    def holds(self, pred: Dict[str, Any]) -> bool:
        """Whether a predicate (checked by ``check_predicate``) holds."""
        (key, arg), = pred.items()
        if key == "connects":
            return self._count("connect", arg) > 0
        if key == "disconnects":
            return self._count("disconnect", arg) > 0
        if key == "withdraws":
            return self._count("withdraw-tools", arg["server"]) == arg["times"]
        if key == "publishes":
            return self._publication(arg) is not None
        if key == "publishes-originals":
            tools = self._publication(arg["server"])
            if tools is None:
                return False
            published = {t["original"] for t in tools}
            return len(published) == len(tools) and published == set(arg["originals"])
        if key == "publishes-usable-names":
            tools = self._publication(arg)
            if tools is None:
                return False
            names = [t["advertised"] for t in tools]
            return all(valid_tool_name(n) for n in names) and len(set(names)) == len(names)
        if key == "publishes-advertised":
            tools = self._publication(arg["server"])
            if tools is None:
                return False
            return _same_pairs([(t["original"], t["advertised"]) for t in tools], arg["names"])
        if key == "names-prompts":
            return _same_pairs([(n["original"], n["advertised"]) for n in self.prompt_names], arg)
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
        if key == "published":
            return arg in self.published
        if key == "redundant":
            return arg in self.redundant
        if key == "attempting":
            return self.ledger.is_connecting(arg)
        if key == "state":
            server = arg["server"]
            for entry in self.status:
                if entry.get("server") == server:
                    return entry["state"] in arg["in"]
            raise ScenarioFailure("status() does not list %s" % server)
        return not self.holds(arg)  # not

    def context(self, pred: Dict[str, Any]) -> str:
        """What the predicate looked at, for a failure's message."""
        (key, arg), = pred.items()
        if key == "not":
            return self.context(arg)
        if key in ("admission", "refused-naming"):
            return "no call was admitted" if self.admission is None else "the admission was %s" % dumps(self.admission)
        if key in ("lists", "state"):
            return "the status was %s" % dumps(self.status)
        if key == "names-prompts":
            return "the prompt names were %s" % dumps(self.prompt_names)
        if key == "published":
            return "the host holds publications of %s" % dumps(sorted(self.published, key=_utf8))
        if key in ("timer-armed", "timer-not-in-the-past"):
            timers = ", ".join("%s: (%d, %d)" % (rust_debug(s), at, token) for s, (at, token) in sorted(self.wakes.items()))
            return "at %d the timers were {%s}" % (self.now, timers)
        return "the actions were %s" % dumps(self.actions)


def _utf8(text: str) -> bytes:
    """Rust's order of strings: by their UTF-8 bytes."""
    return text.encode("utf-8", "surrogatepass")


def _same_runs(first: List[str], second: List[str], what: str) -> None:
    """Fails with ``what`` when two runs of a block wrote other transcripts, naming the first
    line that differs."""
    if first != second:
        at = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), min(len(first), len(second)))
        raise ScenarioFailure(
            "%s (line %d of the block's transcript): %s vs %s"
            % (what, at + 1, first[at] if at < len(first) else "nothing", second[at] if at < len(second) else "nothing")
        )


def _same_pairs(got: List[Tuple[str, str]], wanted: List[Any]) -> bool:
    """Exactly these (original, advertised) pairs, in any order, none twice (as a set, as
    Tether's interpreter compares them)."""
    return len(set(got)) == len(got) and set(got) == {tuple(p) for p in wanted}


def _by_server(statuses: Any) -> Any:
    if not isinstance(statuses, list):
        return statuses
    return sorted(statuses, key=lambda s: str(s.get("server", "")) if isinstance(s, dict) else "")


def run_scenario(scenario: Scenario, factory: Factory, settings: str = "{}") -> Outcome:
    """Runs one scenario in fresh instances from ``factory``; never raises for the policy's
    faults. Raises ``MalformedScenario`` when the scenario is not well formed, or an argument
    it hands the policy does not fit the contract's types."""
    # Checked here as well as in ``Scenario.from_json``: tests and callers build a Scenario
    # directly, and the CLI relies on from_json to refuse a malformed file before running any.
    try:
        check_steps(scenario.steps, "steps")
    except _Malformed as e:
        raise MalformedScenario(scenario.name, str(e)) from None
    try:
        return _run(scenario, factory, settings)
    except _Malformed as e:
        raise MalformedScenario(scenario.name, str(e)) from None


def _run(scenario: Scenario, factory: Factory, settings: str) -> Outcome:
    run = Run(factory, settings)
    try:
        run.start()
    except ScenarioFailure as e:
        return Outcome(scenario.name, scenario.level, str(e), [])
    if not implements(run.instance, scenario.since):
        # What it checks came after the component's contract: it passes without running.
        return Outcome(scenario.name, scenario.level, None, [], applicable=False)
    failure = None
    try:
        run.run(scenario.steps)
    except ScenarioFailure as e:
        failure = str(e)
    return Outcome(scenario.name, scenario.level, failure, run.transcript)
