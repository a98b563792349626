"""The rollout's expert choices of one case, captured while it generates.

Owns arming the rollout engine's capture before its generation (``RolloutRoutingCapture``; the
rollout's choices are what it used while it sampled, never a replay), collecting them after,
checked on the batch's grid (``numerics.routing.check_routing``), as ``RolloutExperts``: its
status and, when captured, its tensors. The engine-side capture shared by the training setting
``training.moe_routing=replay`` (R3: ``execute.case`` hands the rollout's expert ids to the
scorer) and the routing diagnostic (``diagnostics.routing``, handed them through
``CaseUnderCapture.rollout_experts``). A side that cannot capture is ``routing_unavailable``
with its reason; never a knob status, never a verdict. Knows no concrete runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from pytest_logprob_drift.execute.protocol import (
    RolloutOutput,
    RolloutRoutingCapture,
    RoutingUnavailable,
)
from pytest_logprob_drift.numerics.comparison import (
    ROUTING_CAPTURED,
    ROUTING_UNAVAILABLE,
    RoutingStatus,
)
from pytest_logprob_drift.numerics.routing import EXPERT_IDS, check_routing
from pytest_logprob_drift.records import JSONScalar


def checked_capture(
    what: str, capture: Callable[[], Mapping[str, torch.Tensor]], grid: tuple[int, int]
) -> tuple[RoutingStatus, dict[str, torch.Tensor] | None]:
    """One side's capture, checked on ``grid``: its ``routing_captured`` status with the MoE
    layer, top-k and routed position counts and its tensors, or its ``routing_unavailable``
    status with the reason and None."""
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
class RolloutExperts:
    """The rollout's expert choices of one case, collected once after its generation: its
    status and, when captured, its checked tensors (``expert_ids``, ``gate_weights``)."""

    status: RoutingStatus
    tensors: dict[str, torch.Tensor] | None

    @property
    def expert_ids(self) -> torch.Tensor | None:
        """The rollout's expert ids (what ``training.moe_routing=replay`` hands the scorer)."""
        return None if self.tensors is None else self.tensors[EXPERT_IDS]


def _no_capture(engine: object) -> RoutingStatus:
    return RoutingStatus(
        status=ROUTING_UNAVAILABLE,
        reason=f"the rollout engine ({type(engine).__name__}) has no routing capture",
    )


def arm_rollout(engine: object) -> RoutingStatus | None:
    """Arm the rollout engine's capture before its generation: None when armed, else the
    ``routing_unavailable`` status with the reason."""
    if not isinstance(engine, RolloutRoutingCapture):
        return _no_capture(engine)
    try:
        engine.arm_routing()
    except RoutingUnavailable as exc:
        return RoutingStatus(status=ROUTING_UNAVAILABLE, reason=exc.reason)
    return None


def collect_rollout(
    engine: object, rollout: RolloutOutput, *, armed: RoutingStatus | None
) -> RolloutExperts:
    """The rollout's expert choices after its generation (``armed``: None when the capture
    was armed before it, else its unavailable status), checked on the batch's grid."""
    if armed is not None or not isinstance(engine, RolloutRoutingCapture):
        return RolloutExperts(status=armed or _no_capture(engine), tensors=None)
    batch = rollout.tensors
    grid = (int(batch["token_ids"].shape[0]), int(batch["token_ids"].shape[1]))
    status, tensors = checked_capture("rollout engine", lambda: engine.collect_routing(batch), grid)
    return RolloutExperts(status=status, tensors=tensors)
