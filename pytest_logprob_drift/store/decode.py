"""The store's edge: every sealed JSON document decoded, once, into its library type.

Owns ``decode``, the one way bytes of a stored JSON file become a typed value: msgspec decodes
them in C into frozen ``msgspec.Struct`` types declared with ``forbid_unknown_fields=True``
(wrong types and unknown keys are refused with the JSON path: ``Expected `float`, got `str` -
at `$.diagnostics.ess```), then this module enforces, in one place, what msgspec does not:
nesting at most ``MAX_JSON_NESTING`` levels and integers within 64 bits (msgspec accepts any
integer). Finite numbers, UTF-8 and Unicode strings (no lone surrogate) msgspec enforces
itself; its messages for a syntax error, NaN, a lone surrogate or bytes that are not UTF-8
carry a byte offset and no path, so such a failure is explained again here (slowly: only on
failure) with the byte offset and, for a lone surrogate, the JSON path.

``Document`` is the base of the sealed documents' types (``store.documents`` declares those of
an attempt and a run; ``numerics.comparison`` and ``attribution.document`` theirs). Knows nothing
about what any document means. Writers are not here: the store writes with
``store.files.json_bytes``.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

import msgspec

from pytest_logprob_drift.errors import json_member
from pytest_logprob_drift.jsontext import nested_deeper_than, strings_cut

T = TypeVar("T")

MAX_JSON_NESTING = 64
"""Deepest nesting of arrays and objects a stored JSON file may have (the store writes at most
8; configs are held to the same 64)."""
MAX_JSON_INT = 2**64
"""Integers a stored JSON file may hold are within this magnitude (ids, counts, seeds)."""


class Document(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A sealed JSON object: frozen, every member declared (an unknown key is refused)."""


class Open(msgspec.Struct, frozen=True, kw_only=True):
    """A sealed JSON object whose members beyond the declared ones are kept out of the type
    (an engine's evidence, a runtime's self-description: read by nobody field by field)."""


class JSONDocumentError(ValueError):
    """Bytes that are not a document of the expected type (the reason, with the JSON path or
    the byte offset)."""


def decode(data: bytes | str, kind: type[T]) -> T:
    """``data`` decoded into ``kind``: ``JSONDocumentError`` naming the JSON path of a value
    of the wrong type, an unknown or missing member, an integer beyond 64 bits, nesting deeper
    than ``MAX_JSON_NESTING``; or the byte offset of a syntax error (NaN and Infinity are
    syntax errors), bytes that are not UTF-8, a lone surrogate (with its path)."""
    try:
        value = msgspec.json.decode(data, type=kind)
    except msgspec.ValidationError as exc:
        raise JSONDocumentError(_validation_message(str(exc))) from None
    except msgspec.DecodeError as exc:
        raise JSONDocumentError(_syntax_problem(data, str(exc))) from None
    except RecursionError:
        raise JSONDocumentError(f"nested deeper than {MAX_JSON_NESTING} levels") from None
    problem = _bounds_problem(value, data)
    if problem is not None:
        raise JSONDocumentError(problem)
    return value


def decode_any(data: bytes | str) -> Any:
    """A JSON value of any shape, with the same bounds as ``decode`` (for a document whose
    type is not known yet, or that is compared whole)."""
    return decode(data, Any)


def _validation_message(text: str) -> str:
    """msgspec's message with its path in the project's form: ``$.a.b: Expected ...`` (a
    path a ``__post_init__`` reported below its struct, `` - at `$.c``, joined to the
    struct's)."""
    message, marker, path = text.rpartition(" - at `")
    if not marker:
        return f"$: {text}"
    path = path.rstrip("`")
    inner, marker, below = message.rpartition(" - at `$")
    if marker:  # a __post_init__ that decoded a member itself: the member's path below its struct
        message, path = inner, path + below.rstrip("`")
    return f"{path}: {message}"


_LEAVES = (str, float, bool, type(None))
_CLASSES = bytes(
    ord("d") if chr(b).isdigit() and b < 128 else ord(" ") if b in b"[,:- \t\r\n" else ord(".")
    for b in range(256)
)
"""JSON text as classes, for ``bytes.translate``: a digit ``d``; what may stand before an
integer literal (``[``, ``,``, ``:``, ``-``, white space) a space; anything else (a fraction's
``.``, an exponent's ``e``, a quote, a letter) ``.``."""
_INTEGER_OF_20 = b" " + b"d" * 20
"""Twenty digits where an integer literal may start: the shortest that can be 2**64 or more."""


def _long_integer(data: bytes) -> bool:
    """Whether ``data`` may hold an integer literal of 2**64 or more: twenty digits in a row
    that start where an integer may (never the digits of a fraction, an exponent, or a string
    right after its quote or a letter). In C: one ``translate``, one ``find``."""
    classes = data.translate(_CLASSES)
    return classes.startswith(_INTEGER_OF_20[1:]) or _INTEGER_OF_20 in classes


