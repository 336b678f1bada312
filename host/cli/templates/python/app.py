"""A starter Tether policy in Python (contract tether:policy@0.2.1, see wit/policy.wit).

RENAME THIS POLICY FIRST: set NAME below to a name of your own. Tether treats two components
with the same name as one implementation and moves state between them by snapshot (`restore`),
not by `take-over`; a policy still called "my-python-policy" would be handed another policy's
private snapshot.

A policy is a pure, deterministic state machine: the host feeds it events stamped with its
time and executes the actions it returns. Rules of the sandbox:
- no clocks (time comes in events), no randomness (derive it from the inputs if you need it),
  no files, network or environment: only the WIT's functions reach the host;
- `hash()` of a string differs between builds: never let it decide anything (nor the iteration
  order of a set of strings); sort instead;
- componentize-py creates a `Policy` object per call: keep state in module globals (STATE).

What this starter does: connect on configuration; publish `<server>__<tool>` names, or
`<prefix><tool>` when the operator gave the server a prefix (`set-naming`; "" for the server's
own names), made valid and unique, and name prompts by the same rule; retry with exponential backoff; park (tools withdrawn, slow self-probe) after
`max_failures` failures without a proven session or at once on a permanent fault; a circuit
breaker on consecutive transport failures of calls, with one half-open probe. Build with
`bash build.sh policy.wasm`, check with `tether policy check policy.wasm`: it passes the
contract; of Tether's invariants it leaves one to you (a half-open probe that finds no session
should answer `reconnect`: see `admit`).
"""

import fnmatch
import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import log
from wit_world.imports import types as t

NAME = "my-python-policy"  # RENAME ME (see above); `info()` reports it
VERSION = "0.1.0"
FORMAT = f"{NAME}/1"  # written into snapshots; bump it when the state's layout changes

U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1
MAX_SETTING = 10**12  # every setting is an integer within 1..=MAX_SETTING (ms: ~31 years)

# Settings and their defaults: `init` and `set-settings` take a JSON object of these keys.
DEFAULTS = {
    "backoff_ms": 1_000,  # first retry delay, doubled per failure, capped at 60 s
    "max_failures": 5,  # failures without a proven session before parking
    "probe_ms": 300_000,  # self-probe period of a parked server
    "breaker_threshold": 3,  # consecutive transport failures of calls that open the breaker
    "breaker_cooldown_ms": 30_000,  # how long it stays open before one probe call
}

PERMANENT = (t.Fault_SpawnFailed, t.Fault_AuthRequired, t.Fault_NotMcpEndpoint)

# "namings": the operator's prefix per server (set-naming); it may come before the server does.
STATE = {"settings": dict(DEFAULTS), "now": 0, "token": 0, "servers": {}, "namings": {}}


def check_settings(values):
    """Validates a dict of settings (raises Err naming the key) and returns it with the defaults."""
    if not isinstance(values, dict):
        raise Err("settings must be a JSON object")
    for key, value in values.items():
        if key not in DEFAULTS:
            raise Err(f"unknown setting {key!r} (known: {', '.join(sorted(DEFAULTS))})")
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SETTING:
            raise Err(f"setting {key!r} must be an integer from 1 to {MAX_SETTING}, not {value!r}")
    return {**DEFAULTS, **values}


def parse_settings(text):
    try:
        values = json.loads(text) if text.strip() else {}
    except ValueError as e:
        raise Err(f"settings are not valid JSON: {e}")
    return check_settings(values)


def later(delay):
    """Host time `delay` ms from now, clamped to what a u64 holds."""
    return min(STATE["now"] + delay, U64_MAX)


def inc(n):
    """n + 1, clamped to what a u32 (a counter in `status`) holds."""
    return min(n + 1, U32_MAX)


# ----- names -----

