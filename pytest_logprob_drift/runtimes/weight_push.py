"""The training side's weights as an RL framework pushes them into a rollout engine.

Owns turning a training module's state (its parameters and persistent buffers, each gathered
whole with ``full_tensor()`` where FSDP2 holds it as a ``DTensor``) into the chunks a rollout
engine receives: every tensor cast to the rollout dtype (or to the floating dtype the engine
declares it in, where another: ``push_dtypes``), in checkpoint (Hugging Face) names,
packed in order into chunks of at most ``CHUNK_BYTES`` where a group of tied tensors (an LM
head tied to its input embedding) always travels in one chunk; the seeded "previous policy"
(the same tensors plus a deterministic perturbation) that a refit starts from; and the
planted sync bugs applied to the state (``planted_state``; the test-only registry of them is
``plan.planted_sync``). Each chunk is the project's tensor wire format
(``tensorio``). Knows nothing about vLLM, cases, knobs or comparison; imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import torch

from pytest_logprob_drift.tensorio import tensor_bytes

__all__ = [
    "CHUNK_BYTES",
    "PREVIOUS_POLICY_SCALE",
    "PREVIOUS_POLICY_SEED",
    "PlantedSync",
    "PushChunk",
    "chunks",
    "gathered_state",
    "planted_state",
    "previous_policy",
    "push_dtypes",
    "pushed_through",
    "tie_groups",
]

CHUNK_BYTES: Final = 256 * 1024
"""At most this many bytes of tensors per chunk (a single tensor or tied group larger than
this travels alone). Small, so that even the tiny checkpoints cross in several chunks, as a
real model crosses in many buckets."""

PREVIOUS_POLICY_SEED: Final = 20261202
PREVIOUS_POLICY_SCALE: Final = 0.05
"""The previous policy is every floating tensor ``t + PREVIOUS_POLICY_SCALE * t.std() * n``
with ``n`` standard normal from a generator seeded with ``PREVIOUS_POLICY_SEED`` (drawn in
float32 in the state's order): a different policy that still writes text, and the same one on
every run and every machine."""


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"not a floating dtype: {name!r}")
    return dtype


def gathered_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's parameters and persistent buffers by state-dict (checkpoint) name, each
    whole on CPU: a ``DTensor`` (FSDP2's shard) is gathered with ``full_tensor()``, which is a
    collective, so under FSDP every rank must call this in the same order. Tied entries stay
    the same tensor object (``tie_groups`` finds them)."""
    whole: dict[str, torch.Tensor] = {}
    seen: dict[int, torch.Tensor] = {}
    for name, value in module.state_dict(keep_vars=True).items():
        key = id(value)
        if key in seen:
            whole[name] = seen[key]
            continue
        tensor = value.detach()
        full = getattr(tensor, "full_tensor", None)
        if callable(full):
            tensor = full()
        seen[key] = whole[name] = tensor.cpu()
    return _per_expert(module, whole)


def _per_expert(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with a mixture-of-experts model's fused expert tensors (transformers 5's
    ``experts.gate_up_proj``) replaced, in place in the order, by the checkpoint's per-expert
    tensors they hold (``moe_experts.expert_tensors``: transformers' own reverse conversion,
    what ``save_pretrained`` writes and RL frameworks export)."""
    from pytest_logprob_drift.runtimes.weights.moe_experts import (
        expert_index,
        expert_tensors,
        is_expert_tensor,
    )

    fused = [n for n in state if is_expert_tensor(n) and expert_index(n) is None]
    if not fused:
        return state
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name not in fused:
            out[name] = tensor
            continue
        for expert_name, expert in expert_tensors(module, {name: tensor}).items():
            out[expert_name] = expert.contiguous()
    return out


def tie_groups(state: Mapping[str, torch.Tensor]) -> list[list[str]]:
    """The state's names grouped by the tensor they are (same object or same storage and
    view), in state order: a tied LM head shares its group with the input embedding."""
    groups: dict[tuple[int, int, tuple[int, ...]], list[str]] = {}
    for name, tensor in state.items():
        key = (
            tensor.untyped_storage().data_ptr(),
            int(tensor.storage_offset()),
            tuple(int(d) for d in tensor.shape),
        )
        groups.setdefault(key, []).append(name)
    return list(groups.values())


@dataclass(frozen=True, slots=True)
class PushChunk:
    """One chunk of a push: the tensor wire format of ``names`` (``tensorio``)."""

    names: tuple[str, ...]
    payload: bytes
    tensor_bytes: int
    """The bytes of tensor data in the chunk (without the format's framing)."""


def chunks(
    state: Mapping[str, torch.Tensor],
    dtype: str,
    *,
    limit: int = CHUNK_BYTES,
    skip: Iterable[str] = (),
    held: Mapping[str, str] | None = None,
) -> Iterator[PushChunk]:
    """The state cast to ``dtype`` (floating tensors only; integer buffers keep theirs), a
    tensor the engine holds in another floating dtype (``held``: checkpoint name -> dtype, the
    engine's per-tensor declaration) cast to that one instead, in chunks of at most ``limit``
    tensor bytes, in state order, each tie group in one chunk (every name of the group sent,
    each as its own copy: the wire format keeps one storage per tensor). Names in ``skip`` are
    left out."""
    targets = push_dtypes(state, dtype, held)
    left_out = set(skip)
    pending: dict[str, torch.Tensor] = {}
    size = 0
    for group in tie_groups(state):
        names = [n for n in group if n not in left_out]
        if not names:
            continue
        source = state[names[0]]
        cast = source.to(targets[names[0]]) if source.is_floating_point() else source
        group_bytes = cast.numel() * cast.element_size() * len(names)
        if pending and size + group_bytes > limit:
            yield _chunk(pending, size)
            pending, size = {}, 0
        for name in names:
            pending[name] = cast.clone().contiguous()
        size += group_bytes
    if pending:
        yield _chunk(pending, size)


def push_dtypes(
    state: Mapping[str, torch.Tensor], dtype: str, held: Mapping[str, str] | None = None
) -> dict[str, torch.dtype]:
    """The dtype each floating tensor of ``state`` is pushed in: ``dtype`` (the rollout's),
    or, where the engine declares the tensor in another floating dtype (``held``), that one
    (a GLM4-MoE router's float32 bias and weight in a bfloat16 vLLM engine). A tie group
    takes its first name's."""
    target = _dtype(dtype)
    own = held or {}
    out: dict[str, torch.dtype] = {}
    for group in tie_groups(state):
        if not state[group[0]].is_floating_point():
            continue
        chosen = _dtype(own[group[0]]) if group[0] in own else target
        for name in group:
            out[name] = chosen
    return out


def pushed_through(
    state: Mapping[str, torch.Tensor], dtype: str, held: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Per tensor, the trainer's dtype where the engine receives it widened from it or as
    another dtype of the same width (a router weight the trainer holds in bfloat16 pushed into
    vLLM's float32 one): what the engine holds is the checkpoint cast to that dtype first (the
    rollout side's ``via``). A trainer tensor wider than what is pushed adds nothing: the
    checkpoint cast to it is exact, and the push's cast is the only rounding."""
    targets = push_dtypes(state, dtype, held)
    out: dict[str, str] = {}
    for name, target in targets.items():
        source = state[name].dtype
        if source != target and source.itemsize <= target.itemsize:
            out[name] = str(source).removeprefix("torch.")
    return out


def _chunk(tensors: Mapping[str, torch.Tensor], size: int) -> PushChunk:
    return PushChunk(names=tuple(tensors), payload=tensor_bytes(tensors), tensor_bytes=size)


def previous_policy(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The deterministic previous policy (``PREVIOUS_POLICY_SEED``/``_SCALE``): every floating
    tensor perturbed in float32 and returned in its own dtype; tied names stay one tensor."""
    generator = torch.Generator().manual_seed(PREVIOUS_POLICY_SEED)
    out: dict[str, torch.Tensor] = {}
    for group in tie_groups(state):
        source = state[group[0]]
        if source.is_floating_point() and source.numel() > 1:
            wide = source.to(torch.float32)
            noise = torch.randn(wide.shape, generator=generator, dtype=torch.float32)
            scale = float(wide.std()) if float(wide.std()) > 0 else 1.0
            moved = (wide + PREVIOUS_POLICY_SCALE * scale * noise).to(source.dtype)
        else:
            moved = source.clone()
        for name in group:
            out[name] = moved
    return out


# --------------------------------------------------------------------------- planted bugs


class PlantedSync(Protocol):
    """A test-only way of getting the push wrong (the registry is ``runtimes.
    planted_sync``): ``skip``: left out of the push; ``through``: a dtype every tensor is
    cast through first; ``stale``: tensors sent from the previous policy; ``swapped``: pairs
    sent under each other's names; ``initial``: name endings of tensors sent as their initial
    value, zeros (a router bias on every layer)."""

    @property
    def skip(self) -> tuple[str, ...]: ...

    @property
    def through(self) -> str | None: ...

    @property
    def stale(self) -> tuple[str, ...]: ...

    @property
    def swapped(self) -> tuple[tuple[str, str], ...]: ...

    @property
    def initial(self) -> tuple[str, ...]: ...


def planted_state(
    state: Mapping[str, torch.Tensor], variant: PlantedSync | None
) -> tuple[dict[str, torch.Tensor], tuple[str, ...]]:
    """The state a planted ``variant`` pushes instead of ``state`` and the names it leaves
    out (``state`` itself and none without a variant)."""
    if variant is None:
        return dict(state), ()
    out = dict(state)
    if variant.through is not None:
        through = _dtype(variant.through)
        for group in tie_groups(state):
            source = state[group[0]]
            if source.is_floating_point():
                moved = source.to(through).to(source.dtype)
                for name in group:
                    out[name] = moved
    if variant.stale:
        before = previous_policy(state)
        for name in variant.stale:
            if name not in state:
                raise KeyError(f"the planted stale tensor {name!r} is not in the state")
            out[name] = before[name]
    for first, second in variant.swapped:
        for name in (first, second):
            if name not in state:
                raise KeyError(f"the planted swapped tensor {name!r} is not in the state")
        out[first], out[second] = state[second], state[first]
    for ending in variant.initial:
        names = [n for n in state if n.endswith(f".{ending}")]
        if not names:
            raise KeyError(f"the planted initial-value tensor *.{ending} is not in the state")
        for name in names:
            out[name] = torch.zeros_like(state[name])
    return out, tuple(n for n in variant.skip if n in state)


def total_bytes(pushed: Sequence[PushChunk]) -> int:
    return sum(c.tensor_bytes for c in pushed)


def names_of(pushed: Sequence[PushChunk]) -> list[str]:
    return [n for c in pushed for n in c.names]


def module_state(model: Any) -> dict[str, torch.Tensor]:
    """``gathered_state`` of a transformers model (typed for callers that hold ``Any``)."""
    return gathered_state(model)
