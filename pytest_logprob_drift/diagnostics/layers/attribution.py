"""The layers diagnostic's attribution contribution: where, inside each side's network, a knob
moved the states.

Owns the attribution document's optional per-case ``layers`` (when both the case and its
reference sealed layer captures, opt-in ``diagnostics.layers``): for each side, the case's
reduced states (``numerics.layer_reduction``) against the reference's own captures of the same
side, at the positions of the rows whose token sequences are identical in both (a row that
sampled other tokens is not compared): ``first_moved_layer`` (``"0"`` = the embeddings,
``"k"`` = after k decoder layers, ``"final_norm"``, ``"logits"``; None: bitwise equal
everywhere) and by how much (the max relative error over those positions at that state, and
at the logits); and ``drift_enters``: the first state whose rollout-vs-training median
relative error (comparison.json's ``diagnostics.layers``) exceeds the reference's at the same
state by more than that state's noise floor (``layer_noise_floor``: how far the baseline's
repeats' medians stray from the baseline's own; 0 without repeats, so any excess counts).
The per-state floor is the document's ``noise_floor.layers``. ``CONTRIBUTION`` is what
``attribution.analysis`` calls through the registry. Reads sealed files only through the
store's digest-checked loaders; knows nothing about engines or how the document is sealed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from pytest_logprob_drift.check.resume import load_sealed_tensors
from pytest_logprob_drift.numerics.comparison import LayerFigures
from pytest_logprob_drift.numerics.layer_reduction import compare
from pytest_logprob_drift.numerics.layer_states import LOGITS
from pytest_logprob_drift.records import JsonObject
from pytest_logprob_drift.store import layout

if TYPE_CHECKING:
    from pytest_logprob_drift.attribution.analysis import Compared, SealedExecution
    from pytest_logprob_drift.attribution.document import Attribution

SIDE_FILES = {"training": layout.LAYERS_TRAINING, "rollout": layout.LAYERS_ROLLOUT}


def _identical_rows(case: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor]) -> set[int]:
    if tuple(case["token_ids"].shape) != tuple(ref["token_ids"].shape):
        return set()
    same = (case["attention_mask"] == ref["attention_mask"]).all(-1) & (
        (case["token_ids"] == ref["token_ids"]) | ~case["attention_mask"]
    ).all(-1)
    return {int(r) for r in same.nonzero().flatten()}


def _restrict(tensors: Mapping[str, torch.Tensor], rows: set[int]) -> dict[str, torch.Tensor]:
    keep = torch.tensor([int(r) in rows for r in tensors["positions"][:, 0]], dtype=torch.bool)
    return {
        "digests": tensors["digests"][:, keep],
        "projections": tensors["projections"][:, keep],
        "norms": tensors["norms"][:, keep],
        "positions": tensors["positions"][keep],
    }


def _side(case: SealedExecution, reference: SealedExecution, name: str) -> JsonObject | None:
    if name not in case.seal.files or name not in reference.seal.files:
        return None
    rows = _identical_rows(case.rollout, reference.rollout)
    mine = _restrict(load_sealed_tensors(case.attempt_dir, name, case.seal), rows)
    theirs = _restrict(load_sealed_tensors(reference.attempt_dir, name, reference.seal), rows)
    figures = compare(theirs, mine)
    by_state = {row["state"]: row for row in figures["states"]}
    first = figures["first_unequal_state"]
    return {
        "positions": figures["positions"],
        "rows_compared": len(rows),
        "first_moved_layer": first,
        "max_rel_error": 0.0 if first is None else by_state[first]["max_rel_error"],
        "logits_max_rel_error": by_state[LOGITS]["max_rel_error"],
    }


def _figures(execution: SealedExecution) -> LayerFigures | None:
    layers = execution.diagnostics.layers
    return None if layers is None else layers.figures


LayerFloor = Mapping[str, float]
"""Per state, the noise floor of the rollout-vs-training median relative error."""


def layer_noise_floor(
    baseline: SealedExecution, repeats: Sequence[SealedExecution]
) -> dict[str, float] | None:
    """Per state, the largest ``|repeat median - baseline median|`` of the rollout-vs-training
    median relative error over the baseline's repeats; None without repeats, or when the
    baseline or a repeat has no layer figures of the same states (then no floor is known)."""
    if not repeats:
        return None
    mine = _figures(baseline)
    if mine is None:
        return None
    own = {s.state: s.median_rel_error for s in mine.states}
    floor = dict.fromkeys(own, 0.0)
    for repeat in repeats:
        theirs = _figures(repeat)
        if theirs is None or [s.state for s in theirs.states] != list(own):
            return None
        for s in theirs.states:
            floor[s.state] = max(floor[s.state], abs(s.median_rel_error - own[s.state]))
    return floor


def floor_json(floor: LayerFloor | None) -> list[JsonObject] | None:
    """The attribution document's ``noise_floor.layers``: ``[{"state", "median_rel_error"}]``."""
    if floor is None:
        return None
    return [{"state": state, "median_rel_error": value} for state, value in floor.items()]


def drift_enters(
    case: LayerFigures | None, reference: LayerFigures | None, floor: LayerFloor | None = None
) -> str | None:
    """The first state whose median relative error exceeds the reference's at that state by
    more than the state's noise floor (``floor``; none: any excess)."""
    if case is None or reference is None:
        return None
    theirs = {s.state: s.median_rel_error for s in reference.states}
    margin = floor or {}
    for state in case.states:
        if state.state not in theirs:
            continue
        if state.median_rel_error - theirs[state.state] > margin.get(state.state, 0.0):
            return state.state
    return None


def by_layer(
    case: SealedExecution, reference: SealedExecution, floor: LayerFloor | None = None
) -> JsonObject:
    """``{"layers": ...}`` when both executions sealed a layer capture of some side, else {}."""
    sides = {side: _side(case, reference, name) for side, name in SIDE_FILES.items()}
    if all(v is None for v in sides.values()):
        return {}
    return {
        "layers": {
            **{side: value for side, value in sides.items() if value is not None},
            "drift_enters": drift_enters(_figures(case), _figures(reference), floor),
        }
    }


def _floor(floor: object | None) -> LayerFloor | None:
    """The floor ``noise_floor`` computed, as handed back by ``attribution.analysis``."""
    assert floor is None or isinstance(floor, dict)
    return floor


@dataclass(frozen=True, slots=True)
class LayersContribution:
    """``noise_floor.layers`` and each comparison's ``layers`` (``AttributionContribution``)."""

    def noise_floor(
        self, baseline: SealedExecution, repeats: Sequence[SealedExecution]
    ) -> object | None:
        return layer_noise_floor(baseline, repeats)

    def floor_members(self, floor: object | None) -> JsonObject:
        layers = floor_json(_floor(floor))
        return {} if layers is None else {"layers": layers}

    def comparison_members(self, compared: Compared, floor: object | None) -> JsonObject:
        return by_layer(compared.case, compared.reference, _floor(floor))

    def case_members(self, case: SealedExecution) -> JsonObject:
        return {}

    def as_recorded(self, recorded: Attribution, recomputed: Attribution) -> Attribution:
        return recomputed  # absent wherever a sealed layer capture is: nothing to leave out


CONTRIBUTION = LayersContribution()
