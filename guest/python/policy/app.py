"""The WIT glue of the failure-window policy: converts between the generated types of
`tether:policy@0.2.1` and the plain data of `windowpolicy` (where all the logic is).

componentize-py instantiates `Policy` for each call, so the state lives in this module.
"""

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import log as wit_log
from wit_world.imports import types as t

from windowpolicy import Policy as Logic
from windowpolicy import PolicyError

_state = None


def _policy():
    global _state
    if _state is None:  # the host calls `init` first; be safe anyway
        _state = Logic("")
    return _state


_LEVELS = {
    "trace": wit_log.Level.TRACE,
    "debug": wit_log.Level.DEBUG,
    "info": wit_log.Level.INFO,
    "warn": wit_log.Level.WARN,
    "error": wit_log.Level.ERROR,
}


def _flush_logs(policy):
    for level, message in policy.take_logs():
        wit_log.log(_LEVELS[level], message)


# ----- WIT -> plain -----

_FAULTS = {
    t.Fault_SpawnFailed: "spawn-failed",
    t.Fault_HandshakeFailed: "handshake-failed",
    t.Fault_HandshakeTimedOut: "handshake-timed-out",
    t.Fault_AuthRequired: "auth-required",
    t.Fault_NotMcpEndpoint: "not-mcp-endpoint",
    t.Fault_ProcessExited: "process-exited",
    t.Fault_TransportClosed: "transport-closed",
    t.Fault_SessionExpired: "session-expired",
    t.Fault_KeepaliveFailed: "keepalive-failed",
}

_TRANSPORTS = {
    t.TransportKind.STDIO: "stdio",
    t.TransportKind.STREAMABLE_HTTP: "streamable-http",
    t.TransportKind.SSE: "sse",
}

_SOURCES = {
    t.ReconnectSource.OPERATOR: "operator",
    t.ReconnectSource.AGENT: "agent",
    t.ReconnectSource.PROBE: "probe",
}

_STATES = {
    "connecting": t.ServerState.CONNECTING,
    "connected": t.ServerState.CONNECTED,
    "healthy": t.ServerState.HEALTHY,
    "backing-off": t.ServerState.BACKING_OFF,
    "parked": t.ServerState.PARKED,
    "stopped": t.ServerState.STOPPED,
}
_STATE_NAMES = {v: k for k, v in _STATES.items()}

_BREAKERS = {
    "closed": t.BreakerState.CLOSED,
    "open": t.BreakerState.OPEN,
    "half-open": t.BreakerState.HALF_OPEN,
}
_BREAKER_NAMES = {v: k for k, v in _BREAKERS.items()}


def _unknown(what, value):
    """Every converter matches each case explicitly: a case this glue does not know (a newer
    contract, a bug in the logic) must fail loudly, never pass for another one."""
    return ValueError(f"unknown {what}: {value!r}")


def _fault(f):
    return (_FAULTS[type(f)], getattr(f, "value", None))


def _tools(tools):
    return [(tool.name, tool.read_only, tool.revision) for tool in tools]


def _config(c):
    return {
        "name": c.name,
        "transport": _TRANSPORTS[c.transport],
        "include": list(c.include),
        "exclude": list(c.exclude),
        "settings": c.settings,
    }


def _outcome(o):
    if isinstance(o, t.CallOutcome_Ok):
        return ("ok",)
    if isinstance(o, t.CallOutcome_ToolError):
        return ("tool-error", o.value)
    if isinstance(o, t.CallOutcome_TransportError):
        return ("transport-error", _fault(o.value))
    if isinstance(o, t.CallOutcome_Timeout):
        return ("timeout",)
    if isinstance(o, t.CallOutcome_Cancelled):
        return ("cancelled",)
    raise _unknown("call outcome", o)


def _event(kind):
    v = getattr(kind, "value", None)
    if isinstance(kind, t.EventKind_ServerConfigured):
        return ("server-configured", _config(v))
    if isinstance(kind, t.EventKind_ServerRemoved):
        return ("server-removed", v)
    if isinstance(kind, t.EventKind_Connected):
        return ("connected", (v.server, v.server_info, _tools(v.tools)))
    if isinstance(kind, t.EventKind_ConnectFailed):
        return ("connect-failed", (v.server, _fault(v.fault)))
    if isinstance(kind, t.EventKind_Disconnected):
        return ("disconnected", (v.server, _fault(v.fault)))
    if isinstance(kind, t.EventKind_ToolsChanged):
        return ("tools-changed", (v.server, _tools(v.tools)))
    if isinstance(kind, t.EventKind_KeepaliveOk):
        return ("keepalive-ok", v)
    if isinstance(kind, t.EventKind_KeepaliveFailed):
        return ("keepalive-failed", (v.server, _fault(v.fault)))
    if isinstance(kind, t.EventKind_CallFinished):
        return ("call-finished", (v.server, v.call_id, _outcome(v.outcome)))
    if isinstance(kind, t.EventKind_Timer):
        return ("timer", (v.server, v.token))
    if isinstance(kind, t.EventKind_ReconnectRequested):
        return ("reconnect-requested", (v.server, _SOURCES[v.source]))
    if isinstance(kind, t.EventKind_Shutdown):
        return ("shutdown", None)
    raise _unknown("event", kind)


