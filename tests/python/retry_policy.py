"""A policy as an operator might write one outside the project (issue 21), in Python
(componentize-py), for the test that swaps it into a running gateway
(tests/tests/languages.rs): every failed attempt or lost session is retried 1 s later
(`interval_ms`), forever. No parking, no breaker, no retry budget; a server's tools are
withdrawn on every failure, whether any were shown or not (the host absorbs a withdrawal of
nothing).

It keeps the contract, so it swaps in with `--force`; it breaks Tether's invariants about
parking, the budget, the breaker and quiet withdrawals, which the swap's answer names. The test
builds it as `app.py` of a `tether policy new --lang python` starter (that starter's build.sh
and WIT).
"""

import fnmatch
import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import types as t

NAME = "retry-every-second"
U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1

STATE = {"interval_ms": 1000, "now": 0, "token": 0, "servers": {}, "namings": {}}


def interval(settings):
    """The interval from the settings (a JSON object); other keys are not this policy's."""
    try:
        values = json.loads(settings) if settings.strip() else {}
    except ValueError as e:
        raise Err(f"settings are not valid JSON: {e}")
    if not isinstance(values, dict):
        raise Err("settings must be a JSON object")
    value = values.get("interval_ms", 1000)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 3_600_000:
        raise Err("interval_ms must be an integer from 1 to 3600000")
    return value


def fnv32(text):
    h = 0x811C9DC5
    for byte in text.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def tool_name(server, tool, n=0):
    """`server__tool`, or the operator's `<prefix><tool>`, as a usable name; n > 0: another."""
    prefix = STATE["namings"].get(server)
    text = f"{server}__{tool}" if prefix is None else prefix + tool
    name = "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "_" for c in text)
    if 1 <= len(name) <= 64 and n == 0:
        return name
    return f"{name[:55]}_{fnv32(f'{server}/{tool}/{n}'):08x}"


def unique(server, names, taken):
    """(advertised, original) for each original, each advertised name unused in `taken`."""
    out = []
    for original in names:
        n = 0
        while tool_name(server, original, n) in taken:
            n += 1
        taken.add(tool_name(server, original, n))
        out.append((tool_name(server, original, n), original))
    return out


def publish(name, srv, out):
    if not srv["live"]:
        return
    taken = {p[0] for other, s in STATE["servers"].items() if other != name for p in s["published"] or []}
    allowed = []
    for tool, read_only, revision in sorted(srv["tools"]):
        if srv["include"] and not any(fnmatch.fnmatchcase(tool, p) for p in srv["include"]):
            continue
        if any(fnmatch.fnmatchcase(tool, p) for p in srv["exclude"]):
            continue
        allowed.append((tool, read_only, revision))
    named = unique(name, [tool for tool, _, _ in allowed], taken)
    tools = [[a, o, r, rev] for (a, o), (_, r, rev) in zip(named, allowed)]
    if tools != srv["published"]:
        srv["published"] = tools
        shown = [t.PublishedTool(advertised=a, original=o, read_only=r) for a, o, r, _ in tools]
        out.append(t.Action_PublishTools(t.Publication(server=name, tools=shown)))


def enter(name, srv, state, detail, out):
    if srv["state"] != state:
        srv["state"], srv["since"] = state, STATE["now"]
        out.append(t.Action_StateChanged(t.StateChange(server=name, state=getattr(t.ServerState, state), detail=detail)))


def connect(name, srv, out):
    srv["wake"] = None
    enter(name, srv, "CONNECTING", "connecting", out)
    out.append(t.Action_Connect(name))


def failed(name, srv, fault, out):
    """Withdraw (shown or not), and try again after the interval."""
    srv.update(live=False, published=None, failures=min(srv["failures"] + 1, U32_MAX))
    srv["last_fault"] = type(fault).__name__.split("_", 1)[1]
    out.append(t.Action_WithdrawTools(name))
    enter(name, srv, "BACKING_OFF", f"{srv['last_fault']}; retry in {STATE['interval_ms']} ms", out)
    STATE["token"] += 1
    srv["wake"] = [min(STATE["now"] + STATE["interval_ms"], U64_MAX), STATE["token"]]
    out.append(t.Action_WakeAt(t.Wake(server=name, at=srv["wake"][0], token=srv["wake"][1])))


def new_server(config):
    return {"include": list(config.include), "exclude": list(config.exclude), "state": "CONNECTING",
            "since": STATE["now"], "live": False, "tools": [], "published": None, "failures": 0,
            "last_fault": None, "wake": None, "tool_errors": 0}


def tools_of(tools):
    return [[x.name, x.read_only, x.revision] for x in tools]


