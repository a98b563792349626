"""How a runtime states what it will do with each knob (stage 2): one table keyed by knob path.

Owns ``applied`` and ``unsupported`` (a ``Materialized`` of each kind), ``Evidence`` (what a
runtime does with one value of one knob), the builders a runtime's table is written with
(``always``, ``per_value``, ``only``) and ``materialized`` (a knob looked up in a table; one the
table does not hold is unsupported, with the runtime's reason). A runtime's table is its one
statement of which knobs it applies and how; adding a knob to a runtime adds a row. Knows
nothing about engines, torch or any runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pytest_logprob_drift.execute.protocol import Materialized
from pytest_logprob_drift.records import ApplicationStatus, KnobValue

Evidence = Callable[[str, KnobValue], Materialized]
"""What a runtime does with ``value`` of the knob ``path``."""


def applied(value: KnobValue, evidence: str) -> Materialized:
    return Materialized(value=value, status=ApplicationStatus.APPLIED, evidence=evidence)


def unsupported(path: str, value: KnobValue, why: str) -> Materialized:
    return Materialized(
        value=None, status=ApplicationStatus.UNSUPPORTED, evidence=f"{path}={value!r}: {why}"
    )


def always(evidence: str) -> Evidence:
    """Every value applied, the same way."""
    return lambda _path, value: applied(value, evidence)


def per_value(evidence: Mapping[str, str], *, otherwise: str) -> Evidence:
    """Every value applied; how depends on the value (``otherwise`` for the rest)."""
    return lambda _path, value: applied(value, evidence.get(str(value), otherwise))


def only(value: KnobValue, evidence: str, *, why: str) -> Evidence:
    """The one value the runtime has (applied); any other is unsupported, for ``why``."""

    def state(path: str, requested: KnobValue) -> Materialized:
        if requested == value:
            return applied(requested, evidence)
        return unsupported(path, requested, why)

    return state


def materialized(
    table: Mapping[str, Evidence], path: str, value: KnobValue, *, missing: str
) -> Materialized:
    """``value`` of ``path`` as ``table`` states it; unsupported for ``missing`` when the table
    has no row for the knob."""
    state = table.get(path)
    return unsupported(path, value, missing) if state is None else state(path, value)
