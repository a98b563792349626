"""comparison.json's record of a judged case, as both writers build it.

Owns assembling the ``Comparison`` of a case judged by a verdict: its statistics and the
writer's entries as typed diagnostics, each installed diagnostic's sealed part
(``diagnostics.registry``: each from the case's ``(training, rollout, active)`` scores, the
very tensors token_diffs.pt seals, and its own capture), the knob records and the numeric
re-check. Used by ``execute.case`` (an executed case) and
``production.importer`` (an imported step); names no diagnostic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import torch

from pytest_logprob_drift.diagnostics.registry import diagnostics_type, installed
from pytest_logprob_drift.numerics.comparison import (
    Comparison,
    Contract,
    KnobRecord,
    NumericCheck,
    WorstToken,
    from_builtins,
)
from pytest_logprob_drift.numerics.verdict import Verdict
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.records import JsonValue, ResolvedContract

SCORED_OUTCOMES = (Outcome.PASS, Outcome.MISMATCH)
"""The outcomes whose comparison carries the figures of its scores."""


def comparison_of(
    verdict: Verdict,
    *,
    case_id: str,
    label: str,
    contract: ResolvedContract,
    scores: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    captured: Mapping[str, object] | None = None,
    entries: Mapping[str, JsonValue] | None = None,
    records: Sequence[KnobRecord] = (),
    numerical: NumericCheck | None,
) -> Comparison:
    """comparison.json's record of a case judged by ``verdict``: its statistics and the
    optional ``entries`` as typed diagnostics, each installed diagnostic's part (from the
    scores and its own ``captured``, by name), the knob ``records`` and the numeric
    re-check."""
    diagnostics = from_builtins({**verdict.diagnostics, **(entries or {})}, diagnostics_type())
    captures = captured or {}
    parts: dict[str, Any] = {
        member: part
        for d in installed()
        for member, part in d.seal(verdict.outcome, scores, captures.get(d.name)).items()
    }
    if parts:
        diagnostics = msgspec.structs.replace(diagnostics, **parts)
    return Comparison(
        case_id=case_id,
        label=label,
        contract=Contract.of(contract),
        outcome=verdict.outcome,
        reason=verdict.reason,
        threshold=verdict.threshold,
        active_tokens=verdict.active_tokens,
        mismatches=verdict.mismatches,
        diagnostics=diagnostics,
        worst_tokens=tuple(WorstToken(**w) for w in verdict.worst_tokens),
        identity_violations=verdict.identity_violations,
        records=tuple(records),
        numerical=numerical,
        nonfinite_tokens=verdict.nonfinite_tokens,
    )
