"""What a policy's answers may be (Tether's ``host/src/policy/outputs.rs``): the host checks
every answer before acting on it, and refuses as invalid output what no correct policy produces.
The messages are worded as Tether's, so that failures read the same in every host."""

from __future__ import annotations

import re
import unicodedata
from typing import Any, Callable, List, Optional

#: The longest message for the model a policy may produce (bytes of UTF-8).
MAX_MESSAGE = 4096
#: The longest a policy may hold a call.
MAX_HOLD_MS = 60_000

#: Unicode's White_Space, which Rust's ``str::trim`` trims (Python's ``isspace`` has more).
_WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
_USABLE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def valid_tool_name(name: Any) -> bool:
    return isinstance(name, str) and _USABLE_NAME.fullmatch(name) is not None


def truncate(text: str) -> str:
    """The first 80 characters, as Tether's messages quote names."""
    return text[:80]


def rust_debug(text: str) -> str:
    """``text`` as Rust's ``{:?}`` prints a string (quotes, escapes of unprintable characters)."""
    out = ['"']
    for ch in text:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\0":
            out.append("\\0")
        elif ch != " " and unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"):
            out.append("\\u{%x}" % ord(ch))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _rust_trim_empty(message: str) -> bool:
    """Whether Rust's ``str::trim`` leaves nothing (it trims Unicode White_Space)."""
    return message.strip(_WHITE_SPACE) == ""


def check_admission(admission: Any) -> Optional[str]:
    """Why an admission is invalid output, or None."""
    if not isinstance(admission, dict):
        return None
    tag, val = admission.get("tag"), admission.get("val")
    if tag == "hold" and isinstance(val, dict):
        wait = val.get("wait-ms")
        if isinstance(wait, int) and wait > MAX_HOLD_MS:
            return "held a call for %d ms (limit %d)" % (wait, MAX_HOLD_MS)
        message = val.get("message")
    elif tag in ("reject", "reconnect"):
        message = val
    else:
        return None
    if not isinstance(message, str) or _rust_trim_empty(message):
        return "a refusal without a message for the model"
    size = len(message.encode("utf-8", "surrogatepass"))
    if size > MAX_MESSAGE:
        return "a refusal message of %d bytes (limit %d)" % (size, MAX_MESSAGE)
    return None


def check_actions(actions: List[Any], is_configured: Callable[[str], bool]) -> Optional[str]:
    """Why an action list is invalid output (an action about a server the host never
    configured, a tool name agents could not use or could confuse), or None."""
    for action in actions:
        tag = action.get("tag") if isinstance(action, dict) else None
        val = action.get("val") if isinstance(action, dict) else None
        if tag in ("connect", "disconnect", "withdraw-tools"):
            server = val
        elif tag == "publish-tools":
            names = set()
            for tool in val.get("tools", []):
                advertised, original = tool.get("advertised", ""), tool.get("original", "")
                if not valid_tool_name(advertised):
                    return "published an unusable tool name %s" % rust_debug(truncate(advertised))
                if original == "":
                    return "published %s without its original name" % advertised
                if advertised in names:
                    return "published %s twice" % advertised
                names.add(advertised)
            server = val.get("server")
        elif isinstance(val, dict):  # wake-at, state-changed
            server = val.get("server")
        else:
            continue
        if not isinstance(server, str) or not is_configured(server):
            return "acted on a server the host never configured: %s" % rust_debug(truncate(str(server)))
    return None


def check_take_over(actions: List[Any], is_configured: Callable[[str], bool],
                    is_live: Callable[[str], bool]) -> Optional[str]:
    """As ``check_actions``, and refuses a ``connect`` or ``disconnect`` of a server whose session
    (or attempt) the handover said is live: such a policy would wait for an event that never comes."""
    for action in actions:
        if isinstance(action, dict) and action.get("tag") in ("connect", "disconnect"):
            server = action.get("val")
            if isinstance(server, str) and is_live(server):
                return ("asked to connect or disconnect %s, whose session (or attempt) the host keeps"
                        % rust_debug(server))
    return check_actions(actions, is_configured)


def check_prompt_names(originals: List[str], named: List[Any]) -> Optional[str]:
    """Why ``name-prompts``'s answer (contract 0.2.1) is invalid output, or None: an unusable
    advertised name, an original it was not asked about or named twice, or two prompts under
    one name (agents could not tell them apart)."""
    asked = set(originals)
    advertised: set = set()
    seen: set = set()
    for prompt in named:
        name, original = prompt.get("advertised", ""), prompt.get("original", "")
        if not valid_tool_name(name):
            return "named a prompt with an unusable name %s" % rust_debug(truncate(name))
        if original not in asked:
            return "named a prompt it was not asked about: %s" % rust_debug(truncate(original))
        if original in seen:
            return "named prompt %s twice" % rust_debug(truncate(original))
        seen.add(original)
        if name in advertised:
            return "gave two prompts the name %s" % name
        advertised.add(name)
    return None
