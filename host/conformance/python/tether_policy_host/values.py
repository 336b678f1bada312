"""The JSON encoding of WIT values (docs/CONFORMANCE.md), type-directed.

A *schema* describes one WIT type. The loader builds schemas from the component's own function
types; the unit tests build them by hand. Two conversions use them:

- ``to_wasm(schema, value)``: a JSON value (as ``json.loads`` gives it) to the Python value
  wasmtime-py lowers: records as objects with the WIT field names as attributes, variants as
  ``Variant(tag, payload)`` when wasmtime-py calls the variant *tagged*, else the bare payload
  (``None`` for a case without one), enums as their case name, ``list<u8>`` as ``bytes``.
- ``from_wasm(schema, value)``: back, to a JSON value whose dicts hold the fields in WIT order.

wasmtime-py (50.x) represents a variant, option or result *untagged* (the payload alone) when
the Python classes of its cases do not overlap (``result<_, string>``: ``None`` or a ``str``;
``option<u64>``: ``None`` or an ``int``), and as ``wasmtime.component.Variant`` otherwise
(``fault``, ``action``, ...). ``tagged()`` below computes the same rule, so that this module
works without wasmtime (the loader checks it against wasmtime-py's own answer).

Nothing here imports wasmtime unless it is installed; without it, stand-ins with the same
shape are used (enough for the unit tests).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

try:  # pragma: no cover - depends on the environment
    from wasmtime.component import Record, Variant  # type: ignore
except Exception:  # pragma: no cover - pure tests without wasmtime

    class Record:  # type: ignore[no-redef]
        """Stand-in for wasmtime.component.Record: a bag of attributes."""

        def __eq__(self, other: Any) -> bool:
            return isinstance(other, Record) and self.__dict__ == other.__dict__

        def __repr__(self) -> str:
            return "Record(%s)" % ", ".join("%s=%r" % kv for kv in self.__dict__.items())

    @dataclass
    class Variant:  # type: ignore[no-redef]
        """Stand-in for wasmtime.component.Variant."""

        tag: str
        payload: Optional[Any] = None


def dumps(value: Any) -> str:
    """Compact JSON as every Tether host writes it: no spaces, UTF-8 text, keys as given."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class EncodingError(ValueError):
    """A JSON value that does not fit the WIT type, with where it sits."""


# ---------------------------------------------------------------------------------------------
# Schemas


class Schema:
    """One WIT type."""

    def py_classes(self) -> set:
        """The Python classes wasmtime-py uses for this type (its ``add_classes``)."""
        raise NotImplementedError


_INT_RANGES = {
    "u8": (0, 2**8 - 1),
    "u16": (0, 2**16 - 1),
    "u32": (0, 2**32 - 1),
    "u64": (0, 2**64 - 1),
    "s8": (-(2**7), 2**7 - 1),
    "s16": (-(2**15), 2**15 - 1),
    "s32": (-(2**31), 2**31 - 1),
    "s64": (-(2**63), 2**63 - 1),
}


@dataclass(frozen=True)
class Prim(Schema):
    """bool, an integer type, f32/f64, char or string."""

    name: str

    def py_classes(self) -> set:
        if self.name == "bool":
            return {bool}
        if self.name in _INT_RANGES:
            return {int}
        if self.name in ("f32", "f64"):
            return {float}
        return {str}  # char, string


@dataclass(frozen=True)
class ListT(Schema):
    element: Schema

    def py_classes(self) -> set:
        return {bytes} if is_bytes(self) else {list}


@dataclass(frozen=True)
class TupleT(Schema):
    elements: Tuple[Schema, ...]

    def py_classes(self) -> set:
        return {tuple}


@dataclass(frozen=True)
class RecordT(Schema):
    fields: Tuple[Tuple[str, Schema], ...]

    def py_classes(self) -> set:
        return {Record}


@dataclass(frozen=True)
class EnumT(Schema):
    names: Tuple[str, ...]

    def py_classes(self) -> set:
        return {str}


@dataclass(frozen=True)
class FlagsT(Schema):
    names: Tuple[str, ...]

    def py_classes(self) -> set:
        return {set}


@dataclass(frozen=True)
class VariantT(Schema):
    """A variant, option or result: ``kind`` is "variant", "option" or "result"."""

    kind: str
    cases: Tuple[Tuple[str, Optional[Schema]], ...]
    tagged: bool = field(default=False, compare=False)

    def py_classes(self) -> set:
        if self.tagged:
            return {Variant}
        out: set = set()
        for _, ty in self.cases:
            out |= {object} if ty is None else ty.py_classes()
        return out

    def case(self, tag: str) -> Tuple[bool, Optional[Schema]]:
        for name, ty in self.cases:
            if name == tag:
                return True, ty
        return False, None


