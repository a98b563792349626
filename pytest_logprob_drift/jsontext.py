"""What can be told of a JSON text without parsing it: its nesting, its long integer literals.

Owns the scans the project runs over JSON bytes in C (``re`` and ``bytes.translate``), never
recursing: ``strings_cut`` (the text with every string literal taken out, so what stays is
structure and numbers), ``long_integer`` (whether an integer literal may reach 2**64),
``nested_deeper_than`` (each pass takes away the innermost bracket pairs, so a document of
depth d costs d passes over its brackets) and ``json_nesting_fault``
(where a text nests deeper than a limit, with its line and column). The store's edge
(``store.decode``) uses them to skip walking a decoded document when no bound can be
exceeded; ``prompts`` to refuse a checkpoint's tokenizer files before transformers reads
them. Knows nothing about what any document means; imports nothing of the project.
"""

from __future__ import annotations

import re

_JSON_STRING = rb'"(?:[^"\\]|\\.)*"'
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_INNERMOST = re.compile(rb"\[\]|\{\}")


def strings_cut(data: bytes) -> bytes:
    """``data`` with every JSON string literal taken out (keys and values). Without a
    backslash and with an even count of quotes, every quote opens or closes a string, so a
    split at the quotes keeps every other piece (a few times faster than the pattern, which
    the text with escapes needs)."""
    if b"\\" not in data and data.count(b'"') % 2 == 0:
        return b"".join(data.split(b'"')[::2])
    return re.sub(_JSON_STRING, b"", data)


_CLASSES = bytes(
    ord("d") if chr(b).isdigit() and b < 128 else ord(" ") if b in b"[,:- \t\r\n" else ord(".")
    for b in range(256)
)
"""JSON text as classes, for ``bytes.translate``: a digit ``d``; what may stand before an
integer literal (``[``, ``,``, ``:``, ``-``, white space) a space; anything else (a fraction's
``.``, an exponent's ``e``, a quote, a letter) ``.``."""
_INTEGER_OF_20 = b" " + b"d" * 20
"""Twenty digits where an integer literal may start: the shortest that can be 2**64 or more."""


def long_integer(data: bytes) -> bool:
    """Whether ``data`` may hold an integer literal of 2**64 or more: twenty digits in a row
    that start where an integer may (never the digits of a fraction, an exponent, or a string
    right after its quote or a letter). In C: one ``translate``, one ``find``."""
    classes = data.translate(_CLASSES)
    return classes.startswith(_INTEGER_OF_20[1:]) or _INTEGER_OF_20 in classes


def nested_deeper_than(cut: bytes, limit: int) -> bool:
    """Whether the JSON text ``cut`` (its strings cut out: ``strings_cut``) nests arrays and
    objects deeper than ``limit``; brackets left open count as nested."""
    if cut.count(b"[") + cut.count(b"{") <= limit:
        return False
    brackets = cut.translate(None, _NOT_BRACKETS)
    levels = 0
    while brackets:
        inner = _INNERMOST.sub(b"", brackets)
        if len(inner) == len(brackets):  # unbalanced: count what stays open as nested
            levels += inner.count(b"[") + inner.count(b"{")
            break
        levels += 1
        brackets = inner
        if levels > limit:
            break
    return levels > limit


def json_nesting_fault(data: bytes, limit: int) -> str | None:
    """Where the JSON text ``data`` nests arrays and objects deeper than ``limit`` (None when
    it does not), as ``line L, column C``. Counts brackets outside strings, without parsing (nor
    recursing), so a real tokenizer.json of tens of MiB costs a few passes."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return None
    if not nested_deeper_than(strings_cut(data), limit):
        return None
    depth = 0
    for match in re.finditer(_JSON_STRING + rb"|[\[\]{}]", data):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > limit:
                at = match.start()
                line = data.count(b"\n", 0, at) + 1
                column = at - data.rfind(b"\n", 0, at)
                return f"nested deeper than {limit} levels (line {line}, column {column})"
        elif token in (b"]", b"}"):
            depth -= 1
    return f"nested deeper than {limit} levels"
