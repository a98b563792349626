"""Capturing a transformers causal LM's hidden states with forward hooks, reduced in place.

Owns the layer diagnostics' capture on the transformers side (the trainer in process, and the
transformers rollout's prefill replay): one teacher-forced forward of the canonical batch in
chunks of ``batch_size``, exactly as ``engine.hf_teacher_forced_score`` runs it (right-padded
chunk trimmed to its longest row, the batch's attention mask and position ids,
``use_cache=False``), with forward hooks on the embeddings, every decoder layer, the final
norm and the LM head (never ``output_hidden_states``, whose last entry is already
normalized). A decoder layer's output is the residual stream after it (transformers adds the
residual inside the layer). The captured positions are the states that score the active
tokens: position ``t - 1`` for every active ``t``, row-major. Each hook reduces its state at
once (``numerics.layer_reduction.reduce_states``), so no full hidden state outlives its hook.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from pytest_logprob_drift.numerics.layer_reduction import (
    projection_matrix,
    reduce_states,
    stack_reductions,
)


def _parts(model: Any) -> tuple[Any, list[Any], Any, Any]:
    """(embeddings, decoder layers, final norm, LM head) of a ``*ForCausalLM``; ValueError
    naming what is missing."""
    body = getattr(model, "model", None)
    parts = (
        getattr(body, "embed_tokens", None),
        getattr(body, "layers", None),
        getattr(body, "norm", None),
        getattr(model, "lm_head", None),
    )
    names = ("model.embed_tokens", "model.layers", "model.norm", "lm_head")
    missing = [n for n, p in zip(names, parts, strict=True) if p is None]
    if missing:
        raise ValueError(f"the model has no {', '.join(missing)} to hook")
    layers: Any = parts[1]
    return parts[0], list(layers), parts[2], parts[3]


def decoder_layer_count(model: Any) -> int:
    return len(_parts(model)[1])


def capture_layers(
    model: Any, batch: Mapping[str, torch.Tensor], *, batch_size: int
) -> dict[str, torch.Tensor]:
    """One side's reduction (``numerics.layer_reduction.stack_reductions``) of ``model``'s
    states at the positions that score ``batch``'s active tokens."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    embed, layers, norm, head = _parts(model)
    modules = [embed, *layers, norm, head]
    per_state: list[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = [[] for _ in modules]
    projections: dict[int, torch.Tensor] = {}
    select: list[torch.Tensor] = []

    def hook(index: int) -> Any:
        def record(_module: Any, _args: Any, out: Any) -> None:
            state = out[0] if isinstance(out, tuple) else out
            chosen = state[:, :-1][select[0].to(state.device)]
            width = int(chosen.shape[-1])
            if width not in projections:
                projections[width] = projection_matrix(width, chosen.device)
            per_state[index].append(reduce_states(chosen, projections[width]))

        return record

    handles = [m.register_forward_hook(hook(i)) for i, m in enumerate(modules)]
    token_ids = batch["token_ids"]
    rows = int(token_ids.shape[0])
    positions: list[torch.Tensor] = []
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            for start in range(0, rows, batch_size):
                stop = min(start + batch_size, rows)
                length = int(batch["attention_mask"][start:stop].sum(-1).max())
                if length < 2:
                    continue
                active = batch["active_mask"][start:stop, 1:length].cpu()
                select[:] = [active]
                where = active.nonzero()
                positions.append(torch.stack([where[:, 0] + start, where[:, 1]], dim=1))
                model(
                    input_ids=token_ids[start:stop, :length].to(device),
                    attention_mask=batch["attention_mask"][start:stop, :length].long().to(device),
                    position_ids=batch["position_ids"][start:stop, :length].to(device),
                    use_cache=False,
                )
    finally:
        for handle in handles:
            handle.remove()
    where_all = torch.cat(positions) if positions else torch.zeros((0, 2), dtype=torch.long)
    return stack_reductions(per_state, where_all)
