"""Faults as plain data, `(kind, payload)`, their classes and their words.

kinds (the WIT's case names): spawn-failed(str), handshake-failed(str), handshake-timed-out,
auth-required(int), not-mcp-endpoint(str), process-exited(int|None), transport-closed(str),
session-expired, keepalive-failed(str).

Classes decide what a failure costs:
- permanent: retrying cannot help until someone changes something: park at once;
- handshake: the server starts but does not speak MCP in time: slow backoff;
- crash: the process exited: medium backoff;
- transport: a pipe or connection closed: short backoff;
- expired: the server forgot the session: reconnect almost at once.
"""

_CLASS = {
    "spawn-failed": "permanent",
    "auth-required": "permanent",
    "not-mcp-endpoint": "permanent",
    "handshake-failed": "handshake",
    "handshake-timed-out": "handshake",
    "process-exited": "crash",
    "transport-closed": "transport",
    "keepalive-failed": "transport",
    "session-expired": "expired",
}

# Exit codes a shell gives for "cannot execute" (126) and "command not found" (127): a process
# that exits with one of these before its handshake will not start by itself.
_NOT_STARTABLE = (126, 127)


def fault_class(fault, at_connect):
    """The class of `fault`; `at_connect`: it ended a connection attempt (not a session)."""
    kind, payload = fault
    if at_connect and kind == "process-exited" and payload in _NOT_STARTABLE:
        return "permanent"
    return _CLASS.get(kind, "transport")


def describe(fault):
    """For operators (status, state changes): may include the host's text."""
    kind, payload = fault
    if kind == "spawn-failed":
        return f"spawn failed: {payload}"
    if kind == "handshake-failed":
        return f"handshake failed: {payload}"
    if kind == "handshake-timed-out":
        return "handshake timed out"
    if kind == "auth-required":
        return f"authorization required (HTTP {payload})"
    if kind == "not-mcp-endpoint":
        return f"not an MCP endpoint: {payload}"
    if kind == "process-exited":
        return "process killed by a signal" if payload is None else f"process exited with code {payload}"
    if kind == "transport-closed":
        return f"transport closed: {payload}"
    if kind == "session-expired":
        return "session expired"
    if kind == "keepalive-failed":
        return f"keepalive failed: {payload}"
    return kind


def phrase(fault):
    """For the model: the category only, never the host's text (it may carry URLs or paths)."""
    kind, payload = fault
    return {
        "spawn-failed": "its process could not be started",
        "handshake-failed": "its MCP handshake failed",
        "handshake-timed-out": "its MCP handshake timed out",
        "auth-required": f"it requires authorization (HTTP {payload})",
        "not-mcp-endpoint": "its endpoint is not an MCP server",
        "process-exited": "its process exited",
        "transport-closed": "its connection closed",
        "session-expired": "its session expired",
        "keepalive-failed": "it stopped answering keepalives",
    }.get(kind, "it failed")
