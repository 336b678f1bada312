"""Advertised tool names and include/exclude globs.

Names follow Tether's convention, `<server>__<tool>` sanitised to `[A-Za-z0-9_-]` and clamped to
64 characters with a stable hash suffix, so that a swap between this policy and the default one
does not rename any tool an agent sees. Collisions (two tools, of one server or of two, mapping
to one name) are resolved by giving the newcomer a hashed alternative, never by hiding a tool.
"""

import re

MAX_LEN = 64
_HASH_HEX = 8

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK64 = 0xFFFFFFFFFFFFFFFF


def fnv64(data):
    """FNV-1a 64 of `data` (bytes or str, UTF-8): stable everywhere, unlike `hash()`."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    h = _FNV_OFFSET
    for byte in data:
        h ^= byte
        h = (h * _FNV_PRIME) & _MASK64
    return h


def _fold32(h):
    return (h >> 32) ^ (h & 0xFFFFFFFF)


_DISALLOWED = re.compile(r"[^A-Za-z0-9_-]")


def sanitize(text):
    """Every character outside `[A-Za-z0-9_-]` becomes `_` (one per character)."""
    return _DISALLOWED.sub("_", text)


def advertised_name(server, tool):
    """The name agents see for `tool` of `server` (the default policy's, for the same input)."""
    full = sanitize(f"{server}__{tool}")
    if len(full) <= MAX_LEN:
        return full
    suffix = _fold32(fnv64(f"{server}\0{tool}"))
    return f"{full[:MAX_LEN - _HASH_HEX - 1]}_{suffix:08x}"


def alternative_name(server, tool, n):
    """The `n`th (1, 2, ...) alternative for a name that is taken: the sanitised name, clamped,
    with `_` and 8 hex digits of a hash of the unsanitised names and `n`."""
    full = sanitize(f"{server}__{tool}")
    suffix = _fold32(fnv64(f"{server}\0{tool}\0{n}"))
    return f"{full[:MAX_LEN - _HASH_HEX - 1]}_{suffix:08x}"


def valid_name(name):
    return 1 <= len(name) <= MAX_LEN and _DISALLOWED.search(name) is None


# ----- globs -----

_GLOBS = {}


def _translate(pattern):
    """A glob as an anchored regular expression (see `glob_match`)."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            while i < len(pattern) and pattern[i] == "*":
                i += 1
            out.append(".*")
            continue
        if c == "?":
            out.append(".")
        elif c == "[":
            parsed = _class_at(pattern, i)
            if parsed is None:
                out.append(re.escape(c))
            else:
                negated, items, end = parsed
                body = "".join(
                    re.escape(lo) if lo == hi else f"{re.escape(lo)}-{re.escape(hi)}"
                    for lo, hi in items
                    if lo <= hi
                )
                if not body:
                    out.append("." if negated else "(?!)")
                else:
                    out.append(f"[{'^' if negated else ''}{body}]")
                i = end
                continue
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _compiled(pattern):
    regex = _GLOBS.get(pattern)
    if regex is None:
        if len(_GLOBS) > 4096:
            _GLOBS.clear()
        regex = _GLOBS[pattern] = re.compile(_translate(pattern), re.DOTALL)
    return regex


def glob_match(pattern, text):
    """Shell-style match of the whole `text`: `*` any run, `?` one character, `[abc]`, `[a-z]`,
    `[!abc]` a class, `\\x` a literal x. A `[` without its `]` is literal."""
    return _compiled(pattern).fullmatch(text) is not None


def _class_at(pattern, i):
    """Parses a `[...]` class at `pattern[i]`; returns (negated, items, end) or None."""
    j = i + 1
    negated = j < len(pattern) and pattern[j] in "!^"
    if negated:
        j += 1
    items = []
    first = True
    while j < len(pattern):
        c = pattern[j]
        if c == "]" and not first:
            return negated, items, j + 1
        first = False
        if j + 2 < len(pattern) and pattern[j + 1] == "-" and pattern[j + 2] != "]":
            items.append((c, pattern[j + 2]))
            j += 3
        else:
            items.append((c, c))
            j += 1
    return None


def allowed(include, exclude, tool):
    """Include (when non-empty) must match and exclude must not: exclude wins."""
    if include and not any(glob_match(p, tool) for p in include):
        return False
    return not any(glob_match(p, tool) for p in exclude)