def tagged(cases: Sequence[Tuple[str, Optional[Schema]]]) -> bool:
    """wasmtime-py's rule: tagged when two cases' Python classes overlap."""
    seen: set = set()
    for _, ty in cases:
        case = {object} if ty is None else ty.py_classes()
        if case & seen:
            return True
        seen |= case
    return False


def variant(cases: Sequence[Tuple[str, Optional[Schema]]]) -> VariantT:
    cases = tuple(cases)
    return VariantT("variant", cases, tagged(cases))


def option(payload: Schema) -> VariantT:
    cases = (("none", None), ("some", payload))
    return VariantT("option", cases, tagged(cases))


def result(ok: Optional[Schema], err: Optional[Schema]) -> VariantT:
    cases = (("ok", ok), ("err", err))
    return VariantT("result", cases, tagged(cases))


def record(fields: Sequence[Tuple[str, Schema]]) -> RecordT:
    return RecordT(tuple(fields))


def enum(names: Sequence[str]) -> EnumT:
    return EnumT(tuple(names))


def list_of(element: Schema) -> ListT:
    return ListT(element)


def is_bytes(schema: Schema) -> bool:
    return isinstance(schema, ListT) and isinstance(schema.element, Prim) and schema.element.name == "u8"


BOOL, U8, U16, U32, U64 = Prim("bool"), Prim("u8"), Prim("u16"), Prim("u32"), Prim("u64")
S8, S16, S32, S64 = Prim("s8"), Prim("s16"), Prim("s32"), Prim("s64")
F32, F64, CHAR, STRING = Prim("f32"), Prim("f64"), Prim("char"), Prim("string")


# ---------------------------------------------------------------------------------------------
# JSON -> wasmtime-py


def _where(path: str) -> str:
    return path or "the value"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _fail(path: str, want: str, value: Any) -> EncodingError:
    text = dumps(value) if isinstance(value, (dict, list, str, int, float, bool, type(None))) else repr(value)
    if len(text) > 120:
        text = text[:117] + "..."
    return EncodingError("%s: expected %s, got %s %s" % (_where(path), want, _kind(value), text))