def _bounds_problem(root: Any, data: bytes | str) -> str | None:
    """The first integer beyond 64 bits or the first nesting deeper than MAX_JSON_NESTING in a
    decoded value. The bytes tell first, in C (``jsontext``): without twenty digits in a row
    outside strings no integer can be out of range, and the bracket passes tell the depth; only
    when either bound may be exceeded is the value walked (containers only: structs by their
    fields, arrays of numbers at C speed), to name the path at fault."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if not _long_integer(raw) and raw.count(b"[") + raw.count(b"{") <= MAX_JSON_NESTING:
        return None  # no literal long enough, too few brackets: no bound can be exceeded
    cut = strings_cut(raw)  # what stays is structure and numbers
    check_ints = _long_integer(cut)
    if not check_ints and not nested_deeper_than(cut, MAX_JSON_NESTING):
        return None  # nothing to walk
    # (value, depth, index of the parent entry, key in the parent)
    entries: list[tuple[Any, int, int, str | int | None]] = [(root, 0, -1, None)]
    stack = [0]
    while stack:
        at = stack.pop()
        value, depth, _, _ = entries[at]
        if type(value) is int:
            if not -MAX_JSON_INT < value < MAX_JSON_INT:
                where = _path(entries, at)
                return f"{where}: integer {str(value)[:40]} is out of range (at most 2**64)"
            continue
        if depth >= MAX_JSON_NESTING:
            return f"{_path(entries, at)}: nested deeper than {MAX_JSON_NESTING} levels"
        if isinstance(value, msgspec.Struct):
            children: Any = zip(
                value.__struct_encode_fields__,
                (getattr(value, name) for name in value.__struct_fields__),
                strict=True,
            )
        elif isinstance(value, dict):
            children = value.items()
        elif isinstance(value, (list, tuple)):
            index = _numbers_problem(value) if check_ints else _plain_array(value)
            if index is None:
                continue
            if index >= 0:
                return f"{_path(entries, at)}[{index}]: integer out of range (at most 2**64)"
            children = enumerate(value)
        else:
            continue
        for key, child in children:
            if isinstance(child, _LEAVES) or (type(child) is int and not check_ints):
                continue
            entries.append((child, depth + 1, at, key))
            stack.append(len(entries) - 1)
    return None


def _plain_array(value: list[Any] | tuple[Any, ...]) -> int | None:
    """None when no item of ``value`` is an array, object or struct (nothing to walk), else -1."""
    for item in value:
        if not isinstance(item, _LEAVES) and type(item) is not int:
            return -1
    return None


def _path(entries: list[tuple[Any, int, int, str | int | None]], at: int) -> str:
    """The JSON path of entry ``at``, built from its parents."""
    keys: list[str | int] = []
    while at > 0:
        _, _, parent, key = entries[at]
        assert key is not None
        keys.append(key)
        at = parent
    path = "$"
    for key in reversed(keys):
        path = f"{path}[{key}]" if isinstance(key, int) else json_member(path, key)
    return path


def _numbers_problem(value: list[Any] | tuple[Any, ...]) -> int | None:
    """For an array of numbers: None when every integer is within range, else the index of
    the first that is not. -1 when the array holds something else (walk it item by item)."""
    try:
        low, high = min(value), max(value)
    except (TypeError, ValueError):  # mixed kinds (no order between them), or empty
        return None if not value else -1
    if not isinstance(low, (int, float)) or isinstance(low, bool) or isinstance(high, bool):
        return -1
    if -MAX_JSON_INT < low and high < MAX_JSON_INT:
        if type(low) is int and type(high) is int:
            return None
        # a float bound hides the range of the integers among them
    for index, item in enumerate(value):
        if type(item) is int and not -MAX_JSON_INT < item < MAX_JSON_INT:
            return index
        if type(item) not in (int, float):
            return -1
    return None


def _refused_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _syntax_problem(data: bytes | str, refused: str) -> str:
    """Why msgspec refused ``data`` as JSON, with the byte offset (and, for a lone surrogate,
    the JSON path): the standard library reads it again to say so (only on failure)."""
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
    path = _surrogate_path(document)
    if path is not None:
        return f"{path}: a string holds a lone surrogate (not Unicode)"
    return "invalid JSON"  # pragma: no cover - msgspec and json disagree on nothing else known


def _surrogate_path(root: Any) -> str | None:
    """The JSON path of the first string or key holding a lone surrogate."""
    stack: list[tuple[Any, str]] = [(root, "$")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if not _is_unicode(value):
                return path
        elif isinstance(value, dict):
            for key, child in value.items():
                member = json_member(path, key) if _is_unicode(key) else f"{path}.<key>"
                if not _is_unicode(key):
                    return member
                stack.append((child, member))
        elif isinstance(value, list):
            stack.extend((child, f"{path}[{index}]") for index, child in enumerate(value))
    return None


def _is_unicode(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
