"""A transformers mixture-of-experts model's routers: which layers route, and what they chose.

Owns, for a transformers ``*ForCausalLM`` whose decoder layers hold a sparse MoE block (an
``mlp`` with ``experts`` and a ``gate`` router, as Qwen3-MoE and OLMoE in transformers 5),
finding those routers, reading back the experts implementation the model runs
(``config._experts_implementation``), and the training side's routing capture: one
teacher-forced forward of the canonical batch in chunks of ``batch_size``, exactly as
``engine.hf_teacher_forced_score`` runs it (right-padded chunk trimmed to its longest row, the
batch's attention mask and position ids, ``use_cache=False``), with a forward hook on each
router that records the top-k expert ids it returned (its ``(logits, scores, indices)`` triple)
and their gate weights. Each token's ids are sorted ascending (weights in the same order); a
padding position, or one past its chunk's longest row, holds -1 (weight 0).

Knows nothing about cases, comparison or artifacts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True, slots=True)
class RoutingCapture:
    """One side's routing on the comparison's grid: ``expert_ids`` int64 and ``gate_weights``
    float32, both ``[rows, positions, moe_layers, top_k]``."""

    expert_ids: torch.Tensor
    gate_weights: torch.Tensor


def moe_routers(model: Any) -> list[Any]:
    """The router (``mlp.gate``) of every decoder layer whose ``mlp`` is a sparse MoE block,
    in layer order; empty for a dense model."""
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    routers = []
    for layer in layers:
        mlp: Any = getattr(layer, "mlp", None)
        if hasattr(mlp, "experts") and hasattr(mlp, "gate"):
            routers.append(mlp.gate)
    return routers


def experts_implementation(model: Any) -> str | None:
    """The experts implementation a MoE model runs (transformers 5's
    ``config._experts_implementation``: ``grouped_mm``, ``batched_mm``, ``eager``); None for a
    dense model."""
    if not moe_routers(model):
        return None
    return str(getattr(model.config, "_experts_implementation", None) or "eager")


def top_k_of(model: Any) -> int:
    """The experts each token is routed to (``config.num_experts_per_tok``)."""
    return int(model.config.num_experts_per_tok)


def sorted_choice(ids: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's ids ascending (int64) and its weights in the same order (float32)."""
    order = ids.argsort(dim=-1)
    return ids.gather(-1, order).long(), weights.gather(-1, order).float()


