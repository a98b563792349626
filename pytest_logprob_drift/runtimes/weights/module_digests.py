"""The training side's weight digests: a live torch module, per state-dict name.

Owns digesting a transformers module as it is held for scoring: every parameter and persistent
buffer under its state-dict name (the checkpoint's names for a Hugging Face model), whole, in
the dtype it is held in. Under FSDP2 each parameter is a sharded ``DTensor``: it is gathered
with ``full_tensor()`` (an all-gather over the group, so every rank must call this at the same
moment; each rank briefly holds one whole parameter at a time, and the whole model crosses the
network once per rank: the cost is one all-gather of the model plus one SHA-256 pass over it
on rank 0) and rank 0 digests it. A name that is the very same parameter object as an
earlier one (a tied LM head) and that the checkpoint does not hold is reported tied;
non-persistent buffers (``rotary_emb.inv_freq``) are named and skipped with the reason. A
mixture-of-experts layer's fused expert parameters (transformers 5's ``experts.gate_up_proj``,
``experts.down_proj``) are turned back into the checkpoint's per-expert tensors by
transformers' own reverse conversion (``moe_experts.expert_tensors``), one layer at a time,
and each is digested under its checkpoint name; the fused parameters are listed as skipped
with that reason.
Knows nothing about engines, processes, comparison or sealing.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from pytest_logprob_drift.records import JsonObject
from pytest_logprob_drift.runtimes.weights.digest import dtype_name, tensor_sha256
from pytest_logprob_drift.runtimes.weights.moe_experts import (
    FUSED_ON_BOTH,
    expert_tensors,
    is_expert_tensor,
)

MODULE_POINT = "transformers module as loaded for scoring"
FSDP_POINT = "FSDP2 ranks after sharding, each parameter gathered with full_tensor()"


def _non_persistent(model: Any) -> set[str]:
    names: set[str] = set()
    for prefix, module in model.named_modules():
        for buffer in getattr(module, "_non_persistent_buffers_set", ()):
            names.add(f"{prefix}.{buffer}" if prefix else buffer)
    return names


def module_report(
    model: Any, checkpoint_names: Collection[str], *, point: str = MODULE_POINT, rank: int = 0
) -> JsonObject:
    """``model``'s digests as a side report (the form ``side_document`` reads): per name,
    ``held``, ``shape``, ``dtype`` and ``sha256`` (None on ranks other than 0), plus ``tied``,
    ``skipped`` and ``extra``. Collective under FSDP (see the module docstring)."""
    from torch.distributed.tensor import DTensor

    wanted = set(checkpoint_names)
    tensors: JsonObject = {}
    tied: dict[str, str] = {}
    extra: dict[str, str] = {}
    seen: dict[int, str] = {}
    dtypes: list[str] = []
    skipped: dict[str, str] = {}
    expert_groups: dict[str, dict[str, Any]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if is_expert_tensor(name) and name not in wanted:
            layer = name[: name.index("experts.")]
            expert_groups.setdefault(layer, {})[name] = param
            continue
        first = seen.setdefault(id(param), name)
        if first != name and name not in wanted:
            tied[name] = first
            continue
        full = param.full_tensor() if isinstance(param, DTensor) else param
        dtypes.append(dtype_name(full.dtype))
        entry: JsonObject = {
            "held": True,
            "shape": [int(n) for n in full.shape],
            "dtype": dtype_name(full.dtype),
            "sha256": tensor_sha256(full) if rank == 0 else None,
        }
        del full
        if name in wanted:
            tensors[name] = entry
        else:
            extra[name] = "held by the module; the checkpoint has no tensor of this name"
    for group in expert_groups.values():
        fused = {
            name: (param.full_tensor() if isinstance(param, DTensor) else param).detach()
            for name, param in group.items()
        }
        for name, tensor in expert_tensors(model, fused).items():
            entry = {
                "held": True,
                "shape": [int(n) for n in tensor.shape],
                "dtype": dtype_name(tensor.dtype),
                "sha256": tensor_sha256(tensor) if rank == 0 else None,
            }
            if name in wanted:
                tensors[name] = entry
            elif name in fused:
                extra[name] = "expert tensor the checkpoint does not hold"
            else:
                extra[name] = (
                    "expert tensor (per transformers' reverse conversion) the "
                    "checkpoint does not hold"
                )
        skipped.update({name: FUSED_ON_BOTH for name in fused if name not in extra})
        del fused
    non_persistent = _non_persistent(model)
    for name, buffer in model.named_buffers(remove_duplicate=False):
        if name in non_persistent:
            skipped[name] = (
                "non-persistent buffer: not in the state dict or the checkpoint (recomputed "
                "from the config)"
            )
            continue
        full = buffer.full_tensor() if isinstance(buffer, DTensor) else buffer
        entry = {
            "held": True,
            "shape": [int(n) for n in full.shape],
            "dtype": dtype_name(full.dtype),
            "sha256": tensor_sha256(full) if rank == 0 else None,
        }
        if name in wanted:
            tensors[name] = entry
        else:
            extra[name] = "persistent buffer the checkpoint does not hold"
    return {
        "point": point,
        "dtype": dtypes[0] if dtypes else "none",
        "tp_size": 1,
        "tensors": tensors,
        "tied": tied,
        "skipped": skipped,
        "extra": extra,
        "refused": None,
    }
