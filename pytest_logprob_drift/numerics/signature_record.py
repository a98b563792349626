"""The sealed form of a drift signature: its closed set of ids and scopes and its record.

comparison.json's ``diagnostics.signatures`` is a list of ``SealedSignature`` (the step and
sample scope ones of that step or case); the run scope ones are never sealed (computed at read
time from the sealed figures, ``numerics.signatures.run_signatures``). A signature is a
diagnostic: it never changes a verdict. Torch-free; knows nothing about how one is detected.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, TypeAlias

import msgspec


class SignatureId(StrEnum):
    """The causes a drift's logged numbers alone can name (docs/PRODUCTION_RUNS.md)."""

    ZERO_FILLED = "zero_filled"
    TEMPERED = "tempered"
    TRUNCATED_SAMPLING = "truncated_sampling"
    SHIFTED = "shifted"
    STEP_JUMP = "step_jump"
    STEP_TREND = "step_trend"
    SAMPLE_OUTLIERS = "sample_outliers"
    POSITION_GROWTH = "position_growth"


class Scope(StrEnum):
    """What a signature is about: the whole run, one step (or executed case), one sample."""

    RUN = "run"
    STEP = "step"
    SAMPLE = "sample"


Evidence: TypeAlias = dict[str, int | float | tuple[int, ...]]
"""What triggered a signature: named figures and the rows or positions they come from."""


class SealedSignature(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, omit_defaults=True
):
    """One signature of a step or case: its id, scope (``step`` or ``sample``), the sample
    (the row of the step's token grid; None for step scope) and its evidence."""

    id: SignatureId
    scope: Scope
    sample: Annotated[int, msgspec.Meta(ge=0)] | None = None
    evidence: Evidence = msgspec.field(default_factory=dict)
