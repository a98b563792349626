"""The routing view of a mixture-of-experts case: where the two sides chose different experts,
and how the drift splits by it.

Owns checking a side's sealed routing (``expert_ids`` int64 and ``gate_weights`` float32, both
``[rows, positions, moe_layers, top_k]`` on the comparison's grid, each token's ids ascending,
-1 where the side routed nothing) and the figures computed from both sides' (``figures``; the
same function ``verify`` runs on the sealed tensors). A position is *compared* when both sides
routed it (the rollout routes every prompt token it computed and every sampled token but the
last). Over the compared positions: per MoE layer the share whose expert set is identical
(``agreement_by_layer``), per position the first layer whose set differs, and the share with
at least one differing layer (``flip_share``). The drift split: each active token ``t`` is
``unknown`` when some non-padding position ``p < t`` of its row was not routed by one side,
else ``flip`` when some ``p < t`` differs at some layer (the states at ``p`` feed ``t``'s
logprob), else ``no_flip``; per class the token count, the share over the contract's
threshold and the mean and max ``|training - rollout|``. ``worst`` lists the active tokens
with the largest ``|diff|``, each with its class and, for a flip, the earliest differing
position before it and that position's first differing layer. Pure torch: knows no model,
engine or file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import torch

from pytest_logprob_drift.records import JsonObject

EXPERT_IDS: Final = "expert_ids"
GATE_WEIGHTS: Final = "gate_weights"
ROUTING_KEYS: Final = frozenset({EXPERT_IDS, GATE_WEIGHTS})
CLASSES: Final = ("flip", "no_flip", "unknown")
WORST_TOKENS: Final = 5


def check_routing(tensors: Mapping[str, torch.Tensor], grid: tuple[int, int]) -> None:
    """ValueError naming what is wrong with one side's routing tensors on a ``grid`` of
    (rows, positions)."""
    if set(tensors) != ROUTING_KEYS:
        raise ValueError(f"holds {sorted(tensors)}, expected {sorted(ROUTING_KEYS)}")
    ids, weights = tensors[EXPERT_IDS], tensors[GATE_WEIGHTS]
    if ids.dtype != torch.int64 or weights.dtype != torch.float32:
        raise ValueError(
            f"expert_ids is {ids.dtype} and gate_weights {weights.dtype}; "
            "expected int64 and float32"
        )
    if ids.ndim != 4 or tuple(ids.shape[:2]) != tuple(grid) or ids.shape != weights.shape:
        raise ValueError(
            f"expert_ids {list(ids.shape)} and gate_weights {list(weights.shape)} are not both "
            f"[rows, positions, moe_layers, top_k] on the {list(grid)} grid"
        )
    routed = ids >= 0
    if bool((ids < -1).any()) or bool((routed != routed[..., :1, :1]).any()):
        raise ValueError("expert_ids holds ids below -1, or a token routed at some layers only")
    if ids.shape[-1] > 1 and bool((routed[..., 1:] & (ids[..., 1:] <= ids[..., :-1])).any()):
        raise ValueError("expert_ids are not strictly ascending within a token")
    if not bool(torch.isfinite(weights).all()):
        raise ValueError("gate_weights holds a non-finite value")


def _split(
    diff: torch.Tensor, members: torch.Tensor, threshold: float
) -> dict[str, float | int | None]:
    picked = diff[members].double()
    count = int(picked.numel())
    if count == 0:
        return {"tokens": 0, "mismatch_share": None, "mean_abs_diff": None, "max_abs_diff": None}
    return {
        "tokens": count,
        "mismatch_share": float((picked > threshold).double().mean()),
        "mean_abs_diff": float(picked.mean()),
        "max_abs_diff": float(picked.max()),
    }


def figures(
    training: Mapping[str, torch.Tensor],
    rollout: Mapping[str, torch.Tensor],
    *,
    attention_mask: torch.Tensor,
    active_mask: torch.Tensor,
    training_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    threshold: float,
) -> JsonObject:
    """The routing view (see the module docstring) as plain JSON values; ValueError when the
    two sides' tensors do not share a shape."""
    a, b = training[EXPERT_IDS], rollout[EXPERT_IDS]
    if a.shape != b.shape:
        raise ValueError(f"training routed {list(a.shape)}, rollout {list(b.shape)}")
    layers, top_k = int(a.shape[2]), int(a.shape[3])
    present = attention_mask.bool()
    routed_a, routed_b = a[..., 0, 0] >= 0, b[..., 0, 0] >= 0
    compared = routed_a & routed_b & present
    differs = (a != b).any(-1) & compared[..., None]  # [rows, positions, layers]
    flipped = differs.any(-1)
    count = int(compared.sum())
    agreement = [
        float(1.0 - differs[..., k].sum().item() / count) if count else None for k in range(layers)
    ]
    first_layer = torch.where(
        flipped, differs.int().argmax(-1), torch.full_like(flipped, -1, dtype=torch.long)
    )
    first_counts = [int((first_layer == k).sum()) for k in range(layers)]
    # before[r, t]: over positions p < t of row r (exclusive cumulative counts)
    missing = (present & ~(routed_a & routed_b)).long()
    missing_before = missing.cumsum(-1) - missing
    flips = flipped.long()
    flips_before = flips.cumsum(-1) - flips
    active = active_mask.bool()
    unknown = active & (missing_before > 0)
    flip = active & ~unknown & (flips_before > 0)
    no_flip = active & ~unknown & ~flip
    diff = (training_logprobs.double() - rollout_logprobs.double()).abs()
    split = {
        name: _split(diff, members, threshold)
        for name, members in zip(CLASSES, (flip, no_flip, unknown), strict=True)
    }
    worst = []
    where = active.nonzero()
    if where.numel():
        values = diff[active]
        for i in values.argsort(descending=True, stable=True)[:WORST_TOKENS].tolist():
            r, t = (int(n) for n in where[i])
            entry: JsonObject = {
                "row": r,
                "position": t,
                "abs_diff": float(values[i]),
                "routing": "unknown"
                if bool(unknown[r, t])
                else "flip"
                if bool(flip[r, t])
                else "no_flip",
            }
            if entry["routing"] == "flip":
                p = int(flipped[r, :t].long().argmax())
                entry.update(first_flip_position=p, first_flip_layer=int(first_layer[r, p]))
            worst.append(entry)
    return {
        "moe_layers": layers,
        "top_k": top_k,
        "positions_compared": count,
        "positions_training_only": int((routed_a & ~routed_b & present).sum()),
        "agreement_by_layer": agreement,
        "flip_share": float(flipped.sum().item() / count) if count else None,
        "first_differing_layer_counts": first_counts,
        "drift": split,
        "worst": worst,
    }
