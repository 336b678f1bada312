"""The failure-window policy: one deterministic state machine for every server of a host.

Plain Python, no wasm: events, actions, admissions and statuses are tuples, dicts and strings
(see README.md and app.py for the mapping to the WIT types). Time comes only from the inputs;
nothing here reads a clock, draws a random number, does I/O or iterates a set, so the same
settings and inputs always give the same outputs.

Per server:
- failures: connection attempts that failed (or sessions that died) since the last *proven*
  session (a keepalive answered, or a call was answered); `window`: the times of those within
  the last `window_ms`. A server parks when `window_failures` fall within the window (a storm)
  or after `max_failures` in a row however slow (a slow death), or at once on a permanent fault.
- backoff: per fault class (`backoff_ms`), growing by `backoff_factor` per failure, capped,
  shortened by a deterministic jitter.
- parked: tools withdrawn, a self-probe armed (`park_probe_ms`, doubling per failed probe up to
  `park_probe_max_ms`): one attempt on probation; never given up.
- breaker: `breaker_threshold` consecutive transport errors or timeouts of calls open it for a
  cooldown; then exactly one call probes (or, without a session, one admission says reconnect).
  A failed probe reopens it for twice as long. Tool errors are counted apart.
"""

import json

from . import faults as F
from . import naming
from . import settings as S

NAME = "tether-window-policy"
VERSION = "0.1.0"
SNAPSHOT_FORMAT = NAME
SNAPSHOT_VERSION = 1

STATES = ("connecting", "connected", "healthy", "backing-off", "parked", "stopped")
BREAKER_STATES = ("closed", "open", "half-open")
MAX_HOLD_MS = S.MAX_HOLD_MS
_U64 = (1 << 64) - 1


class PolicyError(ValueError):
    """A refused input (settings, snapshot, handover); the message says why."""


