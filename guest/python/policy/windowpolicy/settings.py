"""Settings: defaults, parsing of a JSON object over them, validation.

Every error names the key. Unknown keys are refused, at every level. Per-server overrides (the
`settings` of a server's configuration) take the same keys and are merged over the global
settings (`backoff_ms` key by key).
"""

import json

# Fault classes that back off (the permanent class parks at once; see faults.py).
BACKOFF_CLASSES = ("expired", "transport", "crash", "handshake")

# The longest hold the host accepts (contract 0.2).
MAX_HOLD_MS = 60_000

# Times beyond this are nonsense (and would not fit the host's u64 arithmetic with margin).
MAX_MS = 10 ** 12

DEFAULTS = {
    # Park when this many failures happen within `window_ms` without a proven session...
    "window_ms": 120_000,
    "window_failures": 4,
    # ...or after this many consecutive failures without a proven session, however slow.
    "max_failures": 8,
    # First backoff per fault class; grows by `backoff_factor` per consecutive failure.
    "backoff_ms": {
        "expired": 100,
        "transport": 500,
        "crash": 1_000,
        "handshake": 4_000,
    },
    "backoff_factor": 2,
    "backoff_cap_ms": 60_000,
    # Each delay is shortened by up to this share, derived from the server name and attempt
    # (deterministic: the same inputs give the same delays).
    "jitter_pct": 20,
    # Self-probe of a parked server: first delay, doubled per failed probe up to the max.
    "park_probe_ms": 60_000,
    "park_probe_max_ms": 900_000,
    # Consecutive transport failures/timeouts of calls that open the breaker.
    "breaker_threshold": 5,
    # How long it stays open; doubled per failed half-open probe up to the max.
    "breaker_cooldown_ms": 30_000,
    "breaker_cooldown_max_ms": 300_000,
    # How long a call may wait for a session on its way (0: never hold, refuse at once).
    "hold_ms": 3_000,
}

# key -> (minimum, maximum) for integer settings.
_INT_RANGES = {
    "window_ms": (1, MAX_MS),
    "window_failures": (1, 1_000),
    "max_failures": (1, 1_000),
    "backoff_cap_ms": (1, MAX_MS),
    "jitter_pct": (0, 90),
    "park_probe_ms": (1, MAX_MS),
    "park_probe_max_ms": (1, MAX_MS),
    "breaker_threshold": (1, 1_000),
    "breaker_cooldown_ms": (1, MAX_MS),
    "breaker_cooldown_max_ms": (1, MAX_MS),
    "hold_ms": (0, MAX_HOLD_MS),
}


class SettingsError(ValueError):
    """Settings that cannot be used; the message names the key."""


def _known(keys):
    return ", ".join(sorted(keys))


# The deepest nesting of arrays and objects accepted in JSON input (settings, snapshots): deeper
# input is refused before `json.loads`, whose recursion would otherwise exhaust the stack.
MAX_DEPTH = 32


def check_depth(text, what="settings"):
    """Refuses JSON text nested deeper than MAX_DEPTH (one linear scan; strings skipped)."""
    depth = 0
    in_string = escaped = False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise SettingsError(f"{what}: JSON nested deeper than {MAX_DEPTH} levels")
        elif c in "]}":
            depth -= 1


def parse_object(text):
    """The JSON object in `text` as a dict (empty or blank text: an empty dict)."""
    if text is None or not text.strip():
        return {}
    check_depth(text)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise SettingsError(f"settings are not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise SettingsError("settings must be a JSON object")
    return value


def _int(key, value):
    low, high = _INT_RANGES[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingsError(f"setting `{key}` must be an integer, got {json.dumps(value)}")
    if not low <= value <= high:
        raise SettingsError(f"setting `{key}` must be between {low} and {high}, got {value}")
    return value


def _apply(base, overrides, where):
    """`base` (a full, valid settings dict) with `overrides` merged over it; not validated."""
    out = dict(base)
    out["backoff_ms"] = dict(base["backoff_ms"])
    for key, value in overrides.items():
        if key in _INT_RANGES:
            out[key] = _int(key, value)
        elif key == "backoff_factor":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SettingsError(
                    f"setting `backoff_factor` must be a number, got {json.dumps(value)}"
                )
            if not 1 <= value <= 10:
                raise SettingsError(
                    f"setting `backoff_factor` must be between 1 and 10, got {value}"
                )
            out[key] = value
        elif key == "backoff_ms":
            if not isinstance(value, dict):
                raise SettingsError(
                    "setting `backoff_ms` must be an object of fault class -> milliseconds "
                    f"(classes: {_known(BACKOFF_CLASSES)})"
                )
            for cls, ms in value.items():
                if cls not in BACKOFF_CLASSES:
                    raise SettingsError(
                        f"unknown fault class `backoff_ms.{cls}`{where} "
                        f"(known: {_known(BACKOFF_CLASSES)})"
                    )
                if isinstance(ms, bool) or not isinstance(ms, int) or not 1 <= ms <= MAX_MS:
                    raise SettingsError(
                        f"setting `backoff_ms.{cls}` must be an integer between 1 and {MAX_MS}, "
                        f"got {json.dumps(ms)}"
                    )
                out["backoff_ms"][cls] = ms
        else:
            raise SettingsError(f"unknown setting `{key}`{where} (known: {_known(DEFAULTS)})")
    return out


def validate(s):
    """Checks a complete settings dict (also one read back from a snapshot)."""
    if not isinstance(s, dict) or sorted(s) != sorted(DEFAULTS):
        raise SettingsError("settings do not have the expected keys")
    for key in _INT_RANGES:
        _int(key, s[key])
    factor = s["backoff_factor"]
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 1 <= factor <= 10:
        raise SettingsError("setting `backoff_factor` must be a number between 1 and 10")
    backoff = s["backoff_ms"]
    if not isinstance(backoff, dict) or sorted(backoff) != sorted(BACKOFF_CLASSES):
        raise SettingsError("setting `backoff_ms` must name every fault class")
    for cls in BACKOFF_CLASSES:
        ms = backoff[cls]
        if isinstance(ms, bool) or not isinstance(ms, int) or not 1 <= ms <= MAX_MS:
            raise SettingsError(f"setting `backoff_ms.{cls}` must be an integer >= 1")
    for low, high in (
        ("park_probe_ms", "park_probe_max_ms"),
        ("breaker_cooldown_ms", "breaker_cooldown_max_ms"),
    ):
        if s[high] < s[low]:
            raise SettingsError(f"setting `{high}` ({s[high]}) must not be below `{low}` ({s[low]})")
    if s["window_failures"] > s["max_failures"]:
        raise SettingsError(
            f"setting `window_failures` ({s['window_failures']}) must not exceed "
            f"`max_failures` ({s['max_failures']})"
        )
    return s


def defaults():
    return _apply(DEFAULTS, {}, "")


def from_json(text):
    """Global settings: the JSON object `text` over the defaults, validated."""
    return validate(_apply(DEFAULTS, parse_object(text), ""))


def parse_overrides(text):
    """A server's overrides (its configuration's `settings`) as a dict, keys checked."""
    overrides = parse_object(text)
    # Checks keys and value types against the defaults; the merge is validated later.
    _apply(DEFAULTS, overrides, " in the server's settings")
    return overrides


def effective(global_settings, overrides):
    """A server's settings: its overrides over the global settings, validated."""
    return validate(_apply(global_settings, overrides, " in the server's settings"))