def fnv32(text):
    """A stable hash (FNV-1a, 32 bits): unlike hash(), the same in every build."""
    h = 0x811C9DC5
    for byte in text.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def tool_name(server, tool, n=0):
    """`server__tool` (or the operator's `<prefix><tool>`) with invalid characters replaced, 1 to
    64 characters; `n` > 0 gives an alternative (for a name that is taken)."""
    prefix = STATE["namings"].get(server)
    text = f"{server}__{tool}" if prefix is None else prefix + tool
    name = "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "_" for c in text)
    if 1 <= len(name) <= 64 and n == 0:
        return name
    return f"{name[:55]}_{fnv32(f'{server}/{tool}/{n}'):08x}"


def name_prompts(server, originals):
    """The names agents see for a server's prompts, by the rule of its tools; changes nothing."""
    taken, out = set(), []
    for prompt in dict.fromkeys(originals):  # each once, in order
        n = 0
        while tool_name(server, prompt, n) in taken:
            n += 1
        taken.add(tool_name(server, prompt, n))
        out.append(t.NamedPrompt(advertised=tool_name(server, prompt, n), original=prompt))
    return out


def plan(name, srv):
    """What the server should show now: [[advertised, original, read_only, revision], ...]."""
    taken = {p[0] for other, s in STATE["servers"].items() if other != name for p in s["published"] or []}
    out = []
    for tool, read_only, revision in sorted(srv["tools"]):
        if srv["include"] and not any(fnmatch.fnmatchcase(tool, p) for p in srv["include"]):
            continue
        if any(fnmatch.fnmatchcase(tool, p) for p in srv["exclude"]):
            continue
        n = 0
        while tool_name(name, tool, n) in taken:
            n += 1
        taken.add(tool_name(name, tool, n))
        out.append([tool_name(name, tool, n), tool, read_only, revision])
    return out


def publish(name, srv, out):
    """Publishes the server's tools, only if they differ from what it shows."""
    tools = plan(name, srv)
    if tools != srv["published"]:
        srv["published"] = tools
        shown = [t.PublishedTool(advertised=a, original=o, read_only=r) for a, o, r, _ in tools]
        out.append(t.Action_PublishTools(t.Publication(server=name, tools=shown)))


def withdraw(name, srv, out):
    """THE withdrawal: exactly once, only if the server shows tools."""
    if srv["published"] is not None:
        srv["published"] = None
        out.append(t.Action_WithdrawTools(name))


# ----- lifecycle -----

def enter(name, srv, state, detail, out):
    if srv["state"] != state:
        srv["state"], srv["since"] = state, STATE["now"]
        out.append(t.Action_StateChanged(t.StateChange(server=name, state=getattr(t.ServerState, state), detail=detail)))


def arm(name, srv, delay, out):
    STATE["token"] += 1
    srv["wake"] = [later(delay), STATE["token"]]
    out.append(t.Action_WakeAt(t.Wake(server=name, at=srv["wake"][0], token=srv["wake"][1])))


def connect(name, srv, out):
    srv["wake"] = None
    enter(name, srv, "CONNECTING", "connecting", out)
    out.append(t.Action_Connect(name))


def fail(name, srv, fault, out):
    """An attempt failed or a session died: back off, or park."""
    settings = STATE["settings"]
    srv["failures"] = inc(srv["failures"])
    srv["last_fault"] = type(fault).__name__.split("_", 1)[1]
    if isinstance(fault, PERMANENT) or srv["failures"] >= settings["max_failures"]:
        withdraw(name, srv, out)
        enter(name, srv, "PARKED", f"parked after {srv['last_fault']}", out)
        arm(name, srv, settings["probe_ms"], out)
    else:
        # The shift is bounded: 2**16 > 60 000, and failures may be huge after a take-over.
        delay = min(60_000, settings["backoff_ms"] << min(srv["failures"] - 1, 16))
        enter(name, srv, "BACKING_OFF", f"{srv['last_fault']}; retry in {delay} ms", out)
        arm(name, srv, delay, out)