def _handover(h):
    servers = []
    for s in h.servers:
        session = None
        if s.session is not None:
            session = {
                "info": s.session.server_info,
                "tools": _tools(s.session.tools),
                "proven": s.session.proven,
            }
        servers.append(
            {
                "config": _config(s.config),
                "session": session,
                "connecting": s.connecting,
                "state": _STATE_NAMES[s.state],
                "breaker": _BREAKER_NAMES[s.breaker],
                "breaker_until": s.breaker_until,
                "failures": s.failures,
                "breaker_failures": s.breaker_failures,
                "tool_errors": s.tool_errors,
                "last_fault": s.last_fault,
                "since": s.since,
                "next_attempt_at": s.next_attempt_at,
            }
        )
    return {"now": h.now, "servers": servers, "previous": (h.previous.name, h.previous.version)}


# ----- plain -> WIT -----

def _action(a):
    kind = a[0]
    if kind == "connect":
        return t.Action_Connect(a[1])
    if kind == "disconnect":
        return t.Action_Disconnect(a[1])
    if kind == "wake":
        return t.Action_WakeAt(t.Wake(server=a[1], at=a[2], token=a[3]))
    if kind == "publish":
        tools = [t.PublishedTool(advertised=adv, original=orig, read_only=ro) for adv, orig, ro in a[2]]
        return t.Action_PublishTools(t.Publication(server=a[1], tools=tools))
    if kind == "withdraw":
        return t.Action_WithdrawTools(a[1])
    if kind == "state":
        return t.Action_StateChanged(t.StateChange(server=a[1], state=_STATES[a[2]], detail=a[3]))
    raise _unknown("action", a)


def _admission(a):
    kind = a[0]
    if kind == "allow":
        return t.Admission_Allow()
    if kind == "probe":
        return t.Admission_Probe()
    if kind == "reconnect":
        return t.Admission_Reconnect(a[1])
    if kind == "hold":
        return t.Admission_Hold(t.Hold(wait_ms=a[1], message=a[2]))
    if kind == "reject":
        return t.Admission_Reject(a[1])
    raise _unknown("admission", a)


def _status(s):
    return t.ServerStatus(
        server=s["server"],
        state=_STATES[s["state"]],
        breaker=_BREAKERS[s["breaker"]],
        failures=s["failures"],
        breaker_failures=s["breaker_failures"],
        tool_errors=s["tool_errors"],
        last_fault=s["last_fault"],
        since=s["since"],
        published_tools=s["published_tools"],
        next_attempt_at=s["next_attempt_at"],
        breaker_until=s["breaker_until"],
    )


class Policy(exports.Policy):
    def info(self):
        name, version = Logic.info()
        return t.PolicyInfo(name=name, version=version)

    def init(self, settings):
        global _state
        try:
            _state = Logic(settings)
        except PolicyError as e:
            raise Err(str(e))

    def set_settings(self, settings):
        policy = _policy()
        try:
            policy.set_settings(settings)
        except PolicyError as e:
            raise Err(str(e))
        finally:
            _flush_logs(policy)

    def handle(self, event):
        policy = _policy()
        actions = policy.handle(event.now, _event(event.kind))
        _flush_logs(policy)
        return [_action(a) for a in actions]

    def admit(self, request):
        policy = _policy()
        admission = policy.admit(request.now, request.call_id, request.server, request.tool)
        _flush_logs(policy)
        return _admission(admission)

    def status(self, now):
        return [_status(s) for s in _policy().status(now)]

    def snapshot(self):
        return _policy().snapshot()

    def restore(self, snapshot):
        global _state
        try:
            _state = Logic.restore(snapshot)
        except PolicyError as e:
            raise Err(str(e))

    def take_over(self, handover):
        global _state
        policy = _policy()
        # Worked on a copy, so that a refusal changes nothing.
        candidate = Logic.restore(policy.snapshot())
        try:
            actions = candidate.take_over(_handover(handover))
        except PolicyError as e:
            raise Err(str(e))
        _state = candidate
        _flush_logs(candidate)
        return [_action(a) for a in actions]

    def set_naming(self, naming):
        policy = _policy()
        policy.set_naming(naming.server, naming.prefix)
        _flush_logs(policy)

    def name_prompts(self, server, originals):
        named = _policy().name_prompts(server, list(originals))
        return [t.NamedPrompt(advertised=adv, original=orig) for adv, orig in named]
