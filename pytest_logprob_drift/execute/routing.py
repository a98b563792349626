"""The routing diagnostic's engine calls for one case (``diagnostics.routing``): which experts
each side's MoE layers chose, and how the drift splits by where they differ.

Owns the training scorer's teacher-forced capture (``TrainingRoutingCapture``, under the same
router knobs as its scores), checked (``numerics.routing.check_routing``) beside the rollout's
choices captured while it generated (``execute.rollout_experts``), the ``diagnostics.routing``
entry of comparison.json (each side's status, the figures where both captured) and the
tensors sealed as ``routing_training.pt`` / ``routing_rollout.pt``. Called by the routing
diagnostic's ``capture`` (``diagnostics.routing``). A side that cannot capture is
``routing_unavailable`` with its reason, for that case only; never a knob status, never a
verdict. Knows no concrete runtime and nothing about files beyond the layout's names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pytest_logprob_drift.execute.protocol import (
    RolloutOutput,
    TrainingOutput,
    TrainingRoutingCapture,
)
from pytest_logprob_drift.execute.rollout_experts import RolloutExperts, checked_capture
from pytest_logprob_drift.numerics.comparison import ROUTING_UNAVAILABLE, RoutingStatus
from pytest_logprob_drift.numerics.routing import figures
from pytest_logprob_drift.store import layout


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutingResult:
    """comparison.json's ``routing`` entry and the routing files to seal (name -> tensors)."""

    entry: dict[str, Any]
    files: dict[str, dict[str, torch.Tensor]]


def routing_diagnostics(
    scorer: object,
    rollout: RolloutOutput,
    training: TrainingOutput,
    *,
    rolled_out: RolloutExperts,
    replayed: torch.Tensor | None,
    batch_size: int,
    threshold: float,
) -> RoutingResult:
    """Both sides' routing (the rollout's collected after its generation, ``rolled_out``;
    the training side's captured under the same router knobs as its scores, ``replayed``:
    the rollout's expert ids when it replays them), sealed per side, and the figures where
    both captured on the same grid."""
    batch = rollout.tensors
    grid = (int(batch["token_ids"].shape[0]), int(batch["token_ids"].shape[1]))
    if isinstance(scorer, TrainingRoutingCapture):
        trained, training_tensors = checked_capture(
            "training scorer",
            lambda: scorer.capture_routing(
                batch,
                batch_size=batch_size,
                **({} if replayed is None else {"rollout_routing": replayed}),
            ),
            grid,
        )
    else:
        trained = RoutingStatus(
            status=ROUTING_UNAVAILABLE,
            reason=f"the training scorer ({type(scorer).__name__}) has no routing capture",
        )
        training_tensors = None
    rolled, rollout_tensors = rolled_out.status, rolled_out.tensors
    files: dict[str, dict[str, torch.Tensor]] = {}
    if training_tensors is not None:
        files[layout.ROUTING_TRAINING] = training_tensors
    if rollout_tensors is not None:
        files[layout.ROUTING_ROLLOUT] = rollout_tensors
    result = None
    if training_tensors is not None and rollout_tensors is not None:
        try:
            result = figures(
                training_tensors,
                rollout_tensors,
                attention_mask=batch["attention_mask"],
                active_mask=batch["active_mask"],
                training_logprobs=training.logprobs,
                rollout_logprobs=batch["logprobs"],
                threshold=threshold,
            )
        except ValueError as exc:
            rolled = RoutingStatus(
                status=ROUTING_UNAVAILABLE,
                reason=f"the rollout's routing is not comparable with the training's: {exc}",
            )
            del files[layout.ROUTING_ROLLOUT]
    entry = {"training": trained.to_json(), "rollout": rolled.to_json(), "figures": result}
    return RoutingResult(entry=entry, files=files)
