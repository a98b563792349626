"""The path-split diagnostic's attribution contribution: which path of the rollout a knob moved.

Owns the attribution document's optional per-comparison ``path`` (when both the case and its
reference sealed a prefill replay, opt-in ``diagnostics.replay``): how far the rollout's
prefill replay moved on the shared tokens, and the path classification in words
(``classify_path``: the decode path only, the prefill path only, both, and/or the training
side); the rollout's noise floor stands for both of its paths. ``CONTRIBUTION`` is what
``attribution.analysis`` calls through the registry. Reads sealed files only through the
execution's digest-checked loader; knows nothing about how the document is sealed or shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_logprob_drift.attribution.align import movement
from pytest_logprob_drift.store import layout

if TYPE_CHECKING:
    from pytest_logprob_drift.attribution.analysis import Compared, SealedExecution
    from pytest_logprob_drift.attribution.document import Attribution
    from pytest_logprob_drift.records import JsonObject

PATH_NO_EFFECT = "no effect"
PATH_DECODE_ONLY = "moved the rollout's decode path only (its prefill replay is bitwise equal)"
PATH_PREFILL_ONLY = "moved the rollout's prefill path only"
PATH_BOTH = "moved the rollout on both paths"
PATH_TRAINING = "moved the training side"


def classify_path(*, decode_moved: bool, prefill_moved: bool, training_moved: bool) -> str:
    """Which path a knob moved, in words: the rollout's decode path only, its prefill path
    only, both, and/or the training side; ``no effect`` when nothing moved beyond the floor."""
    parts = []
    if decode_moved and prefill_moved:
        parts.append(PATH_BOTH)
    elif decode_moved:
        parts.append(PATH_DECODE_ONLY)
    elif prefill_moved:
        parts.append(PATH_PREFILL_ONLY)
    if training_moved:
        parts.append(PATH_TRAINING)
    return "; ".join(parts) if parts else PATH_NO_EFFECT


def by_path(compared: Compared) -> JsonObject:
    """``{"path": ...}`` when both executions sealed a prefill replay, else {}."""
    mine = compared.case.sealed(layout.SCORE_ROLLOUT_PREFILL)
    theirs = compared.reference.sealed(layout.SCORE_ROLLOUT_PREFILL)
    if mine is None or theirs is None:
        return {}
    floor = compared.floor
    prefill = movement(compared.alignment, mine["logprobs"], theirs["logprobs"])
    return {
        "path": {
            "prefill": prefill.to_json(),
            "classification": classify_path(
                decode_moved=compared.rollout.max_abs_delta > floor.rollout,
                prefill_moved=prefill.max_abs_delta > floor.rollout,
                training_moved=compared.training.max_abs_delta > floor.training,
            ),
        }
    }


@dataclass(frozen=True, slots=True)
class PathContribution:
    """Each comparison's ``path`` (``AttributionContribution``)."""

    def noise_floor(
        self, baseline: SealedExecution, repeats: Sequence[SealedExecution]
    ) -> object | None:
        return None  # the rollout's side floor (``Compared.floor``) stands for both paths

    def floor_members(self, floor: object | None) -> JsonObject:
        return {}

    def comparison_members(self, compared: Compared, floor: object | None) -> JsonObject:
        return by_path(compared)

    def case_members(self, case: SealedExecution) -> JsonObject:
        return {}

    def as_recorded(self, recorded: Attribution, recomputed: Attribution) -> Attribution:
        return recomputed  # absent wherever a prefill replay is: nothing to leave out


CONTRIBUTION = PathContribution()
