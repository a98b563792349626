"""Offline check of an attempt's sealed layer diagnostics (``diagnostics.layers``).

Owns deciding whether ``layers_training.pt`` / ``layers_rollout.pt`` and comparison.json's
``diagnostics.layers`` agree: a side's file is sealed exactly when its capture is recorded as
``layers_captured``; it holds a well-formed reduction (``numerics.layer_reduction``) of the
states at exactly the positions that score ``score_rollout.pt``'s active tokens (``t - 1``
for every active ``t``, row-major; the ``positions_per_row`` subset when comparison.json's
``reduction`` names one) with the recorded state and position counts; and the
figures recomputed from the sealed reductions equal the recorded ones. Used by
``store.resume`` (so resume, ``verify`` and the report all apply it). Never writes anything;
knows nothing about engines.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from pytest_logprob_drift.numerics.comparison import (
    Diagnostics,
    LayerFigures,
    LayerStatus,
    from_builtins,
)
from pytest_logprob_drift.numerics.layer_reduction import capture_mask, check_reduction, compare
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.seal import SealError

Tensors = Mapping[str, torch.Tensor]


def scored_positions(active_mask: torch.Tensor) -> torch.Tensor:
    """int64 ``[N, 2]``: (row, t - 1) for every active (row, t), row-major."""
    return active_mask[:, 1:].nonzero().to(torch.long)


def _check_file(
    name: str, status: LayerStatus, sealed: Tensors, rollout: Tensors, per_row: int | None
) -> None:
    try:
        check_reduction(sealed)
    except ValueError as exc:
        raise SealError(name, str(exc)) from None
    wanted = scored_positions(capture_mask(rollout["active_mask"], per_row))
    if not torch.equal(sealed["positions"], wanted):
        which = "" if per_row is None else f" ({per_row} per row)"
        raise SealError(
            name,
            f"positions are not the ones that score {layout.SCORE_ROLLOUT}'s active tokens{which}",
        )
    evidence = status.evidence or {}
    states, positions = (int(n) for n in sealed["digests"].shape[:2])
    if evidence.get("states") != states or evidence.get("positions") != positions:
        raise SealError(name, "state or position count differs from comparison.json's")


def _close(recorded: LayerFigures, recomputed: LayerFigures) -> bool:
    if (recorded.positions, recorded.first_unequal_state) != (
        recomputed.positions,
        recomputed.first_unequal_state,
    ) or len(recorded.states) != len(recomputed.states):
        return False
    for a, b in zip(recorded.states, recomputed.states, strict=True):
        if (a.state, a.bitwise_equal_share) != (b.state, b.bitwise_equal_share):
            return False
        for x, y in (
            (a.median_rel_error, b.median_rel_error),
            (a.max_rel_error, b.max_rel_error),
            (a.median_cosine, b.median_cosine),
        ):
            if not math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-300):
                return False
    return True


def check_layers(
    recorded: Diagnostics,
    training_layers: Tensors | None,
    rollout_layers: Tensors | None,
    rollout: Tensors,
) -> None:
    """Raise SealError naming the file at fault unless comparison.json's ``recorded`` layer
    diagnostics and the sealed layer files are consistent."""
    layers = recorded.layers
    files = {layout.LAYERS_TRAINING: training_layers, layout.LAYERS_ROLLOUT: rollout_layers}
    if layers is None:
        for name, sealed in files.items():
            if sealed is not None:
                raise SealError(name, "sealed, but comparison.json records no layer diagnostics")
        return
    for name, status in (
        (layout.LAYERS_TRAINING, layers.training),
        (layout.LAYERS_ROLLOUT, layers.rollout),
    ):
        sealed = files[name]
        if status.captured and sealed is None:
            raise SealError(name, "comparison.json records the capture but it is not sealed")
        if not status.captured and sealed is not None:
            raise SealError(name, f"sealed, but comparison.json records {status.status}")
        if sealed is not None:
            _check_file(name, status, sealed, rollout, layers.reduction.get("positions_per_row"))
    if training_layers is None or rollout_layers is None:
        if layers.figures is not None:
            raise SealError(layout.COMPARISON, "layer figures recorded without both captures")
        return
    try:
        figures = compare(training_layers, rollout_layers)
        recomputed = from_builtins(figures, LayerFigures)
    except ValueError as exc:
        raise SealError(layout.LAYERS_ROLLOUT, str(exc)) from None
    if layers.figures is None or recomputed is None or not _close(layers.figures, recomputed):
        raise SealError(
            layout.LAYERS_ROLLOUT,
            "the layer figures recomputed offline differ from comparison.json's",
        )