def capture_routing(
    model: Any, batch: Mapping[str, torch.Tensor], *, batch_size: int
) -> RoutingCapture:
    """The training side's routing of ``batch`` (teacher-forced, the scorer's chunks and
    masks); ValueError for a model without MoE layers or a batch size below 1."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    routers = moe_routers(model)
    if not routers:
        raise ValueError("the model has no mixture-of-experts layer to capture routing from")
    top_k = top_k_of(model)
    token_ids = batch["token_ids"]
    rows, width = (int(n) for n in token_ids.shape)
    ids = torch.full((rows, width, len(routers), top_k), -1, dtype=torch.int64)
    weights = torch.zeros((rows, width, len(routers), top_k), dtype=torch.float32)
    chunk: list[tuple[int, int, int]] = []  # (start, stop, length) of the chunk in flight

    def hook(layer: int) -> Any:
        def record(_module: Any, _args: Any, out: Any) -> None:
            start, stop, length = chunk[0]
            _logits, scores, indices = out
            chosen, gates = sorted_choice(indices.detach().cpu(), scores.detach().cpu())
            ids[start:stop, :length, layer] = chosen.reshape(stop - start, length, top_k)
            weights[start:stop, :length, layer] = gates.reshape(stop - start, length, top_k)

        return record

    handles = [r.register_forward_hook(hook(i)) for i, r in enumerate(routers)]
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            for start in range(0, rows, batch_size):
                stop = min(start + batch_size, rows)
                length = int(batch["attention_mask"][start:stop].sum(-1).max())
                if length < 2:
                    continue
                chunk[:] = [(start, stop, length)]
                model(
                    input_ids=token_ids[start:stop, :length].to(device),
                    attention_mask=batch["attention_mask"][start:stop, :length].long().to(device),
                    position_ids=batch["position_ids"][start:stop, :length].to(device),
                    use_cache=False,
                )
    finally:
        for handle in handles:
            handle.remove()
    padding = ~batch["attention_mask"].bool().cpu()
    ids[padding] = -1
    weights[padding] = 0.0
    return RoutingCapture(expert_ids=ids, gate_weights=weights)


class GenerationRouting:
    """The rollout side's routing while a transformers model generates on the KV-cache decode
    path (``engine.hf_rollout``: per chunk of rows one left-padded prefill, then one token per
    row and step): a forward pre-hook on the model notes each forward's input ids, attention
    mask and position ids (a forward whose cache is empty starts the next chunk of rows), and a
    forward hook on every router records its top-k ids and weights. ``on_grid`` places them on
    the canonical batch's grid: a token counts where its attention mask is set and its
    position is before the row's last token (the last sampled token is fed once more to a row
    that already stopped, and a stopped row keeps being fed: neither is an input of the row)."""

    def __init__(self, model: Any) -> None:
        routers = moe_routers(model)
        if not routers:
            raise ValueError("the model has no mixture-of-experts layer to capture routing from")
        self.layers = len(routers)
        self.top_k = top_k_of(model)
        self._forwards: list[dict[str, Any]] = []

        def note(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
            cache = kwargs.get("past_key_values")
            self._forwards.append(
                {
                    "prefill": cache is None or int(cache.get_seq_length()) == 0,
                    "ids": kwargs["input_ids"].detach().cpu(),
                    "mask": kwargs["attention_mask"].detach().cpu(),
                    "positions": kwargs["position_ids"].detach().cpu(),
                    "layers": {},
                }
            )

        def hook(layer: int) -> Any:
            def record(_module: Any, _args: Any, out: Any) -> None:
                _logits, scores, indices = out
                self._forwards[-1]["layers"][layer] = sorted_choice(
                    indices.detach().cpu(), scores.detach().cpu()
                )

            return record

        self._handles = [model.register_forward_pre_hook(note, with_kwargs=True)]
        self._handles += [r.register_forward_hook(hook(i)) for i, r in enumerate(routers)]

    def close(self) -> None:
        """Remove every hook (idempotent)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def on_grid(self, token_ids: torch.Tensor, attention_mask: torch.Tensor) -> RoutingCapture:
        """The recorded routing on the batch's grid; ValueError when a recorded token is not
        the batch's token at its position."""
        self.close()
        rows, width = (int(n) for n in token_ids.shape)
        shape = (rows, width, self.layers, self.top_k)
        ids = torch.full(shape, -1, dtype=torch.int64)
        weights = torch.zeros(shape, dtype=torch.float32)
        lengths = attention_mask.bool().sum(-1)
        first = chunk = 0  # the first row of the chunk in flight, and its row count
        for forward in self._forwards:
            if forward["prefill"]:
                first, chunk = first + chunk, int(forward["ids"].shape[0])
            fed = forward["ids"]
            real = forward["mask"][:, -fed.shape[1] :].bool()
            for j in range(int(fed.shape[0])):
                row = first + j
                for col in range(int(fed.shape[1])):
                    position = int(forward["positions"][j, col])
                    if not real[j, col] or position >= int(lengths[row]) - 1:
                        continue
                    if int(token_ids[row, position]) != int(fed[j, col]):
                        raise ValueError(
                            f"row {row} position {position}: the rollout fed token "
                            f"{int(fed[j, col])}, the batch holds {int(token_ids[row, position])}"
                        )
                    flat = j * int(fed.shape[1]) + col
                    for layer in range(self.layers):
                        chosen, gates = forward["layers"][layer]
                        ids[row, position, layer] = chosen[flat]
                        weights[row, position, layer] = gates[flat]
        return RoutingCapture(expert_ids=ids, gate_weights=weights)