def _check_utf8(path: str, value: str) -> None:
    """A WIT string is Unicode scalar values: a lone surrogate (which ``json.loads`` accepts from
    ``"\\ud800"``) cannot be handed to the policy."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise EncodingError(
            "%s: a string that cannot be encoded as UTF-8 (a lone surrogate U+%04X at character %d)"
            % (_where(path), ord(value[e.start]), e.start)
        ) from None


def to_wasm(schema: Schema, value: Any, path: str = "") -> Any:
    """A JSON value (``json.loads`` output) as the Python value wasmtime-py lowers to ``schema``."""
    if isinstance(schema, Prim):
        name = schema.name
        if name == "bool":
            if not isinstance(value, bool):
                raise _fail(path, "true or false", value)
            return value
        if name in _INT_RANGES:
            lo, hi = _INT_RANGES[name]
            if isinstance(value, bool) or not isinstance(value, int):
                raise _fail(path, "an integer (%s)" % name, value)
            if not lo <= value <= hi:
                raise _fail(path, "an integer in %s's range" % name, value)
            return value
        if name in ("f32", "f64"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _fail(path, "a number", value)
            return float(value)
        if name == "char":
            if not isinstance(value, str) or len(value) != 1:
                raise _fail(path, "a one-character string", value)
            _check_utf8(path, value)
            return value
        if not isinstance(value, str):
            raise _fail(path, "a string", value)
        _check_utf8(path, value)
        return value
    if isinstance(schema, ListT):
        if is_bytes(schema):
            if isinstance(value, (bytes, bytearray)):  # from Python, already decoded
                return bytes(value)
            if not isinstance(value, str):
                raise _fail(path, "a base64 string", value)
            try:
                return base64.b64decode(value.encode("ascii"), validate=True)
            except (binascii.Error, UnicodeEncodeError, ValueError):
                raise _fail(path, "a base64 string (standard alphabet, padded)", value) from None
        if not isinstance(value, list):
            raise _fail(path, "an array", value)
        return [to_wasm(schema.element, item, "%s[%d]" % (path, i)) for i, item in enumerate(value)]
    if isinstance(schema, RecordT):
        if not isinstance(value, dict):
            raise _fail(path, "an object", value)
        names = [name for name, _ in schema.fields]
        extra = [key for key in value if key not in names]
        if extra:
            raise EncodingError("%s: unknown field %s (fields: %s)" % (_where(path), dumps(extra[0]), ", ".join(names)))
        out = Record()
        for name, ty in schema.fields:
            if name not in value:
                raise EncodingError("%s: missing field %s" % (_where(path), dumps(name)))
            setattr(out, name, to_wasm(ty, value[name], "%s.%s" % (path, name) if path else name))
        return out
    if isinstance(schema, EnumT):
        if not isinstance(value, str) or value not in schema.names:
            raise _fail(path, "one of %s" % ", ".join(schema.names), value)
        return value
    if isinstance(schema, FlagsT):
        if not isinstance(value, list) or any(not isinstance(v, str) or v not in schema.names for v in value):
            raise _fail(path, "an array of flags among %s" % ", ".join(schema.names), value)
        return set(value)
    if isinstance(schema, TupleT):
        if not isinstance(value, list) or len(value) != len(schema.elements):
            raise _fail(path, "an array of %d" % len(schema.elements), value)
        return tuple(to_wasm(ty, v, "%s[%d]" % (path, i)) for i, (ty, v) in enumerate(zip(schema.elements, value)))
    if isinstance(schema, VariantT):
        if schema.kind == "option":
            payload_ty = schema.cases[1][1]
            assert payload_ty is not None
            if value is None:
                return Variant("none") if schema.tagged else None
            payload = to_wasm(payload_ty, value, path)
            return Variant("some", payload) if schema.tagged else payload
        if not isinstance(value, dict) or not isinstance(value.get("tag"), str):
            raise _fail(path, 'an object {"tag": ..., "val": ...}', value)
        extra = [key for key in value if key not in ("tag", "val")]
        if extra:
            raise EncodingError("%s: unknown key %s next to tag and val" % (_where(path), dumps(extra[0])))
        tag = value["tag"]
        found, ty = schema.case(tag)
        if not found:
            raise _fail(path + ".tag" if path else "tag", "one of %s" % ", ".join(n for n, _ in schema.cases), tag)
        if ty is None:
            if value.get("val") is not None:
                raise EncodingError("%s: case %s has no payload" % (_where(path), tag))
            return Variant(tag) if schema.tagged else None
        if "val" not in value:
            raise EncodingError("%s: case %s needs a val" % (_where(path), tag))
        payload = to_wasm(ty, value["val"], "%s.val" % path if path else "val")
        return Variant(tag, payload) if schema.tagged else payload
    raise EncodingError("%s: unsupported type %r" % (_where(path), schema))


# ---------------------------------------------------------------------------------------------
# wasmtime-py -> JSON


def _untagged_case(schema: VariantT, value: Any) -> Tuple[str, Optional[Schema]]:
    """The case of an untagged value, as wasmtime-py itself decides it when lowering."""
    for name, ty in schema.cases:
        if ty is None:
            if value is None:
                return name, None
            continue
        if isinstance(value, tuple(ty.py_classes())):
            return name, ty
    raise EncodingError("value %r fits no case of %r" % (value, schema))


def from_wasm(schema: Schema, value: Any) -> Any:
    """A value wasmtime-py lifted from ``schema``, as JSON (dicts in WIT field order)."""
    if isinstance(schema, Prim):
        if schema.name in _INT_RANGES:
            return int(value)
        return value
    if isinstance(schema, ListT):
        if is_bytes(schema):
            return base64.b64encode(bytes(value)).decode("ascii")
        return [from_wasm(schema.element, item) for item in value]
    if isinstance(schema, RecordT):
        return {name: from_wasm(ty, getattr(value, name)) for name, ty in schema.fields}
    if isinstance(schema, EnumT):
        return value
    if isinstance(schema, FlagsT):
        return [name for name in schema.names if name in value]
    if isinstance(schema, TupleT):
        return [from_wasm(ty, v) for ty, v in zip(schema.elements, value)]
    if isinstance(schema, VariantT):
        if schema.tagged:
            tag, payload = value.tag, value.payload
            found, ty = schema.case(tag)
            if not found:
                raise EncodingError("unknown case %r of %r" % (tag, schema))
        else:
            tag, ty = _untagged_case(schema, value)
            payload = value
        if schema.kind == "option":
            return None if ty is None else from_wasm(ty, payload)
        if ty is None:
            return {"tag": tag}
        return {"tag": tag, "val": from_wasm(ty, payload)}
    raise EncodingError("unsupported type %r" % (schema,))


def normalize(schema: Schema, value: Any, path: str = "") -> Any:
    """A JSON value checked against ``schema`` and re-encoded canonically (WIT field order)."""
    return from_wasm(schema, to_wasm(schema, value, path))
