"""Loading a policy component with wasmtime-py and calling it with JSON-encoded values.

- ``PolicyComponent(path)`` compiles a component once and links its imports: WASI 0.2 with an
  empty context (no preopens, no environment, no arguments, no stdin, no network; what the
  guest writes to stdout/stderr goes to the log) and ``tether:policy/log`` (the policy's
  diagnostics, handed to a Python callable).
- ``component.instantiate()`` gives a ``PolicyInstance`` in a store of its own, with a fuel
  budget per call and a memory cap; its methods take and return the JSON encoding of
  ``docs/CONFORMANCE.md`` (as Python values: dicts, lists, ints, strings).
- ``PolicyHost(path)`` is both at once, for a program that needs one instance.

Every value crossing the boundary is converted *type-directed*, from the component's own
function types (``values.py``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import tempfile
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import wasmtime
from wasmtime import component as wc

from . import values as v

#: The interface a policy exports and the one it imports, without their versions.
POLICY_INTERFACE = "tether:policy/policy"
LOG_INTERFACE = "tether:policy/log"
#: The contract minor this host speaks: any 0.2.x component.
CONTRACT = (0, 2)
#: The functions every 0.2 component exports.
FUNCTIONS = ("info", "init", "set-settings", "handle", "admit", "status", "snapshot", "restore", "take-over")
#: What contract 0.2.1 adds (the operator's naming); a 0.2.0 component lacks them.
NAMING_FUNCTIONS = ("set-naming", "name-prompts")

# Resource limits, as Tether's host sets them (host/src/policy/instance.rs, `Limits`): a base
# per call, plus an allowance per byte of tool data the instance holds or is being handed.
#: Fuel (roughly wasm instructions) per call into the policy: an endless loop runs out of it.
DEFAULT_FUEL_PER_CALL = 2_000_000_000
#: Fuel on top, per byte of tool data.
DEFAULT_FUEL_PER_DATA_BYTE = 384
#: Linear memory cap of an instance that holds no tool data.
DEFAULT_MEMORY_BYTES = 32 << 20
#: Linear memory on top, per byte of tool data.
DEFAULT_MEMORY_PER_DATA_BYTE = 16
#: Most actions accepted from one `handle` or `take-over`.
DEFAULT_MAX_ACTIONS = 10_000
#: What a tool weighs beyond its name (records, map entries, its advertised name).
TOOL_OVERHEAD = 256
_WASM32_MAX_MEMORY = 1 << 32

#: Guest output kept for a trap's message, in bytes.
_OUTPUT_KEEP = 4096

#: A function receiving the policy's log records: (level, message).
LogSink = Callable[[str, str], None]

_log = logging.getLogger("tether_policy_host.policy")
_LOG_LEVELS = {
    "trace": logging.DEBUG - 5,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}


def _default_sink(level: str, message: str) -> None:
    _log.log(_LOG_LEVELS.get(level, logging.INFO), "%s", message)


class PolicyError(Exception):
    """The policy cannot do what was asked: it trapped, ran out of fuel, or answered an error."""


#: What each fallible function is given, for a refusal's message (as Tether words it).
_REFUSED_WHAT = {
    "init": "the settings",
    "set-settings": "the settings",
    "restore": "the saved state",
    "take-over": "the handed-over state",
}


class PolicyRefused(PolicyError):
    """The policy answered ``err(reason)`` (``init``, ``set-settings``, ``restore``, ``take-over``)."""

    def __init__(self, label: str, function: str, reason: str):
        self.what = _REFUSED_WHAT.get(function, function)
        super().__init__("policy %s refused %s: %s" % (label, self.what, reason))
        self.function = function
        self.message = reason


class PolicyTrap(PolicyError):
    """The call into the policy failed: a trap, fuel exhausted, bad output. ``fault`` says which."""

    def __init__(self, label: str, function: str, fault: str):
        super().__init__("policy %s failed during %s: %s" % (label, function, fault))
        self.function = function
        self.fault = fault


class LoadError(Exception):
    """The component cannot be used: not a component, wrong contract, imports we cannot link."""


# ---------------------------------------------------------------------------------------------
# Types


def schema_of(ty: Any) -> v.Schema:
    """The ``values`` schema of a wasmtime-py component value type."""
    simple = {
        wc.Bool: v.BOOL, wc.U8: v.U8, wc.U16: v.U16, wc.U32: v.U32, wc.U64: v.U64,
        wc.S8: v.S8, wc.S16: v.S16, wc.S32: v.S32, wc.S64: v.S64,
        wc.F32: v.F32, wc.F64: v.F64, wc.Char: v.CHAR, wc.String: v.STRING,
    }
    for cls, schema in simple.items():
        if isinstance(ty, cls):
            return schema
    if isinstance(ty, wc.ListType):
        return v.ListT(schema_of(ty.element))
    if isinstance(ty, wc.RecordType):
        return v.RecordT(tuple((name, schema_of(t)) for name, t in ty.fields))
    if isinstance(ty, wc.TupleType):
        return v.TupleT(tuple(schema_of(t) for t in ty.elements))
    if isinstance(ty, wc.EnumType):
        return v.EnumT(tuple(ty.names))
    if isinstance(ty, wc.FlagsType):
        return v.FlagsT(tuple(ty.names))
    if isinstance(ty, wc.VariantType):
        cases: Tuple[Tuple[str, Optional[v.Schema]], ...] = tuple(
            (name, None if t is None else schema_of(t)) for name, t in ty.cases
        )
        kind = "variant"
    elif isinstance(ty, wc.OptionType):
        cases = (("none", None), ("some", schema_of(ty.payload)))
        kind = "option"
    elif isinstance(ty, wc.ResultType):
        ok, err = ty.ok, ty.err
        cases = (("ok", None if ok is None else schema_of(ok)), ("err", None if err is None else schema_of(err)))
        kind = "result"
    else:
        raise LoadError("unsupported WIT type in the policy interface: %r" % (ty,))
    # wasmtime-py decides how it represents the value; our rule must agree with it.
    tagged = bool(ty._tagged())
    schema = v.VariantT(kind, cases, tagged)
    if tagged != v.tagged(cases):
        raise LoadError("internal: tagged-variant rule disagrees with wasmtime-py for %r" % (schema,))
    return schema


class FuncSig:
    """One exported function: its parameter and result schemas."""

    def __init__(self, name: str, params: List[Tuple[str, v.Schema]], result: Optional[v.Schema]):
        self.name = name
        self.params = params
        self.result = result


def _version(name: str, interface: str) -> Optional[Tuple[int, ...]]:
    match = re.fullmatch(re.escape(interface) + r"@(\d+)\.(\d+)\.(\d+)(?:-[0-9A-Za-z.-]+)?", name)
    return tuple(int(x) for x in match.groups()) if match else None


# ---------------------------------------------------------------------------------------------
# The component


class PolicyComponent:
    """A compiled policy component, ready to be instantiated any number of times."""

    def __init__(
        self,
        source: Union[str, bytes, os.PathLike],
        *,
        log: Optional[LogSink] = None,
        fuel_per_call: int = DEFAULT_FUEL_PER_CALL,
        fuel_per_data_byte: int = DEFAULT_FUEL_PER_DATA_BYTE,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
        memory_per_data_byte: int = DEFAULT_MEMORY_PER_DATA_BYTE,
        max_actions: int = DEFAULT_MAX_ACTIONS,
        cache_dir: Optional[str] = None,
    ):
        self.log: LogSink = log or _default_sink
        self.fuel_per_call = fuel_per_call
        self.fuel_per_data_byte = fuel_per_data_byte
        self.memory_bytes = memory_bytes
        self.memory_per_data_byte = memory_per_data_byte
        self.max_actions = max_actions
        config = wasmtime.Config()
        config.consume_fuel = True
        self.engine = wasmtime.Engine(config)
        if isinstance(source, (bytes, bytearray)):
            self.path = "<bytes>"
            wasm = bytes(source)
        else:
            self.path = os.fspath(source)
            try:
                with open(self.path, "rb") as f:
                    wasm = f.read()
            except OSError as e:
                raise LoadError("cannot read %s: %s" % (self.path, e.strerror or e)) from None
        if not wasm.startswith(b"\0asm"):
            raise LoadError("not a WebAssembly component (no \\0asm header)")
        self.from_cache = False
        self.component = self._compile(wasm, cache_dir)
        ctype = self.component.type
        exports = list(ctype.exports(self.engine))
        imports = list(ctype.imports(self.engine))
        versions = [(_version(n, POLICY_INTERFACE), n) for n in exports]
        ours = sorted((ver, n) for ver, n in versions if ver is not None and ver[:2] == CONTRACT)
        if not ours:
            found = [n for ver, n in versions if ver is not None]
            raise LoadError(
                "the component does not export %s@%d.%d.x (it exports %s)"
                % (POLICY_INTERFACE, CONTRACT[0], CONTRACT[1], ", ".join(found or exports) or "nothing")
            )
        self.interface = ours[-1][1]
        foreign = [n for n in imports if not (n.startswith("wasi:") or n.startswith("tether:policy/"))]
        if foreign:
            raise LoadError("the component imports what a policy host does not provide: %s" % ", ".join(foreign))
        self.linker = wc.Linker(self.engine)
        try:
            self.linker.add_wasip2()
        except Exception as e:
            raise LoadError("cannot link WASI 0.2: %s" % _first_line(e)) from None
        sink = self.log

        def log_import(_store: Any, level: Any, message: Any) -> None:
            try:
                sink(str(level), str(message))
            except Exception:  # a host-side logging failure must never trap the policy
                pass

        with self.linker.root() as root:
            for name in imports:
                if _version(name, LOG_INTERFACE) is not None:
                    with root.add_instance(name) as inst:
                        inst.add_func("log", log_import)
        self._sigs: Optional[Dict[str, FuncSig]] = None
        #: Whether it exports contract 0.2.1's ``set-naming`` and ``name-prompts`` (known once
        #: an instance was made): a component of 0.2.0 does not, and is named as 0.2.0 was.
        self.naming: Optional[bool] = None

    def _compile(self, wasm: bytes, cache_dir: Optional[str]) -> Any:
        """Compiles ``wasm``, or loads the artifact an earlier run cached in ``cache_dir``."""
        cached = None
        if cache_dir:
            key = hashlib.sha256(wasm).hexdigest()
            cached = os.path.join(cache_dir, "%s-wasmtime%s-fuel.cwasm" % (key, _wasmtime_version()))
            if os.path.exists(cached):
                try:
                    component = wc.Component.deserialize_file(self.engine, cached)
                    self.from_cache = True
                    return component
                except Exception:
                    pass  # stale or foreign artifact: compile again
        try:
            component = wc.Component(self.engine, wasm)
        except Exception as e:
            raise LoadError("not a loadable WebAssembly component: %s" % _first_line(e)) from None
        if cached:
            try:
                os.makedirs(cache_dir, exist_ok=True)
                tmp = "%s.%d.tmp" % (cached, os.getpid())
                with open(tmp, "wb") as f:
                    f.write(component.serialize())
                os.replace(tmp, cached)
            except OSError:
                pass  # a cache we cannot write only costs time
        return component

    def instantiate(self) -> "PolicyInstance":
        """A fresh instance in a store of its own (not yet given ``init``)."""
        return PolicyInstance(self)

    def _signatures(self, store: Any, lookup: Callable[[str], Any]) -> Dict[str, FuncSig]:
        if self._sigs is None:
            sigs = {}
            for name in FUNCTIONS + NAMING_FUNCTIONS:
                func = lookup(name)
                if func is None:
                    if name in NAMING_FUNCTIONS:
                        continue
                    raise LoadError("%s does not export the function %s" % (self.interface, name))
                fty = func.type(store)
                params = [(pname, schema_of(t)) for pname, t in fty.params]
                res = fty.result
                sigs[name] = FuncSig(name, params, None if res is None else schema_of(res))
            # Contract 0.2.1 by its functions, as Tether's host tells it: both, or it is 0.2.0
            # (and is given neither).
            self.naming = all(name in sigs for name in NAMING_FUNCTIONS)
            if not self.naming:
                for name in NAMING_FUNCTIONS:
                    sigs.pop(name, None)
            self._sigs = sigs
        return self._sigs

    @property
    def contract(self) -> str:
        """The contract version the component speaks, by what it exports: "0.2.1" or "0.2.0"."""
        return "0.2.1" if self.naming else "0.2.0"


def _remove_files(readers: List[Any], paths: List[str]) -> None:
    for reader in readers:
        try:
            reader.close()
        except OSError:
            pass
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def _wasmtime_version() -> str:
    try:
        from importlib.metadata import version

        return version("wasmtime")
    except Exception:
        return "unknown"


def default_cache_dir() -> str:
    """Where the conformance runner caches compiled components (as the Rust host does)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tether", "policy-host-python")