def new_server(config):
    return {
        "include": list(config.include), "exclude": list(config.exclude),
        "state": "CONNECTING", "since": STATE["now"], "live": False, "proven": False,
        "tools": [], "published": None, "failures": 0, "last_fault": None, "wake": None,
        "tool_errors": 0, "breaker_failures": 0, "breaker_until": None, "probe": None,
    }


def on_event(kind, out):
    servers = STATE["servers"]
    if isinstance(kind, t.EventKind_Shutdown):
        for name, srv in sorted(servers.items()):
            withdraw(name, srv, out)
            srv["live"], srv["wake"] = False, None
            enter(name, srv, "STOPPED", "host shutting down", out)
        return
    if isinstance(kind, t.EventKind_ServerConfigured):
        name = kind.value.name
        if name not in servers:
            servers[name] = new_server(kind.value)
            out.append(t.Action_Connect(name))
        else:
            servers[name]["include"] = list(kind.value.include)
            servers[name]["exclude"] = list(kind.value.exclude)
            if servers[name]["live"]:
                publish(name, servers[name], out)
        return
    # Every other event names one server.
    value = kind.value
    name = value if isinstance(value, str) else value.server
    if isinstance(kind, t.EventKind_ServerRemoved):
        STATE["namings"].pop(name, None)  # the operator's naming ends with the server
    srv = servers.get(name)
    if srv is None or srv["state"] == "STOPPED":
        return
    if isinstance(kind, t.EventKind_ServerRemoved):
        withdraw(name, srv, out)
        out.append(t.Action_Disconnect(name))
        del servers[name]
    elif isinstance(kind, t.EventKind_Connected):
        srv.update(live=True, proven=False, wake=None, breaker_failures=0, breaker_until=None, probe=None)
        srv["tools"] = [[x.name, x.read_only, x.revision] for x in value.tools]
        publish(name, srv, out)
        enter(name, srv, "CONNECTED", "session established", out)
    elif isinstance(kind, t.EventKind_ConnectFailed):
        if srv["state"] == "CONNECTING":
            fail(name, srv, value.fault, out)
    elif isinstance(kind, t.EventKind_Disconnected):
        if srv["live"]:
            srv["live"] = srv["proven"] = False
            withdraw(name, srv, out)
            fail(name, srv, value.fault, out)
    elif isinstance(kind, t.EventKind_ToolsChanged):
        if srv["live"]:
            srv["tools"] = [[x.name, x.read_only, x.revision] for x in value.tools]
            publish(name, srv, out)
    elif isinstance(kind, t.EventKind_KeepaliveOk):
        prove(name, srv, out)
    elif isinstance(kind, t.EventKind_CallFinished):
        on_call_finished(name, srv, value, out)
    elif isinstance(kind, t.EventKind_Timer):
        if srv["wake"] and srv["wake"][1] == value.token and srv["state"] in ("BACKING_OFF", "PARKED"):
            connect(name, srv, out)
    elif isinstance(kind, t.EventKind_ReconnectRequested):
        if srv["state"] in ("BACKING_OFF", "PARKED"):
            connect(name, srv, out)


def prove(name, srv, out):
    """The session answered: the failure count starts again."""
    if srv["live"]:
        srv["proven"], srv["failures"] = True, 0
        enter(name, srv, "HEALTHY", "session proven", out)


def on_call_finished(name, srv, report, out):
    outcome = report.outcome
    if isinstance(outcome, (t.CallOutcome_Ok, t.CallOutcome_ToolError)):
        # The server answered (a tool error is the arguments' fault): the breaker closes.
        srv["tool_errors"] = inc(srv["tool_errors"]) if isinstance(outcome, t.CallOutcome_ToolError) else 0
        srv.update(breaker_failures=0, breaker_until=None, probe=None)
        prove(name, srv, out)
    elif isinstance(outcome, (t.CallOutcome_TransportError, t.CallOutcome_Timeout)):
        srv["breaker_failures"] = inc(srv["breaker_failures"])
        probe_failed = srv["probe"] == report.call_id
        if probe_failed or (srv["breaker_until"] is None and srv["breaker_failures"] >= STATE["settings"]["breaker_threshold"]):
            srv["breaker_until"], srv["probe"] = later(STATE["settings"]["breaker_cooldown_ms"]), None
    elif srv["probe"] == report.call_id:  # cancelled: frees the probe
        srv["probe"] = None


