"""A mixture-of-experts model's expert tensors mapped back to the checkpoint's per-expert names.

Owns the rule both sides' weight reports follow for a tensor under an ``experts`` module (a
checkpoint's ``mlp.experts.3.gate_proj.weight``, transformers 5's fused
``mlp.experts.gate_up_proj``, vLLM's ``mlp.experts.routed_experts.w13_weight``), using only
what the classes declare, never a table typed per architecture:

- the training side: transformers' own ``core_model_loading.revert_weight_conversion`` (what
  ``save_pretrained`` runs) turns a layer's fused ``gate_up_proj [E, 2I, H]`` /
  ``down_proj [E, H, I]`` back into the checkpoint's per-expert tensors (``expert_tensors``);
- the vLLM side: each ``RoutedExperts`` layer's ``get_expert_mapping(include_fused=True)``
  (shard ids ``w1`` gate, ``w3`` up, ``w2`` down) places each per-expert checkpoint name in
  the layer's ``w13_weight [E, 2I/TP, H]`` (this rank's gate rows, then its up rows) or
  ``w2_weight [E, H, I/TP]`` (this rank's columns), as the layer's loader does
  (``expert_places``; the arithmetic, ``expert_span``, takes plain numbers).

A layout this mapping does not cover (expert parallelism, a padded per-rank intermediate,
a checkpoint that stores experts fused) is named and skipped with the reason. Knows nothing
about digests, comparison or sealing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

EXPERTS_NOT_CHECKED: Final = "MoE experts: not checked yet"
"""The reason earlier releases gave for every expert tensor (kept: their sealed documents
carry it)."""

FUSED_ON_BOTH: Final = (
    "fused expert tensor: checked as the checkpoint's per-expert tensors it holds"
)
"""The reason a side gives for its own fused expert parameter, checked under per-expert names."""

_EXPERTS: Final = re.compile(r"(?:^|\.)experts\.")
_PER_EXPERT: Final = re.compile(r"(?:^|\.)experts\.(\d+)\.")


def is_expert_tensor(name: str) -> bool:
    """Whether ``name`` (a checkpoint, transformers or vLLM parameter name) lies under an
    ``experts`` module."""
    return _EXPERTS.search(name) is not None


def expert_index(name: str) -> int | None:
    """The expert a per-expert checkpoint name belongs to (``...experts.3.up_proj.weight``:
    3); None for any other name."""
    match = _PER_EXPERT.search(name)
    return None if match is None else int(match.group(1))


def expert_tensors(model: Any, fused: Mapping[str, Any]) -> dict[str, Any]:
    """The checkpoint's per-expert tensors that the module's fused expert tensors ``fused``
    (state-dict name -> whole tensor) hold, by transformers' own reverse of the conversion
    it loaded them with (``revert_weight_conversion``). Returned tensors may be views of the
    given ones; a name the conversion does not touch comes back unchanged."""
    from transformers.core_model_loading import revert_weight_conversion

    return dict(revert_weight_conversion(model, dict(fused)))


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertSpan:
    """Where one per-expert checkpoint tensor sits in expert ``expert`` of a fused vLLM
    parameter on this rank: ``local_dim`` rows ``[local_start, local_stop)`` of
    ``param[expert]`` hold ``dim`` rows or columns ``[start, stop)`` of the checkpoint
    tensor."""

    expert: int
    local_dim: int
    local_start: int
    local_stop: int
    dim: int
    start: int
    stop: int


def expert_span(
    shard: str, *, expert: int, local: int, checkpoint: int, tp_size: int, tp_rank: int
) -> ExpertSpan:
    """Shard ``w1`` (gate), ``w3`` (up) or ``w2`` (down) of one expert, on a rank whose fused
    parameter holds ``local`` intermediate rows (``w13``: gate then up, ``local`` each;
    ``w2``: ``local`` columns) of a checkpoint intermediate of ``checkpoint``; ValueError
    when the rank's share is not an even split (a padded layout)."""
    if shard not in ("w1", "w3", "w2"):
        raise ValueError(f"no expert shard {shard!r} (w1, w3 or w2)")
    if checkpoint % tp_size or checkpoint // tp_size != local:
        raise ValueError(
            f"the rank holds {local} intermediate rows of {checkpoint} over {tp_size} "
            "rank(s): not an even split (a padded layout)"
        )
    offset = local if shard == "w3" else 0
    dim = 1 if shard == "w2" else 0
    return ExpertSpan(
        expert=expert,
        local_dim=dim,
        local_start=offset,
        local_stop=offset + local,
        dim=dim,
        start=tp_rank * local,
        stop=(tp_rank + 1) * local,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertPlace:
    """One per-expert checkpoint tensor placed in a vLLM fused expert parameter."""

    name: str
    param_name: str
    """The vLLM parameter's qualified name (``...mlp.experts.routed_experts.w13_weight``)."""
    shard: str
    span: ExpertSpan


PROCESSED: Final = (
    "the MoE kernel took this layer's experts after loading (vLLM's CPU build pads the "
    "intermediate and prepacks w13/w2 in place: same shape, permuted bytes); read only at "
    "load time"
)
"""Why a live model's expert tensors are not read after post-load processing."""


def _refusal(module: Any, *, live: bool) -> str | None:
    """Why the experts of a ``RoutedExperts`` layer are not mapped (None: they are)."""
    quant_method = getattr(module, "quant_method", None)
    method = type(quant_method).__name__
    if not method.startswith("Unquantized"):
        return f"quantized experts ({method})"
    if live and getattr(quant_method, "moe_kernel", None) is not None:
        return PROCESSED
    if getattr(module, "use_ep", False) or getattr(module, "expert_map", None) is not None:
        return "expert parallelism: this rank holds a subset of the experts"
    if getattr(module.moe_config, "tp_shard_with_padding", False):
        return "block-padded tensor-parallel expert shards"
    if not getattr(module.moe_config, "is_act_and_mul", True):
        return "a non-gated expert MLP (w13 holds no gate)"
    return None


def expert_places(
    model: Any, shapes: Mapping[str, tuple[int, ...]], *, live: bool = False
) -> tuple[dict[str, ExpertPlace], dict[str, str]]:
    """Every checkpoint expert tensor of ``shapes`` (name -> shape) placed in ``model``'s
    ``RoutedExperts`` layers on this rank, and the expert names it could not place, with the
    reason. Runs inside a vLLM worker, before ``process_weights_after_loading`` (the CPU
    build pads and prepacks the fused parameters there); ``live``: the model is read as it
    runs, and a layer whose MoE kernel is built is skipped (``PROCESSED``)."""
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    places: dict[str, ExpertPlace] = {}
    skipped: dict[str, str] = {}
    layers = [(p, m) for p, m in model.named_modules() if isinstance(m, RoutedExperts)]
    for path, module in layers:
        prefix = f"{module.layer_name}."
        names = [n for n in shapes if n.startswith(prefix) and is_expert_tensor(n)]
        refused = _refusal(module, live=live)
        mapping = [] if refused else module.get_expert_mapping(include_fused=True)
        tp_size = int(module.moe_config.moe_parallel_config.tp_size)
        tp_rank = int(module.moe_config.tp_rank)
        for name in names:
            if refused:
                skipped[name] = f"MoE experts not checked: {refused}"
                continue
            if len(shapes[name]) != 2 or expert_index(name) is None:
                skipped[name] = (
                    "MoE experts not checked: the checkpoint stores this expert tensor "
                    f"fused ({list(shapes[name])}); only per-expert tensors are mapped"
                )
                continue
            hits = [m for m in mapping if m[1] in name and m[1].startswith("experts.")]
            if len(hits) != 1:
                skipped[name] = (
                    f"MoE experts not checked: {type(module).__name__}.get_expert_mapping "
                    f"gives {len(hits)} entries for this name"
                )
                continue
            param_prefix, weight_name, expert, shard = hits[0]
            leaf = name.replace(weight_name, param_prefix).removeprefix(prefix)
            param = getattr(module, leaf, None)
            if param is None or param.ndim != 3:
                skipped[name] = f"MoE experts not checked: {path} has no 3-D {leaf!r}"
                continue
            local = int(param.shape[2] if shard == "w2" else param.shape[1] // 2)
            rows = int(shapes[name][1] if shard == "w2" else shapes[name][0])
            try:
                span = expert_span(
                    str(shard),
                    expert=int(expert),
                    local=local,
                    checkpoint=rows,
                    tp_size=tp_size,
                    tp_rank=tp_rank,
                )
            except ValueError as exc:
                skipped[name] = f"MoE experts not checked: {path}.{leaf}: {exc}"
                continue
            places[name] = ExpertPlace(
                name=name, param_name=f"{path}.{leaf}", shard=str(shard), span=span
            )
    return places, skipped
