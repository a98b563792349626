"""The store's edge: every sealed JSON document decoded, once, into its library type.

msgspec decodes in C into frozen Structs declared with ``forbid_unknown_fields=True``; the
types carry their own bounds (``Annotated[int, Meta(ge=0)]``), so wrong types, unknown keys
and out-of-bound values are refused with the JSON path. This module adds what no type can
say: nesting at most ``MAX_JSON_NESTING`` levels and every integer within 64 bits (msgspec
takes any integer for ``int`` and ``Any``: checked on the plain JSON only when the bytes show
a long literal or many brackets), and where bytes that are not JSON go wrong. ``Document`` is
the base of the sealed documents' types; writers are not here.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

import msgspec

from pytest_logprob_drift.errors import json_member
from pytest_logprob_drift.jsontext import long_integer, nested_deeper_than, strings_cut

T = TypeVar("T")

MAX_JSON_NESTING = 64  # deepest nesting of arrays and objects (the store writes at most 8)
MAX_JSON_INT = 2**64  # integers (ids, counts, seeds) are within this magnitude
_SURROGATE = re.compile("[\ud800-\udfff]")  # in a string that is not Unicode


class Document(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A sealed JSON object: frozen, every member declared (an unknown key is refused)."""


class JSONDocumentError(ValueError):
    """Bytes that are not a document of the expected type (with the JSON path or offset)."""


def decode(data: bytes | str, kind: type[T]) -> T:
    """``data`` decoded into ``kind``, or ``JSONDocumentError`` with the JSON path at fault (or
    the byte offset of a syntax error: NaN and Infinity are syntax errors)."""
    try:
        value = msgspec.json.decode(data, type=kind)
    except msgspec.ValidationError as exc:
        message, marker, path = str(exc).rpartition(" - at `")
        if not marker:
            raise JSONDocumentError(f"$: {exc}") from None
        inner, marker, below = message.rpartition(" - at `$")  # a __post_init__'s own path
        if marker:
            message, path = inner, path.rstrip("`") + below
        raise JSONDocumentError(f"{path.rstrip('`')}: {message}") from None
    except msgspec.DecodeError as exc:
        raise JSONDocumentError(_syntax_problem(data, str(exc))) from None
    except RecursionError:
        raise JSONDocumentError(f"nested deeper than {MAX_JSON_NESTING} levels") from None
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if long_integer(raw) or raw.count(b"[") + raw.count(b"{") > MAX_JSON_NESTING:
        cut = strings_cut(raw)  # the bytes tell, in C, whether a bound may be exceeded
        if long_integer(cut) or nested_deeper_than(cut, MAX_JSON_NESTING):
            problem = _fault(msgspec.json.decode(raw), "$", 0)
            if problem is not None:
                raise JSONDocumentError(problem)
    return value


def decode_any(data: bytes | str) -> Any:
    """A JSON value of any shape, with the same bounds as ``decode``."""
    return decode(data, Any)


def _fault(value: object, path: str, depth: int) -> str | None:
    """The first integer beyond 64 bits, lone surrogate (a string that is not Unicode) or
    container nested too deep in a plain JSON value, with its path."""
    if isinstance(value, str) and _SURROGATE.search(value):
        return f"{path}: a string holds a lone surrogate (not Unicode)"
    if not isinstance(value, (dict, list)):
        return None
    if depth >= MAX_JSON_NESTING:
        return f"{path}: nested deeper than {MAX_JSON_NESTING} levels"
    items: Any = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in items:
        if isinstance(key, str) and _SURROGATE.search(key):
            return f"{path}.<key>: a string holds a lone surrogate (not Unicode)"
        if type(child) is int and not -MAX_JSON_INT < child < MAX_JSON_INT:
            if isinstance(key, int):
                return f"{path}[{key}]: integer out of range (at most 2**64)"
            where = json_member(path, key)
            return f"{where}: integer {str(child)[:40]} is out of range (at most 2**64)"
        if isinstance(child, (dict, list, str)):
            where = f"{path}[{key}]" if isinstance(key, int) else json_member(path, key)
            problem = _fault(child, where, depth + 1)
            if problem is not None:
                return problem
    return None


def _refused_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _syntax_problem(data: bytes | str, refused: str) -> str:
    """Why msgspec refused ``data`` as JSON, with the byte offset or (a lone surrogate) the
    path: the standard library reads it again to say so (only on failure)."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 ({exc.reason} at byte {exc.start})"
    try:
        document = json.loads(text, parse_constant=_refused_constant)
    except json.JSONDecodeError as exc:
        offset = len(text[: exc.pos].encode("utf-8", "surrogatepass"))
        return f"invalid JSON at byte {offset} (line {exc.lineno} column {exc.colno}): {exc.msg}"
    except RecursionError:
        return f"nested deeper than {MAX_JSON_NESTING} levels"
    except ValueError as exc:  # NaN/Infinity, or an integer literal of more than 4300 digits
        at = re.search(r"\(byte \d+\)", refused)
        return f"invalid JSON{' at ' + at.group()[1:-1] if at else ''}: {exc}"
    return _fault(document, "$", 0) or "invalid JSON"  # the path of a lone surrogate