def admit(request):
    name, now = request.server, STATE["now"]
    srv = STATE["servers"].get(name)
    if srv is None or srv["state"] == "STOPPED":
        return t.Admission_Reject(f"Server {name!r} is not available; the call was not sent.")
    if not srv["live"]:
        return t.Admission_Reject(f"Server {name!r} has no session ({srv['state'].lower()}); the call was not sent. Retry later.")
    if srv["breaker_until"] is None:
        return t.Admission_Allow()
    if now < srv["breaker_until"] or srv["probe"] is not None:
        return t.Admission_Reject(f"Server {name!r} is failing (circuit open); the call was not sent. Retry later.")
    srv["probe"] = request.call_id  # the one half-open probe
    return t.Admission_Probe()


def status_of(name, srv, now):
    until = srv["breaker_until"]
    breaker = "CLOSED" if until is None else ("OPEN" if now < until else "HALF_OPEN")
    planned = srv["wake"][0] if srv["wake"] and srv["state"] in ("BACKING_OFF", "PARKED") else None
    return t.ServerStatus(
        server=name, state=getattr(t.ServerState, srv["state"]), breaker=getattr(t.BreakerState, breaker),
        failures=srv["failures"], breaker_failures=srv["breaker_failures"], tool_errors=srv["tool_errors"],
        last_fault=srv["last_fault"], since=srv["since"], published_tools=len(srv["published"] or []),
        next_attempt_at=planned, breaker_until=until if breaker == "OPEN" else None,
    )


# ----- take-over: adopt another policy's state -----

def adopt(h, out):
    name = h.config.name
    srv = new_server(h.config)
    srv.update(since=min(h.since, STATE["now"]), failures=h.failures, tool_errors=h.tool_errors,
               breaker_failures=h.breaker_failures, last_fault=h.last_fault)
    if h.breaker != t.BreakerState.CLOSED:
        srv["breaker_until"] = h.breaker_until if h.breaker_until is not None else STATE["now"]
    STATE["servers"][name] = srv
    if h.session is not None:  # a live session: keep it (never connect it again) and publish
        srv.update(live=True, proven=h.session.proven, state="HEALTHY" if h.session.proven else "CONNECTED")
        srv["tools"] = [[x.name, x.read_only, x.revision] for x in h.session.tools]
        publish(name, srv, out)
    elif h.connecting:  # an attempt in flight: its outcome arrives as an event
        srv["state"] = "CONNECTING"
    elif h.state == t.ServerState.STOPPED:
        srv["state"] = "STOPPED"
    else:  # waiting: arm a timer for the planned attempt (or now)
        srv["state"] = "PARKED" if h.state == t.ServerState.PARKED else "BACKING_OFF"
        at = h.next_attempt_at if h.next_attempt_at is not None else STATE["now"]
        arm(name, srv, max(0, at - STATE["now"]), out)


# ----- snapshot and restore -----

# The type(s) of every field of a server's record, for `restore`.
SERVER_FIELDS = {
    "include": list, "exclude": list, "state": str, "since": int, "live": bool, "proven": bool,
    "tools": list, "published": (list, type(None)), "failures": int, "last_fault": (str, type(None)),
    "wake": (list, type(None)), "tool_errors": int, "breaker_failures": int,
    "breaker_until": (int, type(None)), "probe": (int, type(None)),
}