def _first_line(e: BaseException) -> str:
    """A wasmtime error in one line: its cause (a trap's reason), without the wasm backtrace."""
    text = str(e).strip() or type(e).__name__
    if "Caused by:" in text:
        head, _, cause = text.partition("Caused by:")
        reasons = [line.strip() for line in cause.splitlines() if line.strip()]
        reasons = [re.sub(r"^\d+:\s*", "", r) for r in reasons]
        first = head.strip().splitlines()[0] if head.strip() else ""
        if first.startswith("error while executing at wasm backtrace"):
            first = ""
        return "; ".join(([first] if first else []) + reasons)
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


# ---------------------------------------------------------------------------------------------
# An instance


class PolicyInstance:
    """One live policy instance. Methods take and return the JSON encoding of WIT values."""

    def __init__(self, component: PolicyComponent):
        self.component = component
        self.store = wasmtime.Store(component.engine)
        # Empty WASI: no arguments, environment, preopens or network. What the guest writes to
        # stdout/stderr (a Rust panic's message) goes to the log, and into a trap's message. It
        # goes through files, not wasmtime-py's `stdout_custom` callbacks: those run on wasmtime's
        # own threads, and one that runs while Python shuts down aborts the process.
        wasi = wasmtime.WasiConfig()
        self._output = bytearray()  # since the current call started, at most _OUTPUT_KEEP bytes
        self._line = bytearray()
        self._readers: List[Any] = []
        paths = []
        for stream in ("stdout", "stderr"):
            fd, path = tempfile.mkstemp(prefix="tether-pyhost-", suffix="." + stream)
            os.close(fd)
            paths.append(path)
            setattr(wasi, stream + "_file", path)
            self._readers.append(open(path, "rb"))
        weakref.finalize(self, _remove_files, list(self._readers), paths)
        self.store.set_wasi(wasi)
        # The tool data the guest holds, per server (and what a restored snapshot carried).
        self._held: Dict[str, int] = {}
        self._restored = 0
        self._memory_cap = self._cap(0)
        self.store.set_limits(memory_size=self._memory_cap)
        self.store.set_fuel(component.fuel_per_call)
        try:
            self.instance = component.linker.instantiate(self.store, component.component)
        except Exception as e:
            raise LoadError("cannot instantiate the component: %s" % _first_line(e)) from None
        iface = self.instance.get_export_index(self.store, component.interface)
        if iface is None:
            raise LoadError("cannot find the export %s" % component.interface)
        self._funcs: Dict[str, Any] = {}

        def lookup(name: str) -> Any:
            index = self.instance.get_export_index(self.store, name, iface)
            return None if index is None else self.instance.get_func(self.store, index)

        self.sigs = component._signatures(self.store, lookup)
        for name in self.sigs:
            self._funcs[name] = lookup(name)
        self.dead: Optional[str] = None

    @property
    def label(self) -> str:
        """The component, as messages name it (its path)."""
        return self.component.path

    def _drain_output(self) -> None:
        """Takes in what the guest wrote since the last look."""
        for reader in self._readers:
            data = reader.read()
            if data:
                self._guest_output(data)

    def _guest_output(self, data: bytes) -> None:
        if len(self._output) < _OUTPUT_KEEP:
            self._output += data[: _OUTPUT_KEEP - len(self._output)]
        for byte in data:
            if byte == 0x0A:
                self.component.log("warn", "policy output: " + self._line.decode("utf-8", "replace"))
                self._line.clear()
            elif len(self._line) < _OUTPUT_KEEP:
                self._line.append(byte)

    # -- the generic call ---------------------------------------------------------------------

    def _cap(self, data: int) -> int:
        c = self.component
        return min(c.memory_bytes + data * c.memory_per_data_byte, _WASM32_MAX_MEMORY)

    def held(self) -> int:
        """Bytes of tool data the guest holds, as handed to it."""
        return sum(self._held.values(), self._restored)

    def call(self, name: str, *args: Any, incoming: int = 0) -> Any:
        """Calls the export ``name`` with JSON-encoded arguments; returns its JSON-encoded result.
        Fuel and memory are sized for the tool data held plus ``incoming`` bytes handed over."""
        sig = self.sigs[name]
        if len(args) != len(sig.params):
            raise TypeError("%s takes %d argument(s)" % (name, len(sig.params)))
        lowered = [v.to_wasm(ty, arg, pname) for (pname, ty), arg in zip(sig.params, args)]
        if self.dead is not None:
            raise PolicyTrap(self.label, name, "the instance is unusable after an earlier failure (%s)" % self.dead)
        data = self.held() + incoming
        fuel = self.component.fuel_per_call + self.component.fuel_per_data_byte * data
        cap = self._cap(data)
        if cap != self._memory_cap:
            self.store.set_limits(memory_size=cap)
            self._memory_cap = cap
        self._output.clear()
        try:
            self.store.set_fuel(fuel)
            func = self._funcs[name]
            out = func(self.store, *lowered)
            func.post_return(self.store)
        except Exception as e:
            self._drain_output()
            reason = _first_line(e)
            written = " / ".join(l.strip() for l in self._output.decode("utf-8", "replace").splitlines() if l.strip())
            if "all fuel consumed" in reason:
                fault = "ran out of fuel (%d units per call): an endless loop?" % fuel
            elif re.search(r"memory allocation of \d+ bytes failed", written):
                # wasmtime-py cannot make a refused memory.grow trap (Tether's host does): the
                # guest's allocator aborts instead, saying so (Rust's std does).
                fault = "exceeded its memory limit of %d bytes" % cap
            else:
                fault = "trapped: " + reason
                if written:
                    fault += " (the policy wrote: %s)" % (written if len(written) <= 400 else written[:397] + "...")
            self.dead = "%s %s" % (name, fault)
            raise PolicyTrap(self.label, name, fault) from None
        self._drain_output()
        return None if sig.result is None else v.from_wasm(sig.result, out)

    def normalize(self, name: str, *args: Any) -> List[Any]:
        """The arguments of ``name``, checked and re-encoded canonically (WIT field order)."""
        sig = self.sigs[name]
        return [v.normalize(ty, arg, pname) for (pname, ty), arg in zip(sig.params, args)]

    def _ok(self, name: str, answer: Any) -> Any:
        if not isinstance(answer, dict) or answer.get("tag") not in ("ok", "err"):
            raise PolicyTrap(self.label, name, "returned invalid output: %r" % (answer,))
        if answer["tag"] == "err":
            raise PolicyRefused(self.label, name, answer.get("val"))
        return answer.get("val")

    # -- the policy interface -----------------------------------------------------------------

    def info(self) -> Dict[str, str]:
        """``{"name": ..., "version": ...}``."""
        return self.call("info")

    def init(self, settings: Union[str, Dict[str, Any]] = "{}") -> "PolicyInstance":
        """Starts the policy with settings (a JSON object, as text or as a dict); returns self."""
        self._ok("init", self.call("init", _settings_text(settings)))
        self._held, self._restored = {}, 0  # init forgets all state
        return self

    def set_settings(self, settings: Union[str, Dict[str, Any]]) -> None:
        self._ok("set-settings", self.call("set-settings", _settings_text(settings)))

    def handle(self, event: Union[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
        """Feeds one event ``{"now": ..., "kind": {...}}``; returns the actions."""
        event = _json(event)
        handed = _handed_over(event)
        actions = self.call("handle", event, incoming=handed[1] if handed else 0)
        if handed:
            self._held[handed[0]] = handed[1]
        elif isinstance(event, dict) and event.get("kind", {}).get("tag") == "server-removed":
            self._held.pop(event["kind"].get("val"), None)
        return self._limited("handle", actions, "for one event")

    def admit(self, request: Union[str, Dict[str, Any]]) -> Dict[str, Any]:
        """Asks about one call ``{"now", "call-id", "server", "tool"}``; returns the admission."""
        return self.call("admit", _json(request))

    def status(self, now: int) -> List[Dict[str, Any]]:
        return self.call("status", now)

    def snapshot(self) -> bytes:
        return base64.b64decode(self.call("snapshot"))

    def restore(self, snapshot: Union[bytes, str]) -> None:
        """Restores a snapshot: the bytes ``snapshot`` returned (or them in base64)."""
        if not isinstance(snapshot, (bytes, bytearray)):
            (pname, ty), = self.sigs["restore"].params
            snapshot = v.to_wasm(ty, snapshot, pname)  # decoded once, here
        size = len(snapshot)
        self._ok("restore", self.call("restore", snapshot, incoming=size))
        self._held, self._restored = {}, size

    @property
    def naming(self) -> bool:
        """Whether the policy takes the operator's naming (contract 0.2.1: ``set-naming``,
        ``name-prompts``); a 0.2.0 component does not."""
        return bool(self.component.naming)

    def _naming_only(self, name: str) -> None:
        if not self.naming:
            raise PolicyError("policy %s has no %s (contract 0.2.0)" % (self.label, name))

    def set_naming(self, naming: Union[str, Dict[str, Any]]) -> None:
        """The operator's naming of one server, ``{"server": ..., "prefix": ... or None}``
        (contract 0.2.1; ``PolicyError`` for a 0.2.0 component)."""
        self._naming_only("set-naming")
        self.call("set-naming", _json(naming))

    def name_prompts(self, server: str, originals: List[str]) -> List[Dict[str, str]]:
        """The names agents see for a server's prompts, ``[{"advertised", "original"}]``
        (contract 0.2.1; ``PolicyError`` for a 0.2.0 component). Not checked here: see
        ``outputs.check_prompt_names``."""
        self._naming_only("name-prompts")
        originals = list(originals)
        weight = sum(TOOL_OVERHEAD + json_len(o) for o in originals if isinstance(o, str))
        return self.call("name-prompts", server, originals, incoming=weight)

    def take_over(self, handover: Union[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
        """Adopts another implementation's state; returns the actions."""
        handover = _json(handover)
        held = {}
        for server in handover.get("servers", []) if isinstance(handover, dict) else []:
            session = server.get("session") if isinstance(server, dict) else None
            if isinstance(session, dict):
                held[server["config"]["name"]] = tool_data(session.get("tools", []))
        actions = self._ok("take-over", self.call("take-over", handover, incoming=sum(held.values())))
        self._held, self._restored = held, 0
        return self._limited("take-over", actions, "for a handover")

    def _limited(self, name: str, actions: List[Any], what: str) -> List[Any]:
        if len(actions) > self.component.max_actions:
            self.dead = "%s returned too many actions" % name
            raise PolicyTrap(self.label, name, "returned invalid output: returned %d actions %s (limit %d)"
                             % (len(actions), what, self.component.max_actions))
        return actions


def _json(value: Union[str, bytes, Any]) -> Any:
    return json.loads(value) if isinstance(value, (str, bytes, bytearray)) else value


def _settings_text(settings: Union[str, Dict[str, Any]]) -> str:
    return settings if isinstance(settings, str) else v.dumps(settings)


def json_len(text: str) -> int:
    """The length of ``text`` as a JSON string's contents, in bytes (as snapshots carry it)."""
    extra = 0
    for ch in text:
        if ch in '"\\\n\r\t\b\f':
            extra += 1
        elif ch < " ":
            extra += 5
    return len(text.encode("utf-8")) + extra


def tool_data(tools: List[Any]) -> int:
    """The weight of a tool list: each name as escaped in JSON plus TOOL_OVERHEAD per tool."""
    return sum(TOOL_OVERHEAD + json_len(t.get("name", "")) for t in tools if isinstance(t, dict))


def _handed_over(event: Any) -> Optional[Tuple[str, int]]:
    """The server and the bytes of tool data an event hands the policy, if it hands any."""
    kind = event.get("kind") if isinstance(event, dict) else None
    val = kind.get("val") if isinstance(kind, dict) else None
    if not isinstance(val, dict):
        return None
    server = val.get("server", "")
    if kind.get("tag") == "connected":
        return server, tool_data(val.get("tools", [])) + len(server.encode()) + len(val.get("server-info", "").encode())
    if kind.get("tag") == "tools-changed":
        return server, tool_data(val.get("tools", [])) + len(server.encode())
    return None


class PolicyHost(PolicyInstance):
    """One instance of the component at ``path``: ``PolicyHost(path).init("{}")``, then
    ``handle``/``admit``/``status``/``snapshot``/``restore``/``take_over``."""

    def __init__(self, path: Union[str, bytes, os.PathLike], **options: Any):
        super().__init__(PolicyComponent(path, **options))