def on_event(kind, out):
    servers = STATE["servers"]
    if isinstance(kind, t.EventKind_Shutdown):
        for name, srv in sorted(servers.items()):
            out.append(t.Action_WithdrawTools(name))
            srv.update(live=False, published=None, wake=None)
            enter(name, srv, "STOPPED", "host shutting down", out)
        return
    if isinstance(kind, t.EventKind_ServerConfigured):
        name = kind.value.name
        if name not in servers:
            servers[name] = new_server(kind.value)
            out.append(t.Action_Connect(name))
        else:
            servers[name].update(include=list(kind.value.include), exclude=list(kind.value.exclude))
            publish(name, servers[name], out)
        return
    value = kind.value
    name = value if isinstance(value, str) else value.server
    if isinstance(kind, t.EventKind_ServerRemoved):
        STATE["namings"].pop(name, None)
    srv = servers.get(name)
    if srv is None or srv["state"] == "STOPPED":
        return
    if isinstance(kind, t.EventKind_ServerRemoved):
        out.append(t.Action_WithdrawTools(name))
        out.append(t.Action_Disconnect(name))
        del servers[name]
    elif isinstance(kind, t.EventKind_Connected):
        srv.update(live=True, wake=None, failures=0, tools=tools_of(value.tools))
        publish(name, srv, out)
        enter(name, srv, "CONNECTED", "session established", out)
    elif isinstance(kind, t.EventKind_ConnectFailed):
        if srv["state"] == "CONNECTING":
            failed(name, srv, value.fault, out)
    elif isinstance(kind, t.EventKind_Disconnected):
        if srv["live"]:
            failed(name, srv, value.fault, out)
    elif isinstance(kind, t.EventKind_ToolsChanged):
        if srv["live"]:
            srv["tools"] = tools_of(value.tools)
            publish(name, srv, out)
    elif isinstance(kind, t.EventKind_KeepaliveOk):
        if srv["live"]:
            enter(name, srv, "HEALTHY", "session proven", out)
    elif isinstance(kind, t.EventKind_CallFinished):
        if isinstance(value.outcome, t.CallOutcome_ToolError):
            srv["tool_errors"] = min(srv["tool_errors"] + 1, U32_MAX)
    elif isinstance(kind, t.EventKind_Timer):
        if srv["wake"] and srv["wake"][1] == value.token:
            connect(name, srv, out)
    elif isinstance(kind, t.EventKind_ReconnectRequested):
        if not srv["live"] and srv["state"] != "CONNECTING":
            connect(name, srv, out)


def adopt(h, out):
    name = h.config.name
    srv = new_server(h.config)
    srv.update(since=min(h.since, STATE["now"]), failures=h.failures, tool_errors=h.tool_errors,
               last_fault=h.last_fault)
    STATE["servers"][name] = srv
    if h.session is not None:  # a live session: keep it, publish its tools
        proven = h.session.proven or h.state == t.ServerState.HEALTHY
        srv.update(live=True, state="HEALTHY" if proven else "CONNECTED", tools=tools_of(h.session.tools))
        publish(name, srv, out)
    elif h.connecting:  # its outcome arrives as an event
        srv["state"] = "CONNECTING"
    elif h.state == t.ServerState.STOPPED:
        srv["state"] = "STOPPED"
    else:
        srv["state"] = "BACKING_OFF"
        STATE["token"] += 1
        at = max(h.next_attempt_at if h.next_attempt_at is not None else STATE["now"], STATE["now"])
        srv["wake"] = [at, STATE["token"]]
        out.append(t.Action_WakeAt(t.Wake(server=name, at=at, token=STATE["token"])))


class Policy(exports.Policy):
    def info(self):
        return t.PolicyInfo(name=NAME, version="1.0.0")

    def init(self, settings):
        every = interval(settings)
        STATE.clear()
        STATE.update(interval_ms=every, now=0, token=0, servers={}, namings={})

    def set_settings(self, settings):
        STATE["interval_ms"] = interval(settings)

    def handle(self, event):
        STATE["now"] = max(STATE["now"], event.now)
        out = []
        on_event(event.kind, out)
        return out

    def admit(self, request):
        name = request.server
        srv = STATE["servers"].get(name)
        if srv is not None and srv["live"]:
            return t.Admission_Allow()
        return t.Admission_Reject(f"Server {name} has no session; the call was not sent. Retry in a second.")

    def status(self, now):
        return [
            t.ServerStatus(
                server=name, state=getattr(t.ServerState, s["state"]), breaker=t.BreakerState.CLOSED,
                failures=s["failures"], breaker_failures=0, tool_errors=s["tool_errors"],
                last_fault=s["last_fault"], since=s["since"], published_tools=len(s["published"] or []),
                next_attempt_at=s["wake"][0] if s["wake"] else None, breaker_until=None,
            )
            for name, s in sorted(STATE["servers"].items())
        ]

    def snapshot(self):
        return json.dumps({"format": NAME, **STATE}, sort_keys=True).encode()

    def restore(self, snapshot):
        try:
            state = json.loads(bytes(snapshot))
        except ValueError as e:
            raise Err(f"not a snapshot of this policy: {e}")
        if not isinstance(state, dict) or state.pop("format", None) != NAME:
            raise Err("not a snapshot of this policy")
        STATE.clear()
        STATE.update(state)

    def take_over(self, handover):
        if STATE["servers"]:
            raise Err("take-over needs a fresh instance")
        STATE["now"] = max(STATE["now"], handover.now)
        out = []
        for h in sorted(handover.servers, key=lambda h: h.config.name):
            adopt(h, out)
        return out

    def set_naming(self, naming):
        if naming.prefix is None:
            STATE["namings"].pop(naming.server, None)
        else:
            STATE["namings"][naming.server] = naming.prefix

    def name_prompts(self, server, originals):
        named = unique(server, list(dict.fromkeys(originals)), set())
        return [t.NamedPrompt(advertised=a, original=o) for a, o in named]
