"""The opt-in routing diagnostics of one case (``diagnostics.routing``): which experts each
side's MoE layers chose, and how the drift splits by where they differ.

Owns the case's routing steps: arming the rollout engine's capture before its generation
(``RolloutRoutingCapture``; the rollout's routing is what it used while it sampled, never a
replay), collecting it after, the training scorer's teacher-forced capture
(``TrainingRoutingCapture``), each checked (``numerics.routing.check_routing``), the
``diagnostics.routing`` entry of comparison.json (each side's status, the figures where both
captured) and the tensors sealed as ``routing_training.pt`` / ``routing_rollout.pt``. A side
that cannot capture is ``routing_unavailable`` with its reason, for that case only; never a
knob status, never a verdict. Knows no concrete runtime and nothing about files beyond the
layout's names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pytest_logprob_drift.execute.protocol import (
    RolloutOutput,
    RolloutRoutingCapture,
    RoutingUnavailable,
    TrainingOutput,
    TrainingRoutingCapture,
)
from pytest_logprob_drift.numerics.comparison import (
    ROUTING_CAPTURED,
    ROUTING_UNAVAILABLE,
    RoutingStatus,
)
from pytest_logprob_drift.numerics.routing import EXPERT_IDS, check_routing, figures
from pytest_logprob_drift.records import JSONScalar
from pytest_logprob_drift.store import layout


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutingResult:
    """comparison.json's ``routing`` entry and the routing files to seal (name -> tensors)."""

    entry: dict[str, Any]
    files: dict[str, dict[str, torch.Tensor]]


def arm_rollout(engine: object) -> RoutingStatus | None:
    """Arm the rollout engine's capture before its generation: None when armed, else the
    ``routing_unavailable`` status with the reason."""
    if not isinstance(engine, RolloutRoutingCapture):
        return RoutingStatus(
            status=ROUTING_UNAVAILABLE,
            reason=f"the rollout engine ({type(engine).__name__}) has no routing capture",
        )
    try:
        engine.arm_routing()
    except RoutingUnavailable as exc:
        return RoutingStatus(status=ROUTING_UNAVAILABLE, reason=exc.reason)
    return None


def _checked(
    what: str, capture: Any, grid: tuple[int, int]
) -> tuple[RoutingStatus, dict[str, torch.Tensor] | None]:
    try:
        tensors = dict(capture())
        check_routing(tensors, grid)
    except RoutingUnavailable as exc:
        return RoutingStatus(status=ROUTING_UNAVAILABLE, reason=exc.reason), None
    except (ValueError, RuntimeError) as exc:
        return RoutingStatus(
            status=ROUTING_UNAVAILABLE, reason=f"the {what}'s routing capture failed: {exc}"
        ), None
    ids = tensors[EXPERT_IDS]
    routed = int((ids[..., 0, 0] >= 0).sum())
    evidence: dict[str, JSONScalar] = {
        "moe_layers": int(ids.shape[2]),
        "top_k": int(ids.shape[3]),
        "positions": routed,
    }
    return RoutingStatus(status=ROUTING_CAPTURED, evidence=evidence), tensors


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutRouting:
    """The rollout's routing of one case, collected once after its generation: its status
    and, when captured, its checked tensors (``expert_ids``, ``gate_weights``)."""

    status: RoutingStatus
    tensors: dict[str, torch.Tensor] | None

    @property
    def expert_ids(self) -> torch.Tensor | None:
        """The rollout's expert ids (what ``training.moe_routing=replay`` hands the scorer)."""
        return None if self.tensors is None else self.tensors[EXPERT_IDS]


def collect_rollout(
    engine: object, rollout: RolloutOutput, *, armed: RoutingStatus | None
) -> RolloutRouting:
    """The rollout's routing after its generation (``armed``: None when the capture was
    armed before it, else its unavailable status), checked on the batch's grid."""
    if armed is not None or not isinstance(engine, RolloutRoutingCapture):
        status = armed or RoutingStatus(
            status=ROUTING_UNAVAILABLE,
            reason=f"the rollout engine ({type(engine).__name__}) has no routing capture",
        )
        return RolloutRouting(status=status, tensors=None)
    batch = rollout.tensors
    grid = (int(batch["token_ids"].shape[0]), int(batch["token_ids"].shape[1]))
    status, tensors = _checked("rollout engine", lambda: engine.collect_routing(batch), grid)
    return RolloutRouting(status=status, tensors=tensors)


def routing_diagnostics(
    scorer: object,
    rollout: RolloutOutput,
    training: TrainingOutput,
    *,
    rolled_out: RolloutRouting,
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
        trained, training_tensors = _checked(
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
