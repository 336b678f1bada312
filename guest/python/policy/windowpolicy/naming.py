"""Advertised tool (and prompt) names and include/exclude globs.

Names follow Tether's convention, `<server>__<tool>` sanitised to `[A-Za-z0-9_-]` and clamped to
64 characters with a stable hash suffix, so that a swap between this policy and the default one
does not rename any tool an agent sees. An operator's prefix (contract 0.2.1 `set-naming`)
replaces `<server>__`: `""` gives the server's own names, `"x-"` gives `x-<tool>`, sanitised and
clamped alike. Collisions (two tools, of one server or of two, mapping to one name) are resolved
by giving the newcomer a hashed alternative, never by hiding a tool.
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


def _text(server, tool, prefix):
    """What a name is made of: the operator's prefix, or by default `<server>__`, and the name."""
    return f"{server}__{tool}" if prefix is None else prefix + tool


def advertised_name(server, tool, prefix=None):
    """The name agents see for `tool` of `server` (the default policy's, for the same input),
    under the operator's `prefix` (None: the default naming)."""
    full = sanitize(_text(server, tool, prefix))
    if 1 <= len(full) <= MAX_LEN:
        return full
    # Too long, or empty (prefix "" and a name ""): the hash makes it a usable name. It hashes
    # the server and the tool, never the prefix: the server already tells two servers apart.
    suffix = _fold32(fnv64(f"{server}\0{tool}"))
    return f"{full[:MAX_LEN - _HASH_HEX - 1]}_{suffix:08x}"


def alternative_name(server, tool, n, prefix=None):
    """The `n`th (1, 2, ...) alternative for a name that is taken: the sanitised name, clamped,
    with `_` and 8 hex digits of a hash of the unsanitised names and `n`."""
    full = sanitize(_text(server, tool, prefix))
    suffix = _fold32(fnv64(f"{server}\0{tool}\0{n}"))
    return f"{full[:MAX_LEN - _HASH_HEX - 1]}_{suffix:08x}"


def valid_name(name):
    return 1 <= len(name) <= MAX_LEN and _DISALLOWED.search(name) is None


# ----- globs -----

_GLOBS = {}


def _tokens(pattern):
    """A glob as tokens: ("*",), ("?",), ("=", ch) a literal, ("[", negated, ranges) a class."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            while i < len(pattern) and pattern[i] == "*":
                i += 1
            out.append(("*",))
            continue
        if c == "?":
            out.append(("?",))
        elif c == "[":
            parsed = _class_at(pattern, i)
            if parsed is None:
                out.append(("=", c))
            else:
                negated, items, end = parsed
                out.append(("[", negated, tuple((lo, hi) for lo, hi in items if lo <= hi)))
                i = end
                continue
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(("=", pattern[i]))
        else:
            out.append(("=", c))
        i += 1
    return out


def _compiled(pattern):
    tokens = _GLOBS.get(pattern)
    if tokens is None:
        if len(_GLOBS) > 4096:
            _GLOBS.clear()
        tokens = _GLOBS[pattern] = _tokens(pattern)
    return tokens


def _one(token, ch):
    kind = token[0]
    if kind == "?":
        return True
    if kind == "=":
        return token[1] == ch
    inside = any(lo <= ch <= hi for lo, hi in token[2])
    return inside != token[1]


def glob_match(pattern, text):
    """Shell-style match of the whole `text`: `*` any run, `?` one character, `[abc]`, `[a-z]`,
    `[!abc]` a class, `\\x` a literal x. A `[` without its `]` is literal. No braces.

    No regular expression and no recursion: the classic wildcard matcher, which returns to the
    latest `*` only, so it takes at most len(pattern) * len(text) steps (a backtracking regex
    can take exponential time on patterns like `*a*a*a*b`)."""
    tokens = _compiled(pattern)
    t = p = 0
    star = -1  # the token index after the latest `*`
    mark = 0  # where in `text` that `*` stopped matching
    while t < len(text):
        if p < len(tokens) and tokens[p][0] == "*":
            star, mark = p + 1, t
            p += 1
        elif p < len(tokens) and _one(tokens[p], text[t]):
            p += 1
            t += 1
        elif star >= 0:
            mark += 1  # the `*` takes one more character
            t, p = mark, star
        else:
            return False
    while p < len(tokens) and tokens[p][0] == "*":
        p += 1
    return p == len(tokens)


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
