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


def chunk_spans(attention_mask: torch.Tensor, *, batch_size: int) -> list[tuple[int, int, int]]:
    """The ``(start, stop, length)`` of every chunk the teacher-forced scorer runs a forward
    for (``engine.hf_teacher_forced_score``: chunks of ``batch_size`` rows trimmed to their
    longest row; a chunk shorter than 2 tokens is skipped), in order."""
    rows = int(attention_mask.shape[0])
    spans = []
    for start in range(0, rows, batch_size):
        stop = min(start + batch_size, rows)
        length = int(attention_mask[start:stop].sum(-1).max())
        if length >= 2:
            spans.append((start, stop, length))
    return spans


def replayed_choice(
    logits: torch.Tensor, replay: torch.Tensor, natural: torch.Tensor, *, normalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """R3 for one router call: each token's experts are the rollout's (``replay``, ``[T, k]``;
    a row of -1, a token the rollout did not route, keeps its ``natural`` choice), weighted by
    the float32 softmax of this router's own ``logits`` over all experts, gathered at those
    experts (and renormalized over them when ``normalize``, the model's ``norm_topk_prob``)."""
    routed = (replay >= 0).all(-1, keepdim=True)
    ids = torch.where(routed, replay.to(natural.dtype), natural)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights = probs.gather(-1, ids.long())
    if normalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return ids, weights


def flipped_choice(logits: torch.Tensor, *, top_k: int, normalize: bool) -> tuple[Any, Any]:
    """A planted routing change for one router call: every token keeps its ``top_k - 1``
    best experts and takes the best one it did not choose in place of its ``top_k``-th."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    order = probs.argsort(dim=-1, descending=True)
    ids = torch.cat([order[:, : top_k - 1], order[:, top_k : top_k + 1]], dim=-1)
    weights = probs.gather(-1, ids)
    if normalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return ids, weights


class RouterOverride:
    """The training scorer's router knobs, applied by a forward hook on every MoE router for
    the forwards of one teacher-forced pass over a canonical batch (``with`` block):
    ``float32`` recomputes the gate GEMM with the router's input and weight upcast (the weight
    itself stays in the model dtype); ``replay`` (``[rows, positions, moe_layers, top_k]``
    expert ids on the batch's grid, -1 where the rollout routed nothing) takes the rollout's
    experts, weighted from this router's own logits (``replayed_choice``); ``flip_layer``
    plants ``flipped_choice`` at that MoE layer. A forward pre-hook on the model places each
    forward on its chunk of the batch (``chunk_spans``) and checks its shape. The hooks return
    the router's ``(logits, scores, indices)`` triple, so a capture hook registered after
    these sees what the experts ran with. What the hooks did is counted (``float32_calls``,
    ``flipped_calls``, ``replayed_tokens``: router calls and token choices, over every
    ``with`` block) for the read-back."""

    def __init__(
        self,
        model: Any,
        attention_mask: torch.Tensor,
        *,
        batch_size: int,
        float32: bool = False,
        replay: torch.Tensor | None = None,
        flip_layer: int | None = None,
    ) -> None:
        self.model = model
        self.routers = moe_routers(model)
        if not self.routers:
            raise ValueError("the model has no mixture-of-experts layer to route")
        if replay is not None and tuple(replay.shape[2:]) != (len(self.routers), top_k_of(model)):
            raise ValueError(
                f"the rollout's expert ids are [rows, positions, {tuple(replay.shape[2:])}], "
                f"the model has {len(self.routers)} MoE layers of top-{top_k_of(model)}"
            )
        if flip_layer is not None and not 0 <= flip_layer < len(self.routers):
            raise ValueError(
                f"the planted flip names MoE layer {flip_layer}, the model has {len(self.routers)}"
            )
        self.spans = chunk_spans(attention_mask, batch_size=batch_size)
        self.float32 = float32
        self.replay = replay
        self.flip_layer = flip_layer
        self.normalize = bool(getattr(model.config, "norm_topk_prob", False))
        self.top_k = top_k_of(model)
        self._at = -1
        self._handles: list[Any] = []
        self.float32_calls = self.flipped_calls = self.replayed_tokens = 0

    def __enter__(self) -> RouterOverride:
        self._at = -1

        def advance(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
            self._at += 1
            if self._at >= len(self.spans):
                raise RuntimeError("more forwards than the batch has chunks")
            start, stop, length = self.spans[self._at]
            shape = tuple(kwargs["input_ids"].shape)
            if shape != (stop - start, length):
                raise RuntimeError(
                    f"forward {self._at} fed {shape}, its chunk is ({stop - start}, {length})"
                )

        def hook(layer: int) -> Any:
            def route(module: Any, args: Any, out: Any) -> Any:
                logits, scores, indices = out
                if self.float32:
                    hidden = args[0].reshape(-1, module.weight.shape[1])
                    logits = torch.nn.functional.linear(hidden.float(), module.weight.float())
                    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
                    top, indices = torch.topk(probs, self.top_k, dim=-1)
                    if self.normalize:
                        top = top / top.sum(-1, keepdim=True)
                    scores = top
                    self.float32_calls += 1
                if self.flip_layer == layer:
                    indices, scores = flipped_choice(
                        logits, top_k=self.top_k, normalize=self.normalize
                    )
                    self.flipped_calls += 1
                if self.replay is not None:
                    start, stop, length = self.spans[self._at]
                    rows = self.replay[start:stop, :length, layer].reshape(-1, self.top_k)
                    self.replayed_tokens += int((rows >= 0).all(-1).sum())
                    indices, scores = replayed_choice(
                        logits, rows.to(indices.device), indices, normalize=self.normalize
                    )
                return logits, scores.to(out[1].dtype), indices.to(out[2].dtype)

            return route

        self._handles = [self.model.register_forward_pre_hook(advance, with_kwargs=True)]
        self._handles += [r.register_forward_hook(hook(i)) for i, r in enumerate(self.routers)]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
