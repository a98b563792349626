"""Vocabulary-parallel backend for the ``selected_logprob`` semantic operator.

Owns ``rlkernel.vocab_parallel_logp`` and the vocabulary sharding layout it assumes: each
rank of a process group holds the logits of one contiguous vocabulary slice
``[vocab_start, vocab_start + local_V)``. Per rank it streams its shard through
``chunked.streaming_max_sumexp``; then one MAX all-reduce agrees on the global row max and
one SUM all-reduce combines the local sums of exponentials (rescaled to the global max), the
selected logit (contributed by the owning rank, zero elsewhere) and an ownership count that
proves every token id is owned by exactly one rank.

Must not know the drift framework, how the process group was created (gloo, NCCL) or which
model produced the logits; it never falls back to a single-rank computation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .chunked import DEFAULT_CHUNK_SIZE, streaming_max_sumexp
from .reference import validate_inputs

__all__ = ["VocabLayout", "shard_vocab", "vocab_parallel_selected_logprob"]

LAYOUT_SCHEMA_VERSION = "logprob_drift_operators.vocab_layout.v1"


def shard_vocab(vocab_size: int, world_size: int, rank: int) -> tuple[int, int]:
    """Return the half-open vocabulary slice ``(start, end)`` that ``rank`` owns.

    Contiguous and as even as possible: the first ``vocab_size % world_size`` ranks own one
    extra entry, so uneven vocabularies are split without padding. A rank may own an empty
    slice when ``vocab_size < world_size``.
    """
    for name, value in (("vocab_size", vocab_size), ("world_size", world_size), ("rank", rank)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"shard_vocab: {name} must be an int, got {type(value).__name__}")
    if vocab_size < 1:
        raise ValueError(f"shard_vocab: vocab_size must be >= 1, got {vocab_size}")
    if world_size < 1:
        raise ValueError(f"shard_vocab: world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"shard_vocab: rank must lie in [0, {world_size}), got {rank}")
    base, extra = divmod(vocab_size, world_size)
    start = rank * base + min(rank, extra)
    end = start + base + (1 if rank < extra else 0)
    return start, end


@dataclass(frozen=True, slots=True, kw_only=True)
class VocabLayout:
    """The derived vocabulary sharding of one vocabulary-parallel group (recorded, not set)."""

    vocab_size: int
    world_size: int
    shards: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if len(self.shards) != self.world_size:
            raise ValueError(
                f"VocabLayout: {len(self.shards)} shards for world_size {self.world_size}"
            )
        expected = 0
        for rank, (start, end) in enumerate(self.shards):
            if start != expected or end < start:
                raise ValueError(
                    f"VocabLayout: shard {rank} is ({start}, {end}); "
                    "shards must tile [0, vocab_size) in rank order"
                )
            expected = end
        if expected != self.vocab_size:
            raise ValueError(
                f"VocabLayout: shards cover [0, {expected}) but vocab_size is {self.vocab_size}"
            )

    @classmethod
    def build(cls, vocab_size: int, world_size: int) -> VocabLayout:
        """The layout ``shard_vocab`` produces for every rank of a ``world_size`` group."""
        shards = tuple(shard_vocab(vocab_size, world_size, rank) for rank in range(world_size))
        return cls(vocab_size=vocab_size, world_size=world_size, shards=shards)

    def shard(self, rank: int) -> tuple[int, int]:
        """The ``(start, end)`` slice owned by ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"VocabLayout: rank must lie in [0, {self.world_size}), got {rank}")
        return self.shards[rank]

    def to_json(self) -> dict[str, Any]:
        """A JSON-compatible mapping (lists, ints, str) suitable for provenance records."""
        return {
            "schema_version": LAYOUT_SCHEMA_VERSION,
            "vocab_size": self.vocab_size,
            "world_size": self.world_size,
            "shards": [[start, end] for start, end in self.shards],
        }


def vocab_parallel_selected_logprob(
    local_logits: torch.Tensor,
    token_ids: torch.Tensor,
    *,
    vocab_start: int,
    group: dist.ProcessGroup | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> torch.Tensor:
    """Selected log-probabilities when the vocabulary is sharded across ``group``.

    ``local_logits`` is [..., local_V] for global vocabulary ids
    ``[vocab_start, vocab_start + local_V)`` (``local_V`` may be 0), ``token_ids`` is the
    same int64 [...] global ids on every rank. Every rank must call this collectively and
    every rank returns the full float32 [...] result, equal to the single-device
    ``log_softmax(logits.float(), -1)[..., token_ids]`` up to float rounding. Two
    all-reduces are issued (MAX, then SUM). Forward-only.

    Raises:
        RuntimeError: ``torch.distributed`` is not initialized.
        TypeError / ValueError: the input contract of ``reference.validate_inputs``, a bad
            ``vocab_start``, or (on every rank alike) a token id that no rank, or more than
            one rank, owns.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "vocab_parallel_selected_logprob needs an initialized torch.distributed process group"
        )
    if isinstance(vocab_start, bool) or not isinstance(vocab_start, int) or vocab_start < 0:
        raise ValueError(f"vocab_start must be a non-negative int, got {vocab_start!r}")
    validate_inputs(local_logits, token_ids, vocab_size=-1)
    local_vocab = local_logits.shape[-1]
    with torch.no_grad():
        flat = local_logits.reshape(token_ids.numel(), local_vocab)  # local_V may be 0
        ids = token_ids.reshape(-1)
        local_max, local_sum = streaming_max_sumexp(flat, chunk_size=chunk_size)

        global_max = local_max.clone()
        dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)

        local_ids = ids - vocab_start
        owned = (local_ids >= 0) & (local_ids < local_vocab)
        packed = torch.zeros((3, ids.numel()), dtype=torch.float32, device=flat.device)
        # Both maxima are floored at finfo.min (never -inf): the exponent is finite and <= 0.
        packed[0] = local_sum * torch.exp(local_max - global_max)
        if local_vocab > 0:
            index = local_ids.clamp(0, local_vocab - 1).unsqueeze(-1)
            gathered = flat.gather(-1, index).squeeze(-1).float()
            packed[1] = torch.where(owned, gathered, torch.zeros_like(gathered))
        packed[2] = owned.to(torch.float32)
        dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)

        owners = packed[2]
        if ids.numel() > 0 and not bool((owners == 1).all()):
            bad = int(torch.nonzero(owners != 1)[0, 0].item())
            raise ValueError(
                f"vocab_parallel_selected_logprob: token id {int(ids[bad].item())} at flat "
                f"position {bad} is owned by {int(owners[bad].item())} ranks; vocabulary shards "
                "must tile [0, V) exactly once and token ids must lie inside the vocabulary"
            )
        result = (packed[1] - global_max).sub_(torch.log(packed[0]))
    return result.reshape(token_ids.shape)


def process_group_selected_logprob(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """The kernel-protocol entry of this backend: ``(logits, token_ids) -> float32``.

    Called collectively by every rank of the initialized default process group (e.g. the FSDP
    training ranks, which each hold the full logits of the same batch): each rank keeps only its
    ``shard_vocab`` slice of the vocabulary and the result is combined with collectives, so the
    backend's vocabulary-parallel arithmetic is what runs inside a real framework case.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "rlkernel.vocab_parallel_logp needs an initialized torch.distributed process group"
        )
    world, rank = dist.get_world_size(), dist.get_rank()
    start, end = shard_vocab(logits.shape[-1], world, rank)
    return vocab_parallel_selected_logprob(logits[..., start:end], token_ids, vocab_start=start)
