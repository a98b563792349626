"""The importance-sampling figures of a sealed attempt: recomputed, checked, or supplied.

Owns computing ``diagnostics.importance_sampling`` from the tensors of ``token_diffs.pt``
(``numerics.importance_sampling``, a pure function of them) as the typed part comparison.json
records, and deciding whether a recorded part agrees with that recomputation: a part that
differs, or one recorded for an outcome without scores, is refused. Attempts sealed before the
part existed get it computed here at read time, never by executing anything again. Called
through the diagnostic (``diagnostic``) by the writers (``comparison_record``) and by
``check.resume`` (so resume, ``verify`` and the report all apply the check). Never writes
anything; knows nothing about engines or how the figures are shown.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
import torch

from pytest_logprob_drift.comparison_record import SCORED_OUTCOMES
from pytest_logprob_drift.numerics.comparison import (
    Comparison,
    ImportanceSamplingFigures,
    from_builtins,
)
from pytest_logprob_drift.numerics.importance_sampling import importance_sampling
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.seal import SealError


def figures(
    training: torch.Tensor, rollout: torch.Tensor, active: torch.Tensor
) -> ImportanceSamplingFigures:
    """The typed part from the verdict's three tensors (moved to the CPU first, so the figures
    sealed at execution are those ``verify`` recomputes from token_diffs.pt). Raises
    ``ValueError`` for inputs a verdict would not judge."""
    computed = importance_sampling(training.cpu(), rollout.cpu(), active.cpu())
    return from_builtins(computed.to_json(), ImportanceSamplingFigures)


def figures_of_diffs(diffs: Mapping[str, torch.Tensor]) -> ImportanceSamplingFigures:
    """The part from ``token_diffs.pt``'s tensors; a SealError on token_diffs.pt when they
    cannot give one."""
    try:
        return figures(diffs["training_logprobs"], diffs["rollout_logprobs"], diffs["active_mask"])
    except (KeyError, ValueError) as exc:
        raise SealError(layout.TOKEN_DIFFS, f"importance-sampling figures: {exc}") from None


def check_importance_sampling(
    comparison: Comparison, diffs: Mapping[str, torch.Tensor]
) -> ImportanceSamplingFigures | None:
    """The attempt's figures: the recorded part when it equals the one recomputed from
    ``diffs``, that recomputation when none is recorded (sealed before the part existed), None
    for an outcome without scores. A SealError on comparison.json for a recorded part that
    differs or that its outcome should not have."""
    recorded = comparison.diagnostics.importance_sampling
    if comparison.outcome not in SCORED_OUTCOMES:
        if recorded is not None:
            raise SealError(
                layout.COMPARISON,
                f"records importance-sampling figures for outcome {comparison.outcome.value}",
            )
        return None
    recomputed = figures_of_diffs(diffs)
    if recorded is not None and recorded != recomputed:
        field = next(
            (
                name
                for name in recomputed.__struct_fields__
                if getattr(recorded, name) != getattr(recomputed, name)
            ),
            "importance_sampling",
        )
        raise SealError(
            layout.COMPARISON,
            f"diagnostics.importance_sampling.{field} differs from the figures recomputed "
            "offline from token_diffs.pt",
        )
    return recomputed


def with_figures(comparison: Comparison, part: ImportanceSamplingFigures | None) -> Comparison:
    """``comparison`` with ``part`` as its importance-sampling figures (the recorded part
    stays; one computed at read time fills a comparison sealed without it)."""
    if part is None or comparison.diagnostics.importance_sampling is not None:
        return comparison
    diagnostics = msgspec.structs.replace(comparison.diagnostics, importance_sampling=part)
    return msgspec.structs.replace(comparison, diagnostics=diagnostics)