def check_snapshot(state):
    """Validates a decoded snapshot (raises Err saying what is wrong) and returns the state."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise Err(f"not a snapshot of this policy (expected format {FORMAT!r})")
    state = {"namings": {}, **state}  # a snapshot of before contract 0.2.1 has no namings
    if sorted(state) != ["format", "namings", "now", "servers", "settings", "token"]:
        raise Err(f"snapshot has unexpected keys: {sorted(state)}")
    namings = state["namings"]
    if not isinstance(namings, dict) or not all(isinstance(p, str) for p in namings.values()):
        raise Err("snapshot 'namings' must map servers to prefixes")
    if not isinstance(state["settings"], dict) or sorted(state["settings"]) != sorted(DEFAULTS):
        raise Err("snapshot settings must name every setting")
    settings = check_settings(state["settings"])
    for key in ("now", "token"):
        if isinstance(state[key], bool) or not isinstance(state[key], int) or not 0 <= state[key] <= U64_MAX:
            raise Err(f"snapshot {key!r} must be an integer from 0 to {U64_MAX}")
    if not isinstance(state["servers"], dict):
        raise Err("snapshot 'servers' must be an object")
    for name, srv in state["servers"].items():
        if not isinstance(srv, dict) or sorted(srv) != sorted(SERVER_FIELDS):
            raise Err(f"snapshot server {name!r} must have exactly the fields {sorted(SERVER_FIELDS)}")
        for field, kind in SERVER_FIELDS.items():
            if not isinstance(srv[field], kind):
                raise Err(f"snapshot server {name!r}: field {field!r} has the wrong type")
        if srv["state"] not in t.ServerState.__members__:
            raise Err(f"snapshot server {name!r}: unknown state {srv['state']!r}")
    return {"settings": settings, "now": state["now"], "token": state["token"], "servers": state["servers"],
            "namings": namings}


class Policy(exports.Policy):
    def info(self):
        # RENAME the policy (NAME, at the top): two components with the same name are one
        # implementation to Tether, which hands state between them by snapshot.
        return t.PolicyInfo(name=NAME, version=VERSION)

    def init(self, settings):
        parsed = parse_settings(settings)  # first: a refused init leaves the state as it was
        STATE.clear()
        STATE.update(settings=parsed, now=0, token=0, servers={}, namings={})

    def set_settings(self, settings):
        STATE["settings"] = parse_settings(settings)

    def handle(self, event):
        STATE["now"] = max(STATE["now"], event.now)
        out = []
        on_event(event.kind, out)
        return out

    def admit(self, request):
        STATE["now"] = max(STATE["now"], request.now)
        return admit(request)

    def status(self, now):
        now = max(now, STATE["now"])
        return [status_of(name, srv, now) for name, srv in sorted(STATE["servers"].items())]

    def snapshot(self):
        return json.dumps({"format": FORMAT, **STATE}, sort_keys=True).encode()

    def restore(self, snapshot):
        try:
            decoded = json.loads(bytes(snapshot))
        except (ValueError, RecursionError) as e:
            raise Err(f"not a snapshot of this policy: {e}")
        state = check_snapshot(decoded)  # first: a refused restore leaves the state as it was
        STATE.clear()
        STATE.update(state)

    def take_over(self, handover):
        if STATE["servers"]:
            raise Err("take-over needs a fresh instance")
        STATE["now"] = max(STATE["now"], handover.now)
        out = []
        for h in sorted(handover.servers, key=lambda h: h.config.name):
            adopt(h, out)
        log.log(log.Level.INFO, f"took over {len(handover.servers)} servers from {handover.previous.name}")
        return out

    def set_naming(self, naming):
        # The operator's prefix for a server's names (None: the default); the host follows with
        # `server-configured`, which republishes a live server under the new names.
        if naming.prefix is None:
            STATE["namings"].pop(naming.server, None)
        else:
            STATE["namings"][naming.server] = naming.prefix

    def name_prompts(self, server, originals):
        return name_prompts(server, originals)
