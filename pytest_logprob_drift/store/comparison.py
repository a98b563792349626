"""Decoding an attempt's ``comparison.json`` into its record, or refusing the attempt.

Owns the one entry from sealed comparison bytes to ``numerics.comparison.Comparison``:
``store.decode`` decodes them once into the record, and a type, shape or syntax error becomes
the attempt's ``SealError`` on ``comparison.json``, naming the JSON path at fault (or the byte
offset of a syntax error). A member of ``diagnostics`` that today's release does not declare is
the part of an installed diagnostic, decoded strictly by its type as a member of the type the
registry assembles (``diagnostics.registry.diagnostics_type``), or one sealed by a diagnostic
not installed here, refused as such (never as tampered). Used where an attempt is checked
(``check.resume``) and by the readers that open an attempt's comparison themselves
(attribution, the report). Knows nothing about what the numbers mean or how they were
computed.
"""

from __future__ import annotations

from typing import Any

import msgspec

from pytest_logprob_drift.diagnostics.registry import by_name, diagnostics_type
from pytest_logprob_drift.numerics.comparison import (
    Comparison,
    Diagnostics,
    from_builtins,
)
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.decode import JSONDocumentError, decode, decode_any
from pytest_logprob_drift.store.seal import SealError

_UNKNOWN_DIAGNOSTIC = "$.diagnostics: Object contains unknown field"
_DECLARED = frozenset(Diagnostics.__struct_fields__)


def parse_comparison(data: bytes) -> Comparison:
    """``data`` (comparison.json's sealed bytes) as its record; a SealError on
    ``comparison.json`` naming the JSON path and what is wrong there otherwise."""
    try:
        comparison = decode(data, Comparison)
    except JSONDocumentError as exc:
        if not str(exc).startswith(_UNKNOWN_DIAGNOSTIC):
            raise SealError(layout.COMPARISON, str(exc)) from None
        return _with_installed_members(data)
    return comparison


def _with_installed_members(data: bytes) -> Comparison:
    """The record of a comparison whose ``diagnostics`` holds members it does not declare:
    each the part of an installed diagnostic, decoded by that diagnostic's type into the
    registry's assembled ``diagnostics`` type."""
    try:
        document = decode_any(data)
    except JSONDocumentError as exc:
        raise SealError(layout.COMPARISON, str(exc)) from None
    members = document["diagnostics"]
    parts: dict[str, Any] = {}  # members of the assembled type, each typed there
    for name in [key for key in members if key not in _DECLARED]:
        diagnostic = by_name(name)
        if diagnostic is None:
            raise SealError(
                layout.COMPARISON,
                f"$.diagnostics.{name}: sealed by diagnostic {name}, not installed here",
            )
        try:
            parts[name] = from_builtins(members.pop(name), diagnostic.part_type)
        except ValueError as exc:
            raise SealError(
                layout.COMPARISON, f"$.diagnostics.{name}{str(exc).removeprefix('$')}"
            ) from None
    try:
        comparison = decode(msgspec.json.encode(document), Comparison)
    except JSONDocumentError as exc:
        raise SealError(layout.COMPARISON, str(exc)) from None
    declared = msgspec.structs.asdict(comparison.diagnostics)
    diagnostics = diagnostics_type()(**declared, **parts)
    return msgspec.structs.replace(comparison, diagnostics=diagnostics)
