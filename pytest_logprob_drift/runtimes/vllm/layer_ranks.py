"""Which tensor-parallel rank's layer capture the rollout side keeps, checked against the others.

Owns reading the replies every vLLM worker gives to ``DriftWorkerExtension.layers_collect``:
with TP > 1 the residual stream, the final norm's output and the (all-gathered) logits are
replicated on every rank after the all-reduce, so each rank reduces its own states and sends
the SHA-256 of its reduction (``numerics.layer_reduction.reduction_sha256``), and only TP rank
0 (``READ_RANK``) sends the reduction itself. ``rank_zero_reduction`` keeps rank 0's tensors
only if there is exactly one reply per rank ``0 .. n - 1``, every rank's SHA-256 equals rank
0's, and rank 0's bytes hash to the SHA-256 it sent; otherwise a ValueError naming the ranks
(the engine's caller turns it into ``layers_unavailable`` for that case). Pure: knows no
engine, no case and no file; importing it imports neither torch nor vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import torch

READ_RANK: Final = 0
"""The TP rank whose reduction crosses processes."""

REPLY_KEYS: Final = frozenset({"tp_rank", "tp_size", "sha256", "reduction"})
"""What ``layers_collect`` returns in each worker."""


def _reply(reply: object, index: int) -> tuple[int, int, str, bytes | None]:
    if not isinstance(reply, Mapping) or set(reply) != REPLY_KEYS:
        raise ValueError(f"worker reply {index} is not a layers_collect reply")
    rank, size, sha, payload = (reply[k] for k in ("tp_rank", "tp_size", "sha256", "reduction"))
    if not isinstance(rank, int) or not isinstance(size, int) or not isinstance(sha, str):
        raise ValueError(f"worker reply {index} has a malformed tp_rank, tp_size or sha256")
    if payload is not None and not isinstance(payload, bytes):
        raise ValueError(f"worker reply {index} sent a reduction that is not bytes")
    return rank, size, sha, payload


def rank_zero_reduction(
    replies: Sequence[Any], tensor_parallel_size: int, what: str
) -> dict[str, torch.Tensor]:
    """Rank 0's reduction from every worker's ``layers_collect`` reply (``what`` names the
    request in messages), after checking that the ranks agree; ValueError naming the ranks
    otherwise."""
    from pytest_logprob_drift.numerics.layer_reduction import reduction_sha256
    from pytest_logprob_drift.tensorio import TensorFormatError, tensors_from_bytes

    parsed = [_reply(r, i) for i, r in enumerate(replies)]
    ranks = sorted(rank for rank, *_ in parsed)
    if ranks != list(range(tensor_parallel_size)):
        raise ValueError(
            f"{what}: expected one reply from each TP rank 0..{tensor_parallel_size - 1}, "
            f"got ranks {ranks}"
        )
    sizes = sorted({size for _, size, *_ in parsed})
    if sizes != [tensor_parallel_size]:
        raise ValueError(f"{what}: the workers report TP sizes {sizes}, not {tensor_parallel_size}")
    senders = sorted(rank for rank, _, _, payload in parsed if payload is not None)
    if senders != [READ_RANK]:
        raise ValueError(f"{what}: TP ranks {senders} sent their reduction; only rank 0 may")
    by_rank = {rank: (sha, payload) for rank, _, sha, payload in parsed}
    reference, payload = by_rank[READ_RANK]
    unequal = [rank for rank, (sha, _) in sorted(by_rank.items()) if sha != reference]
    if unequal:
        listed = ", ".join(f"rank {r} {by_rank[r][0][:12]}" for r in unequal)
        raise ValueError(
            f"{what}: the TP ranks' layer states differ (rank 0 {reference[:12]} vs {listed}); "
            "the residual stream should be replicated after the all-reduce"
        )
    assert payload is not None
    try:
        tensors = tensors_from_bytes(payload)
    except TensorFormatError as exc:
        raise ValueError(f"{what}: rank 0's reduction is unreadable: {exc}") from None
    if reduction_sha256(tensors) != reference:
        raise ValueError(f"{what}: rank 0's reduction does not hash to the SHA-256 it sent")
    return tensors