def _secs(ms):
    """Whole seconds for the model, rounded up, at least 1."""
    return max(1, -(-ms // 1000))


def _ms_words(ms):
    return f"{ms // 1000} s" if ms % 1000 == 0 else f"{ms / 1000:.1f} s"


class Server:
    """One server's state. Every field is JSON data (snapshots are these fields)."""

    FIELDS = {
        # configuration
        "name": str,
        "transport": str,
        "include": list,
        "exclude": list,
        "raw_settings": str,
        "overrides": dict,
        "settings": dict,
        "config_error": (str, type(None)),
        # lifecycle
        "state": str,
        "since": int,
        "live": bool,
        "proven": bool,
        "info": str,
        "tools": list,
        "failures": int,
        "window": list,
        "probation": bool,
        "probe_delay": int,
        "last_fault": (str, type(None)),
        "last_phrase": (str, type(None)),
        "park_reason": (str, type(None)),
        "wake_at": (int, type(None)),
        "wake_token": (int, type(None)),
        "tool_errors": int,
        # breaker
        "b_failures": int,
        "b_open": bool,
        "b_until": int,
        "b_cooldown": int,
        "b_probe_call": (int, type(None)),
        "b_probe_reconnect": bool,
        "b_reason": str,
        # publication: [[advertised, original, read_only, revision], ...] or None (nothing shown)
        "published": (list, type(None)),
        # the operator's prefix the shown names follow (None: the default naming)
        "named_by": (str, type(None)),
    }

    # Fields a snapshot of an older build lacks, with the value they had then.
    ADDED = {"named_by": None}

    __slots__ = tuple(FIELDS)

    def __init__(self, name, now, settings):
        self.name = name
        self.transport = "stdio"
        self.include = []
        self.exclude = []
        self.raw_settings = ""
        self.overrides = {}
        self.settings = settings
        self.config_error = None
        self.state = "connecting"
        self.since = now
        self.live = False
        self.proven = False
        self.info = ""
        self.tools = []
        self.failures = 0
        self.window = []
        self.probation = False
        self.probe_delay = 0
        self.last_fault = None
        self.last_phrase = None
        self.park_reason = None
        self.wake_at = None
        self.wake_token = None
        self.tool_errors = 0
        self.b_failures = 0
        self.b_open = False
        self.b_until = 0
        self.b_cooldown = settings["breaker_cooldown_ms"]
        self.b_probe_call = None
        self.b_probe_reconnect = False
        self.b_reason = ""
        self.published = None
        self.named_by = None

    def to_json(self):
        return {field: getattr(self, field) for field in self.FIELDS}

    @classmethod
    def from_json(cls, data):
        if isinstance(data, dict):
            data = {**cls.ADDED, **data}
        if not isinstance(data, dict) or sorted(data) != sorted(cls.FIELDS):
            raise PolicyError("a server record does not have the expected fields")
        server = cls.__new__(cls)
        for field, kind in cls.FIELDS.items():
            value = data[field]
            bad_bool = isinstance(value, bool) and kind in (int, (int, type(None)))
            if bad_bool or not isinstance(value, kind):
                raise PolicyError(f"field {field!r} of a server record has the wrong type")
            setattr(server, field, value)
        if server.state not in STATES:
            raise PolicyError(f"server {server.name!r} has an unknown state {server.state!r}")
        server.settings = S.validate(server.settings)
        S.parse_overrides(json.dumps(server.overrides))
        if not all(isinstance(p, str) for p in server.include + server.exclude):
            raise PolicyError(f"server {server.name!r} has damaged filters")
        for tool in server.tools:
            _check_tool(tool)
        for entry in server.published or []:
            if not (
                isinstance(entry, list)
                and len(entry) == 4
                and isinstance(entry[0], str)
                and naming.valid_name(entry[0])
                and isinstance(entry[1], str)
                and isinstance(entry[2], bool)
                and isinstance(entry[3], int)
            ):
                raise PolicyError(f"server {server.name!r} has a damaged publication")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in server.window):
            raise PolicyError(f"server {server.name!r} has a damaged failure window")
        return server

    # ----- breaker, read at a time -----

    def breaker_at(self, now):
        if not self.b_open:
            return "closed"
        return "half-open" if now >= self.b_until else "open"

    def probe_claimed(self):
        return self.b_probe_call is not None or self.b_probe_reconnect


def _check_tool(tool):
    if not (
        isinstance(tool, list)
        and len(tool) == 3
        and isinstance(tool[0], str)
        and isinstance(tool[1], bool)
        and isinstance(tool[2], int)
        and not isinstance(tool[2], bool)
    ):
        raise PolicyError("a tool record is damaged")


def _tools(tools):
    """A server's tool list as [[name, read_only, revision], ...], first of each name kept."""
    seen = set()
    out = []
    for name, read_only, revision in tools:
        if name in seen:
            continue
        seen.add(name)
        out.append([name, bool(read_only), int(revision)])
    return out


class Policy:
    """The state machine. `handle`, `admit`, `status`, `snapshot`, `restore`, `take_over`,
    `set_naming`, `name_prompts` mirror the WIT functions; `take_logs` drains what it wants
    logged."""

    def __init__(self, settings_json=""):
        try:
            self.settings = S.from_json(settings_json)
        except S.SettingsError as e:
            raise PolicyError(str(e)) from None
        self.servers = {}
        self.owners = {}
        # The operator's prefix per server (contract 0.2.1); a server without one is named by
        # default. Apart from `servers`: it may come before the server's configuration.
        self.namings = {}
        self.now = 0
        self.next_token = 0
        self.logs = []

    # ----- the interface -----

    @staticmethod
    def info():
        return (NAME, VERSION)

    def take_logs(self):
        logs, self.logs = self.logs, []
        return logs

    def set_settings(self, settings_json):
        try:
            new = S.from_json(settings_json)
        except S.SettingsError as e:
            raise PolicyError(str(e)) from None
        effective = {}
        for name in sorted(self.servers):
            server = self.servers[name]
            try:
                effective[name] = S.effective(new, server.overrides)
            except S.SettingsError as e:
                # (A server parked for its own settings keeps no overrides: it cannot fail here.)
                raise PolicyError(
                    f"these settings would make the settings of server {name!r} invalid: {e}"
                ) from None
        self.settings = new
        for name, s in effective.items():
            self.servers[name].settings = s
        self._log("info", "settings changed")

    def handle(self, now, event):
        """Feeds one event `(kind, payload)`; returns the actions, in order."""
        self.now = max(self.now, now)
        kind, payload = event
        out = []
        handler = _HANDLERS.get(kind)
        if handler is None:
            self._log("warn", f"ignoring an unknown event {kind!r}")
        else:
            handler(self, payload, out)
        return out

    def admit(self, now, call_id, name, tool):
        self.now = max(self.now, now)
        now = self.now
        server = self.servers.get(name)
        if server is None:
            return ("reject", f'Server "{name}" is not configured; the call was not sent.')
        state = server.state
        if state == "stopped":
            return ("reject", f'Server "{name}" is stopped; the call was not sent.')
        if state == "parked":
            return ("reject", self._parked_words(server))
        if state in ("connected", "healthy"):
            breaker = server.breaker_at(now)
            if breaker == "closed":
                return ("allow",)
            if breaker == "open":
                return ("reject", self._breaker_words(server, now))
            if server.probe_claimed():
                return (
                    "reject",
                    f'Server "{name}" is being tested with one call after repeated failures; '
                    "the call was not sent. Retry in a few seconds.",
                )
            server.b_probe_call = call_id
            self._log("debug", f"server {name!r}: call {call_id} is the half-open probe")
            return ("probe",)
        # No session: connecting or backing off.
        hold = server.settings["hold_ms"]
        if state == "backing-off" and server.breaker_at(now) == "half-open" and not server.probe_claimed():
            server.b_probe_reconnect = True
            self._log("debug", f"server {name!r}: the half-open probe finds no session; reconnect")
            return (
                "reconnect",
                f'Server "{name}" has no live session; it is being reconnected. '
                "The call was not sent; retry in a few seconds.",
            )
        if state == "connecting":
            message = f'Server "{name}" is connecting; the call was not sent. Retry in a few seconds.'
            if hold > 0:
                return ("hold", hold, message)
            return ("reject", message)
        wait = max(0, (server.wake_at if server.wake_at is not None else now) - now)
        what = server.last_phrase or "a failure"
        message = (
            f'Server "{name}" is reconnecting after {what}; the call was not sent. '
            f"Retry in about {_secs(wait)} s."
        )
        if hold > 0 and wait <= hold:
            return ("hold", min(MAX_HOLD_MS, wait + hold), message)
        return ("reject", message)

    def status(self, now):
        now = max(now, self.now)
        out = []
        for name in sorted(self.servers):
            s = self.servers[name]
            breaker = s.breaker_at(now)
            out.append(
                {
                    "server": name,
                    "state": s.state,
                    "breaker": breaker,
                    "failures": min(s.failures, 0xFFFFFFFF),
                    "breaker_failures": min(s.b_failures, 0xFFFFFFFF),
                    "tool_errors": min(s.tool_errors, 0xFFFFFFFF),
                    "last_fault": s.last_fault,
                    "since": s.since,
                    "published_tools": len(s.published or []),
                    "next_attempt_at": s.wake_at if s.state in ("backing-off", "parked") else None,
                    "breaker_until": s.b_until if breaker == "open" else None,
                }
            )
        return out

    def set_naming(self, name, prefix):
        """The operator's naming of server `name`: a prefix (`""`: the server's own names), or
        None for the default. Takes effect at the server's next publication (the host follows
        with `server-configured`, which republishes a live server)."""
        if prefix is None:
            self.namings.pop(name, None)
        else:
            self.namings[name] = prefix
        how = "by default" if prefix is None else f"with the prefix {prefix!r}"
        self._log("debug", f"server {name!r}: tools and prompts named {how}")

    def name_prompts(self, name, originals):
        """The names agents see for server `name`'s prompts, as [(advertised, original)], by the
        rule of its tools. A pure query: nothing here changes the state. Each original once;
        where two map to one name, the later in sorted order gets an alternative, so a prompt's
        name does not depend on the order the server lists them in."""
        prefix = self.namings.get(name)
        unique = list(dict.fromkeys(originals))
        chosen = {}
        used = set()
        for orig in sorted(unique):
            adv = naming.advertised_name(name, orig, prefix)
            n = 0
            while adv in used:
                n += 1
                adv = naming.alternative_name(name, orig, n, prefix)
            chosen[orig] = adv
            used.add(adv)
        return [(chosen[orig], orig) for orig in unique]

    def snapshot(self):
        data = {
            "format": SNAPSHOT_FORMAT,
            "version": SNAPSHOT_VERSION,
            "settings": self.settings,
            "now": self.now,
            "next_token": self.next_token,
            "servers": [self.servers[n].to_json() for n in sorted(self.servers)],
            "namings": self.namings,
        }
        return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()

    @classmethod
    def restore(cls, blob):
        """A policy continuing exactly where the snapshotted one was (PolicyError if not ours)."""
        try:
            text = bytes(blob).decode("utf-8")
            S.check_depth(text, "the snapshot")
            data = json.loads(text)
        except S.SettingsError as e:
            raise PolicyError(str(e)) from None
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise PolicyError("the snapshot is not JSON; it was not taken by this policy") from None
        if not isinstance(data, dict) or data.get("format") != SNAPSHOT_FORMAT:
            raise PolicyError(f"the snapshot was not taken by {SNAPSHOT_FORMAT}")
        if data.get("version") != SNAPSHOT_VERSION:
            raise PolicyError(
                f"snapshot version {data.get('version')!r} is not supported "
                f"(this policy reads version {SNAPSHOT_VERSION})"
            )
        try:
            policy = cls.__new__(cls)
            policy.settings = S.validate(data["settings"])
            policy.now = data["now"]
            policy.next_token = data["next_token"]
            for value in (policy.now, policy.next_token):
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise PolicyError("the snapshot's clock or token is damaged")
            policy.servers = {}
            policy.owners = {}
            policy.logs = []
            # A snapshot of a build before contract 0.2.1 has no namings: every server by default.
            policy.namings = data.get("namings", {})
            if not isinstance(policy.namings, dict) or not all(
                isinstance(p, str) for p in policy.namings.values()
            ):
                raise PolicyError("the snapshot's namings are damaged")
            for record in data["servers"]:
                server = Server.from_json(record)
                if server.name in policy.servers:
                    raise PolicyError(f"the snapshot names server {server.name!r} twice")
                policy.servers[server.name] = server
                for adv, _orig, _ro, _rev in server.published or []:
                    if adv in policy.owners:
                        raise PolicyError(f"the snapshot publishes {adv!r} twice")
                    policy.owners[adv] = server.name
        except (KeyError, TypeError, S.SettingsError) as e:
            raise PolicyError(f"the snapshot is damaged: {e}") from None
        return policy

    def take_over(self, handover):
        """Adopts another implementation's state (see README.md); returns the actions."""
        if self.servers:
            raise PolicyError("take-over needs a policy that knows no server yet")
        names = [h["config"]["name"] for h in handover["servers"]]
        seen = set()
        for name in names:
            if name in seen:
                raise PolicyError(f"the handover names server {name!r} twice")
            seen.add(name)
        for h in handover["servers"]:
            if h["state"] not in STATES or h["breaker"] not in BREAKER_STATES:
                raise PolicyError(f"the handover's server {h['config']['name']!r} is damaged")
        self.now = max(self.now, handover["now"])
        prev_name, prev_version = handover["previous"]
        self._log(
            "info",
            f"taking over {len(names)} servers from {prev_name} {prev_version}",
        )
        out = []
        for h in sorted(handover["servers"], key=lambda h: h["config"]["name"]):
            self._adopt(h, prev_name, out)
        return out

    # ----- events -----

    def _on_configured(self, cfg, out):
        name = cfg["name"]
        server = self.servers.get(name)
        try:
            overrides = S.parse_overrides(cfg["settings"])
            effective = S.effective(self.settings, overrides)
            error = None
        except S.SettingsError as e:
            overrides, effective, error = {}, self.settings, str(e)
        if server is None:
            server = Server(name, self.now, effective)
            self.servers[name] = server
            self._apply_config(server, cfg, overrides, effective, error)
            if error is not None:
                self._log("error", f"server {name!r}: {error}")
                self._park(server, f"its configuration is invalid ({error})", False, out)
                return
            self._attempt(server, "configured; connecting", out)
            return
        if server.state == "stopped":
            self._log("debug", f"ignoring a configuration of stopped server {name!r}")
            return
        was_broken = server.config_error is not None
        self._apply_config(server, cfg, overrides, effective, error)
        if error is not None:
            self._log("error", f"server {name!r}: {error}")
            if not was_broken or server.state != "parked":
                self._park(server, f"its configuration is invalid ({error})", False, out)
            return
        if was_broken and server.state == "parked":
            self._attempt(server, "configuration fixed; connecting", out)
        elif server.live:
            self._publish(server, out)  # the filters may have changed: only a difference goes out

    def _apply_config(self, server, cfg, overrides, effective, error):
        server.transport = cfg["transport"]
        server.include = list(cfg["include"])
        server.exclude = list(cfg["exclude"])
        server.raw_settings = cfg["settings"]
        server.overrides = overrides
        server.settings = effective
        server.config_error = error

    def _on_removed(self, name, out):
        self.namings.pop(name, None)  # the naming ends with the server, known or not
        server = self.servers.get(name)
        if server is None:
            self._log("debug", f"ignoring the removal of unknown server {name!r}")
            return
        self._withdraw(server, out)
        out.append(("disconnect", name))
        out.append(("state", name, "stopped", "removed from the configuration"))
        del self.servers[name]
        self._log("debug", f"server {name!r} removed")

    def _on_connected(self, session, out):
        name, info, tools = session
        server = self.servers.get(name)
        if server is None:
            self._log("debug", f"ignoring a session of unknown server {name!r}")
            return
        if server.state == "stopped" or server.config_error is not None:
            out.append(("disconnect", name))
            self._log("warn", f"server {name!r}: closing a session that was not asked for")
            return
        server.live = True
        server.proven = False
        server.info = info
        server.tools = _tools(tools)
        server.wake_at = server.wake_token = None
        self._breaker_reset(server)  # a fresh session closes the breaker
        self._publish(server, out)
        self._enter(server, "connected", f"session established ({info}); not yet proven", out)

    def _on_connect_failed(self, sf, out):
        name, fault = sf
        server = self.servers.get(name)
        if server is None or server.state != "connecting":
            self._log("debug", f"ignoring a connect failure of {name!r}: no attempt in progress")
            return
        if server.b_probe_reconnect:
            self._breaker_reopen(server, "the reconnect of its half-open probe failed", out)
        self._fail(server, fault, True, out)

    def _on_disconnected(self, sf, out):
        name, fault = sf
        server = self.servers.get(name)
        if server is None or not server.live:
            self._log("debug", f"ignoring a disconnect of {name!r}: no live session")
            return
        server.live = False
        server.proven = False
        self._withdraw(server, out)
        self._fail(server, fault, False, out)

    def _on_tools_changed(self, st, out):
        name, tools = st
        server = self.servers.get(name)
        if server is None or not server.live:
            self._log("debug", f"ignoring a tool list of {name!r}: no live session")
            return
        server.tools = _tools(tools)
        self._publish(server, out)

    def _on_keepalive_ok(self, name, out):
        server = self.servers.get(name)
        if server is not None:
            self._prove(server, "a keepalive", out)

    def _on_keepalive_failed(self, sf, out):
        name, fault = sf
        server = self.servers.get(name)
        if server is not None:
            # Noted only: the host follows with `disconnected` if it tears the session down.
            server.last_fault = F.describe(fault)
            server.last_phrase = F.phrase(fault)

    def _on_call_finished(self, report, out):
        name, call_id, outcome = report
        server = self.servers.get(name)
        if server is None:
            return
        kind = outcome[0]
        if kind in ("ok", "tool-error"):
            if kind == "ok":
                server.tool_errors = 0
            else:
                server.tool_errors += 1  # the server works; the arguments did not
            server.b_failures = 0
            if server.b_open:
                was_probe = server.b_probe_call == call_id
                self._breaker_reset(server)
                detail = "circuit breaker closed: " + (
                    "its test call was answered" if was_probe else "a call was answered"
                )
                out.append(("state", name, server.state, detail))
            self._prove(server, "an answered call", out)
        elif kind in ("transport-error", "timeout"):
            if kind == "transport-error":
                server.last_fault = F.describe(outcome[1])
                server.last_phrase = F.phrase(outcome[1])
            if server.b_open:
                if server.b_probe_call == call_id:
                    self._breaker_reopen(server, "its test call failed", out)
                else:
                    server.b_failures += 1
            else:
                server.b_failures += 1
                if server.b_failures >= server.settings["breaker_threshold"]:
                    self._breaker_open(server, out)
        elif kind == "cancelled":
            if server.b_probe_call == call_id:
                server.b_probe_call = None  # frees the probe for another call

    def _on_timer(self, timer, out):
        name, token = timer
        server = self.servers.get(name)
        if server is None or server.wake_token != token:
            self._log("debug", f"ignoring a stale timer of {name!r}")
            return
        server.wake_at = server.wake_token = None
        if server.state == "backing-off":
            self._attempt(
                server,
                f"backoff over; attempt {server.failures + 1} "
                f"(limit {server.settings['max_failures']})",
                out,
            )
        elif server.state == "parked":
            self._revive(server, "self-probe", out)

    def _on_reconnect(self, request, out):
        name, source = request
        server = self.servers.get(name)
        if server is None:
            return
        who = {"operator": "an operator", "agent": "the agent", "probe": "the half-open probe"}.get(
            source, source
        )
        state = server.state
        if state == "parked":
            self._revive(server, f"reconnect requested by {who}", out)
        elif state == "backing-off":
            self._attempt(server, f"reconnect requested by {who}; attempting now", out)
        elif state in ("connected", "healthy"):
            # An agent may only replace a session that is in doubt.
            if source == "agent" and server.proven and not server.b_open:
                self._log("debug", f"server {name!r}: the agent's reconnect of a healthy session ignored")
                return
            server.live = False
            server.proven = False
            self._withdraw(server, out)
            self._attempt(server, f"reconnect requested by {who}; replacing the session", out)

    def _on_shutdown(self, _payload, out):
        for name in sorted(self.servers):
            server = self.servers[name]
            if server.state == "stopped":
                continue
            self._withdraw(server, out)
            server.live = server.proven = server.probation = False
            server.wake_at = server.wake_token = None
            out.append(("disconnect", name))
            self._enter(server, "stopped", "host shutting down", out)
        self._log("info", "shutdown: every server stopped")

    # ----- supervision -----

    def _prove(self, server, how, out):
        if not server.live:
            return
        if not server.proven:
            server.proven = True
            server.failures = 0
            server.window = []
            server.probation = False
            server.probe_delay = 0
            server.park_reason = None
        self._enter(server, "healthy", f"session proven by {how}", out)

    def _fail(self, server, fault, at_connect, out):
        s = server.settings
        now = self.now
        cls = F.fault_class(fault, at_connect)
        server.last_fault = F.describe(fault)
        server.last_phrase = F.phrase(fault)
        server.failures += 1
        # Only the latest `window_failures` can park the server: keep no more.
        recent = [t for t in server.window if t >= now - s["window_ms"]] + [now]
        server.window = recent[-s["window_failures"]:]
        if cls == "permanent":
            self._park(server, f"{server.last_phrase} (a permanent fault)", server.probation, out)
        elif server.probation:
            self._park(server, f"its revival attempt failed ({server.last_phrase})", True, out)
        elif len(server.window) >= s["window_failures"]:
            self._park(
                server,
                f"it failed {len(server.window)} times within {_ms_words(s['window_ms'])}"
                f" ({server.last_phrase})",
                False,
                out,
            )
        elif server.failures >= s["max_failures"]:
            self._park(
                server,
                f"it failed {server.failures} times in a row ({server.last_phrase})",
                False,
                out,
            )
        else:
            delay = self._backoff(server, cls)
            self._enter(
                server,
                "backing-off",
                f"failure {server.failures} ({server.last_fault}); next attempt in {_ms_words(delay)}",
                out,
            )
            self._arm(server, delay, out)

    def _backoff(self, server, cls):
        s = server.settings
        delay = min(s["backoff_ms"][cls], s["backoff_cap_ms"])
        for _ in range(1, min(server.failures, 64)):
            delay = min(s["backoff_cap_ms"], int(delay * s["backoff_factor"]))
        return self._jitter(server, delay)

    def _jitter(self, server, delay):
        u = naming.fnv64(f"{server.name}\0{server.failures}\0{self.now}") % 1000
        return max(1, delay - delay * server.settings["jitter_pct"] * u // 100_000)

    def _park(self, server, reason, grow, out):
        s = server.settings
        self._withdraw(server, out)
        if server.live:
            server.live = False
            out.append(("disconnect", server.name))
        server.proven = False
        server.probation = False
        if grow and server.probe_delay:
            server.probe_delay = min(s["park_probe_max_ms"], server.probe_delay * 2)
        else:
            server.probe_delay = s["park_probe_ms"]
        server.probe_delay = max(s["park_probe_ms"], min(s["park_probe_max_ms"], server.probe_delay))
        server.park_reason = reason
        delay = self._jitter(server, server.probe_delay)
        detail = f"parked: {reason}; next self-probe in {_ms_words(delay)}"
        if server.state == "parked":
            out.append(("state", server.name, "parked", detail))  # parked again: still news
        else:
            self._enter(server, "parked", detail, out)
        self._log("debug", f"server {server.name!r} parked: {reason}")
        self._arm(server, delay, out)

    def _revive(self, server, why, out):
        if server.config_error is not None:
            try:
                overrides = S.parse_overrides(server.raw_settings)
                server.settings = S.effective(self.settings, overrides)
                server.overrides = overrides
                server.config_error = None
            except S.SettingsError as e:
                server.config_error = str(e)
                self._park(server, f"its configuration is invalid ({e})", True, out)
                return
            self._attempt(server, f"{why}; configuration valid now; connecting", out)
            return
        server.probation = True
        self._attempt(server, f"{why}; one attempt on probation", out)

    def _attempt(self, server, detail, out):
        server.wake_at = server.wake_token = None
        self._enter(server, "connecting", detail, out)
        out.append(("connect", server.name))

    def _arm(self, server, delay, out):
        self.next_token = (self.next_token + 1) & _U64
        server.wake_token = self.next_token
        server.wake_at = min(_U64, self.now + delay)
        out.append(("wake", server.name, server.wake_at, server.wake_token))

    def _enter(self, server, state, detail, out):
        if server.state != state:
            server.state = state
            server.since = self.now
            out.append(("state", server.name, state, detail))

    # ----- breaker -----

    def _breaker_reset(self, server):
        server.b_open = False
        server.b_failures = 0
        server.b_probe_call = None
        server.b_probe_reconnect = False
        server.b_cooldown = server.settings["breaker_cooldown_ms"]
        server.b_until = 0
        server.b_reason = ""

    def _breaker_open(self, server, out):
        server.b_open = True
        server.b_cooldown = server.settings["breaker_cooldown_ms"]
        server.b_until = min(_U64, self.now + server.b_cooldown)
        server.b_probe_call = None
        server.b_probe_reconnect = False
        server.b_reason = f"{server.b_failures} consecutive transport failures"
        detail = f"circuit breaker open ({server.b_reason}) for {_ms_words(server.b_cooldown)}"
        self._log("debug", f"server {server.name!r}: {detail}")
        out.append(("state", server.name, server.state, detail))

    def _breaker_reopen(self, server, why, out):
        s = server.settings
        server.b_open = True
        server.b_cooldown = min(s["breaker_cooldown_max_ms"], max(s["breaker_cooldown_ms"], server.b_cooldown * 2))
        server.b_until = min(_U64, self.now + server.b_cooldown)
        server.b_probe_call = None
        server.b_probe_reconnect = False
        server.b_reason = why
        detail = f"circuit breaker open again ({why}) for {_ms_words(server.b_cooldown)}"
        self._log("debug", f"server {server.name!r}: {detail}")
        out.append(("state", server.name, server.state, detail))

    # ----- publication -----

    def _plan(self, server):
        """What the server would publish now: [[advertised, original, read_only, revision]]."""
        tools = sorted(t for t in server.tools if naming.allowed(server.include, server.exclude, t[0]))
        prefix = self.namings.get(server.name)
        # Shown names are kept only under the naming they were given by: a new naming renames.
        shown = server.published if server.named_by == prefix else None
        previous = {orig: adv for adv, orig, _ro, _rev in shown or []}
        chosen = {}
        used = set()

        def free(adv):
            return adv not in used and self.owners.get(adv, server.name) == server.name

        # Names already shown keep their names (an agent's name for a tool does not flip).
        for orig, _ro, _rev in tools:
            adv = previous.get(orig)
            if adv is not None and free(adv):
                chosen[orig] = adv
                used.add(adv)
        for orig, _ro, _rev in tools:
            if orig in chosen:
                continue
            adv = naming.advertised_name(server.name, orig, prefix)
            n = 0
            while not free(adv):
                n += 1
                adv = naming.alternative_name(server.name, orig, n, prefix)
            if n:
                self._log("warn", f"server {server.name!r}: tool {orig!r} is published as {adv!r} (name taken)")
            chosen[orig] = adv
            used.add(adv)
        return [[chosen[orig], orig, ro, rev] for orig, ro, rev in tools]

    def _publish(self, server, out):
        if not server.live:
            return
        plan = self._plan(server)
        server.named_by = self.namings.get(server.name)
        if server.published is not None and plan == server.published:
            return
        self._release(server)
        server.published = plan
        for adv, _orig, _ro, _rev in plan:
            self.owners[adv] = server.name
        out.append(("publish", server.name, [(adv, orig, ro) for adv, orig, ro, _rev in plan]))

    def _withdraw(self, server, out):
        """THE withdrawal: only a server that shows tools (even an empty set) is withdrawn."""
        if server.published is None:
            return
        self._release(server)
        server.published = None
        out.append(("withdraw", server.name))

    def _release(self, server):
        for adv, _orig, _ro, _rev in server.published or []:
            if self.owners.get(adv) == server.name:
                del self.owners[adv]

    # ----- take-over -----

    def _adopt(self, h, previous, out):
        cfg = h["config"]
        name = cfg["name"]
        now = self.now
        try:
            overrides = S.parse_overrides(cfg["settings"])
            effective = S.effective(self.settings, overrides)
            error = None
        except S.SettingsError as e:
            overrides, effective, error = {}, self.settings, str(e)
        server = Server(name, min(h["since"], now), effective)
        self.servers[name] = server
        self._apply_config(server, cfg, overrides, effective, error)
        server.failures = h["failures"]
        server.b_failures = h["breaker_failures"]
        server.tool_errors = h["tool_errors"]
        server.last_fault = h["last_fault"]
        server.last_phrase = "a failure" if h["last_fault"] else None
        if h["breaker"] != "closed":
            base = effective["breaker_cooldown_ms"]
            server.b_open = True
            server.b_reason = f"handed over by {previous}"
            if h["breaker"] == "open":
                server.b_until = h["breaker_until"] if h["breaker_until"] is not None else min(_U64, now + base)
                server.b_cooldown = min(
                    effective["breaker_cooldown_max_ms"], max(base, server.b_until - now)
                )
            else:
                server.b_until = now
                server.b_cooldown = base
        session = h["session"]
        planned = h["next_attempt_at"]
        if session is not None:
            # Kept as it is (never reconnected), even with settings it refuses: those are logged.
            if error is not None:
                server.config_error = None
                self._log("error", f"server {name!r}: {error}; running on the global settings")
            server.live = True
            server.proven = bool(session["proven"])
            server.info = session["info"]
            server.tools = _tools(session["tools"])
            server.state = "healthy" if server.proven else "connected"
            if server.proven:
                server.failures = 0
            self._publish(server, out)
        elif error is not None:
            self._park(server, f"its configuration is invalid ({error})", False, out)
        elif h["connecting"]:
            server.state = "connecting"  # its outcome arrives as an event
        elif h["state"] == "stopped":
            server.state = "stopped"
        elif h["state"] == "parked":
            server.state = "parked"
            server.park_reason = f"parked by {previous}"
            server.probe_delay = effective["park_probe_ms"]
            delay = effective["park_probe_ms"] if planned is None else max(0, planned - now)
            self._arm(server, delay, out)
        else:
            server.state = "backing-off"
            if planned is not None and planned > now:
                self._arm(server, planned - now, out)
            else:
                self._attempt(server, f"taken over from {previous}; attempting now", out)

    # ----- words -----

    def _parked_words(self, server):
        wait = max(0, (server.wake_at or self.now) - self.now)
        reason = server.park_reason or "it kept failing"
        if server.config_error is not None:
            reason = "its configuration is invalid"
        return (
            f'Server "{server.name}" is unavailable: {_model_reason(reason)}; the call was not sent. '
            f"It is tried again in about {_secs(wait)} s; an operator can reconnect it now."
        )

    def _breaker_words(self, server, now):
        wait = max(0, server.b_until - now)
        return (
            f'Server "{server.name}" is failing (circuit open: {server.b_reason}); '
            f"the call was not sent. Retry in about {_secs(wait)} s."
        )

    def _log(self, level, message):
        self.logs.append((level, message))


def _model_reason(reason):
    # Park reasons are built from fault phrases (never host text), except a configuration error,
    # which the caller replaces; keep them one clause.
    return reason.split(" (")[0] if reason.startswith("its configuration") else reason


_HANDLERS = {
    "server-configured": Policy._on_configured,
    "server-removed": Policy._on_removed,
    "connected": Policy._on_connected,
    "connect-failed": Policy._on_connect_failed,
    "disconnected": Policy._on_disconnected,
    "tools-changed": Policy._on_tools_changed,
    "keepalive-ok": Policy._on_keepalive_ok,
    "keepalive-failed": Policy._on_keepalive_failed,
    "call-finished": Policy._on_call_finished,
    "timer": Policy._on_timer,
    "reconnect-requested": Policy._on_reconnect,
    "shutdown": Policy._on_shutdown,
}
