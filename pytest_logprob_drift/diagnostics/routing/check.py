"""Offline check of an attempt's sealed routing diagnostics (``diagnostics.routing``).

Owns deciding whether ``routing_training.pt`` / ``routing_rollout.pt`` and comparison.json's
``diagnostics.routing`` agree: a side's file is sealed exactly when its capture is recorded as
``routing_captured``; it holds a well-formed routing (``numerics.routing.check_routing``) on
``score_rollout.pt``'s grid, with the recorded MoE layer, top-k and routed position counts; and
the figures recomputed from the sealed tensors (with ``token_diffs.pt``'s logprobs, active mask
and threshold) equal the recorded ones. Called through the routing diagnostic's ``check`` by
``check.resume`` (so resume, ``verify`` and the report all apply it). Never writes anything;
knows nothing about engines.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from pytest_logprob_drift.numerics.comparison import (
    Diagnostics,
    RoutingFigures,
    RoutingStatus,
    from_builtins,
)
from pytest_logprob_drift.numerics.routing import EXPERT_IDS, check_routing, figures
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.seal import SealError

Tensors = Mapping[str, torch.Tensor]


def _check_file(name: str, status: RoutingStatus, sealed: Tensors, grid: tuple[int, int]) -> None:
    try:
        check_routing(sealed, grid)
    except ValueError as exc:
        raise SealError(name, str(exc)) from None
    ids = sealed[EXPERT_IDS]
    evidence = status.evidence or {}
    counted = (int(ids.shape[2]), int(ids.shape[3]), int((ids[..., 0, 0] >= 0).sum()))
    if (evidence.get("moe_layers"), evidence.get("top_k"), evidence.get("positions")) != counted:
        raise SealError(
            name, "MoE layer, top-k or routed position count differs from comparison.json's"
        )


def _close(recorded: Any, recomputed: Any) -> bool:
    """Equal plain values, floats within 1e-12 relative."""
    if isinstance(recorded, float) or isinstance(recomputed, float):
        if recorded is None or recomputed is None:
            return False
        return math.isclose(float(recorded), float(recomputed), rel_tol=1e-12, abs_tol=1e-300)
    if isinstance(recorded, Mapping) and isinstance(recomputed, Mapping):
        return set(recorded) == set(recomputed) and all(
            _close(recorded[k], recomputed[k]) for k in recorded
        )
    if isinstance(recorded, list | tuple) and isinstance(recomputed, list | tuple):
        return len(recorded) == len(recomputed) and all(
            _close(a, b) for a, b in zip(recorded, recomputed, strict=True)
        )
    return bool(recorded == recomputed)


def check_routing_files(
    recorded: Diagnostics,
    training_routing: Tensors | None,
    rollout_routing: Tensors | None,
    diffs: Tensors,
    rollout: Tensors,
) -> None:
    """Raise SealError naming the file at fault unless comparison.json's ``recorded`` routing
    diagnostics and the sealed routing files are consistent."""
    routing = recorded.routing
    files = {layout.ROUTING_TRAINING: training_routing, layout.ROUTING_ROLLOUT: rollout_routing}
    if routing is None:
        for name, sealed in files.items():
            if sealed is not None:
                raise SealError(name, "sealed, but comparison.json records no routing diagnostics")
        return
    grid = (int(rollout["token_ids"].shape[0]), int(rollout["token_ids"].shape[1]))
    for name, status in (
        (layout.ROUTING_TRAINING, routing.training),
        (layout.ROUTING_ROLLOUT, routing.rollout),
    ):
        sealed = files[name]
        if status.captured and sealed is None:
            raise SealError(name, "comparison.json records the capture but it is not sealed")
        if not status.captured and sealed is not None:
            raise SealError(name, f"sealed, but comparison.json records {status.status}")
        if sealed is not None:
            _check_file(name, status, sealed, grid)
    if training_routing is None or rollout_routing is None:
        if routing.figures is not None:
            raise SealError(layout.COMPARISON, "routing figures recorded without both captures")
        return
    try:
        recomputed = from_builtins(
            figures(
                training_routing,
                rollout_routing,
                attention_mask=rollout["attention_mask"],
                active_mask=diffs["active_mask"],
                training_logprobs=diffs["training_logprobs"],
                rollout_logprobs=diffs["rollout_logprobs"],
                threshold=float(diffs["threshold"]),
            ),
            RoutingFigures,
        )
    except ValueError as exc:
        raise SealError(layout.ROUTING_ROLLOUT, str(exc)) from None
    if routing.figures is None or not _close(routing.figures.to_json(), recomputed.to_json()):
        raise SealError(
            layout.ROUTING_ROLLOUT,
            "the routing figures recomputed offline differ from comparison.json's",
        )
