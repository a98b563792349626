"""The rollout's captured routing placed on the comparison's grid.

Owns turning rank 0's routing capture (``routing_capture.collect``: per request, the positions
it routed, the token at each and each MoE layer's top-k ids and weights) into
``expert_ids`` int64 and ``gate_weights`` float32 ``[rows, positions, moe_layers, top_k]`` on
the canonical batch's grid. vLLM's internal request ids are not the caller's, so each request
is matched to a row by its tokens: every routed position must hold the row's token there, and
its last routed position must be the row's last but one (the last sampled token is never an
input); identical rows are taken in order. A position no request routed (padding, a prompt
token the prefix cache served, the last sampled token) holds -1 (weight 0). A request that
fits no row, or a row no request fits, is a ValueError. Pure torch: knows no engine or file.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def _requests(captured: Mapping[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    numbers = sorted({int(k.split(".", 1)[0]) for k in captured})
    return [
        {
            part: captured[f"{n}.{part}"]
            for part in ("positions", "tokens", "expert_ids", "gate_weights")
        }
        for n in numbers
    ]


def on_grid(
    captured: Mapping[str, torch.Tensor],
    token_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    moe_layers: int,
    top_k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(expert_ids, gate_weights)`` on ``token_ids``' grid (see the module docstring)."""
    rows, width = (int(n) for n in token_ids.shape)
    ids = torch.full((rows, width, moe_layers, top_k), -1, dtype=torch.int64)
    weights = torch.zeros((rows, width, moe_layers, top_k), dtype=torch.float32)
    lengths = attention_mask.bool().sum(-1)
    free = list(range(rows))
    for number, request in enumerate(_requests(captured)):
        positions, tokens = request["positions"], request["tokens"]
        if request["expert_ids"].shape[1:] != (moe_layers, top_k):
            raise ValueError(
                f"captured request {number} routed {list(request['expert_ids'].shape[1:])} "
                f"(layers, top_k), expected {[moe_layers, top_k]}"
            )
        last = int(positions.max()) if positions.numel() else -1
        row = next(
            (
                r
                for r in free
                if last == int(lengths[r]) - 2 and bool((token_ids[r, positions] == tokens).all())
            ),
            None,
        )
        if row is None:
            raise ValueError(
                f"captured request {number} ({positions.numel()} routed positions, last "
                f"{last}) matches no row of the batch by its tokens"
            )
        free.remove(row)
        ids[row, positions] = request["expert_ids"].long()
        weights[row, positions] = request["gate_weights"].float()
    if free:
        raise ValueError(f"rows {free} of the batch match no captured request")
    return ids, weights
