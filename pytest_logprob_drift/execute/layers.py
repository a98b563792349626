"""The opt-in layer diagnostics of one case (``diagnostics.layers``): where, in the network,
the two sides' states part.

Owns what happens after a case's paired scoring when layers are on: each side that can
(``execute.protocol.LayerCapture``: the training scorer, and the rollout engine on its
prefill replay path) runs its teacher-forced forward of the sampled sequences once more with
hooks and hands back the reduction of its states (``numerics.layer_reduction``) at the same
positions (every position that scores an active token, or the ``positions_per_row`` subset
of the config's object form); the ``diagnostics.layers`` entry of comparison.json (each
side's status, with how the side ran its capture where it says so
(``LayerCaptureEvidence``), the reduction's parameters, the rollout's states against the
training's) and the tensors sealed as
``layers_training.pt`` / ``layers_rollout.pt``. A side that cannot capture is
``layers_unavailable`` with its reason, for that case only; never a knob status, never a
verdict. Knows no concrete runtime and nothing about files beyond the layout's names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from pytest_logprob_drift.execute.protocol import (
    LayerCapture,
    LayerCaptureEvidence,
    LayersUnavailable,
    RolloutOutput,
)
from pytest_logprob_drift.numerics.comparison import (
    LAYERS_CAPTURED,
    LAYERS_UNAVAILABLE,
    LayerStatus,
)
from pytest_logprob_drift.numerics.layer_reduction import (
    DIGEST_BYTES,
    PROJECTION_DIM,
    PROJECTION_SEED,
    capture_mask,
    check_reduction,
    compare,
)
from pytest_logprob_drift.records import LayerSpec, ScoringIdentity
from pytest_logprob_drift.store import layout

REDUCTION = {
    "projection_dim": PROJECTION_DIM,
    "projection_seed": PROJECTION_SEED,
    "digest_bytes": DIGEST_BYTES,
}
"""comparison.json's ``diagnostics.layers.reduction``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayersResult:
    """comparison.json's ``layers`` entry and the layer files to seal (name -> tensors)."""

    entry: dict[str, Any]
    files: dict[str, dict[str, torch.Tensor]]


def _capture(
    side: object,
    what: str,
    identity: ScoringIdentity,
    batch: Mapping[str, torch.Tensor],
    batch_size: int,
) -> tuple[LayerStatus, dict[str, torch.Tensor] | None]:
    if not isinstance(side, LayerCapture):
        return LayerStatus(
            status=LAYERS_UNAVAILABLE,
            reason=f"the {what} ({type(side).__name__}) has no layer capture",
        ), None
    try:
        tensors = dict(side.capture_layers(identity, batch, batch_size=batch_size))
        check_reduction(tensors)
    except LayersUnavailable as exc:
        return LayerStatus(status=LAYERS_UNAVAILABLE, reason=exc.reason), None
    except (ValueError, RuntimeError) as exc:
        return LayerStatus(
            status=LAYERS_UNAVAILABLE, reason=f"the {what}'s layer capture failed: {exc}"
        ), None
    states, positions = (int(n) for n in tensors["digests"].shape[:2])
    how = dict(side.layer_capture_evidence()) if isinstance(side, LayerCaptureEvidence) else {}
    return LayerStatus(
        status=LAYERS_CAPTURED,
        evidence={**how, "states": states, "decoder_layers": states - 3, "positions": positions},
    ), tensors


def layer_diagnostics(
    engine: object,
    scorer: object,
    identity: ScoringIdentity,
    rollout: RolloutOutput,
    *,
    batch_size: int,
    spec: LayerSpec | None = None,
) -> LayersResult:
    """Both sides' captures, sealed per side, and the rollout's states against the
    training's where both captured the same states at the same positions (every scoring
    position, or the subset ``spec.positions_per_row`` picks: both sides get a batch whose
    ``active_mask`` is that subset, so each reads exactly the same positions)."""
    per_row = None if spec is None else spec.positions_per_row
    batch = dict(rollout.tensors)
    batch["active_mask"] = capture_mask(batch["active_mask"], per_row)
    training, trained = _capture(scorer, "training scorer", identity, batch, batch_size)
    rolled, replayed = _capture(engine, "rollout engine", identity, batch, batch_size)
    files: dict[str, dict[str, torch.Tensor]] = {}
    if trained is not None:
        files[layout.LAYERS_TRAINING] = trained
    if replayed is not None:
        files[layout.LAYERS_ROLLOUT] = replayed
    figures = None
    if trained is not None and replayed is not None:
        try:
            figures = compare(trained, replayed)
        except ValueError as exc:
            rolled = LayerStatus(
                status=LAYERS_UNAVAILABLE,
                reason=f"the rollout's capture is not comparable with the training's: {exc}",
            )
            del files[layout.LAYERS_ROLLOUT]
    entry = {
        "training": training.to_json(),
        "rollout": rolled.to_json(),
        "reduction": {**REDUCTION, **({} if per_row is None else {"positions_per_row": per_row})},
        "figures": figures,
    }
    return LayersResult(entry=entry, files=files)
