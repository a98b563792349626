"""Offline check of an attempt's sealed layer diagnostics (``diagnostics.layers``).

Owns deciding whether ``layers_training.pt`` / ``layers_rollout.pt`` and comparison.json's
``diagnostics.layers`` agree: a side's file is sealed exactly when its capture is recorded as
``layers_captured``; it holds a well-formed reduction (``numerics.layer_reduction``) of the
states at exactly the positions that score ``score_rollout.pt``'s active tokens (``t - 1``
for every active ``t``, row-major; the ``positions_per_row`` subset when comparison.json's
``reduction`` names one) with the recorded state, decoder layer and position counts; the
reduction's recorded parameters (``projection_dim``, ``projection_seed``, ``digest_bytes``)
are the ones the sealed reductions were made with; and the figures recomputed from the sealed
reductions equal the recorded ones. Used by ``check.resume`` (so resume, ``verify`` and the
report all apply it, through the ``Diagnostic``). Never writes anything; knows nothing about
engines.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from pytest_logprob_drift.numerics.comparison import (
    Diagnostics,
    LayerFigures,
    LayerReduction,
    LayerStatus,
    from_builtins,
)
from pytest_logprob_drift.numerics.layer_reduction import (
    PROJECTION_SEED,
    capture_mask,
    check_reduction,
    compare,
)
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
    if (evidence.get("states"), evidence.get("decoder_layers"), evidence.get("positions")) != (
        states,
        states - 3,
        positions,
    ):
        raise SealError(
            name, "state, decoder layer or position count differs from comparison.json's"
        )


REDUCTION_PATH = "$.diagnostics.layers.reduction"


def _check_parameters(recorded: LayerReduction, sealed: Tensors) -> None:
    """comparison.json's reduction parameters must be those ``sealed`` was made with: the
    projection's width and the digests' length as its tensors have them, and the seed every
    reduction's projection is drawn from (``numerics.layer_reduction.PROJECTION_SEED``; the
    tensors cannot show it)."""
    made_with = (
        ("projection_dim", int(sealed["projections"].shape[-1])),
        ("projection_seed", PROJECTION_SEED),
        ("digest_bytes", int(sealed["digests"].shape[-1])),
    )
    for key, value in made_with:
        if getattr(recorded, key) != value:
            raise SealError(
                layout.COMPARISON,
                f"{REDUCTION_PATH}.{key}: recorded {getattr(recorded, key)}, the sealed "
                f"reductions were made with {value}",
            )


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
            _check_file(name, status, sealed, rollout, layers.reduction.positions_per_row)
            _check_parameters(layers.reduction, sealed)
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
