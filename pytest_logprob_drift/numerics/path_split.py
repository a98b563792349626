"""Where the drift enters: a case's three per-token logprob differences and their figures.

Owns the pure function from the sealed tensors of one case (the rollout's sampled logprobs on
its decode path, its own prefill replay, the trainer's logprobs, the active mask, and where it
ran the rollout's decode replay) to the figures of ``comparison.json``'s
``diagnostics.path_split``: on the active tokens max / mean / p99 of |decode - prefill|,
|prefill - training| and |decode - training|, the share of tokens where decode and prefill are
bitwise equal and, per sample, the first response position where they differ. Every difference
is taken in float64 of float32 inputs, so for the logprob ranges engines produce each is exact
and decode - training == (decode - prefill) + (prefill - training) per token. Pairs that are
not comparable (raw prefill logprobs against processed ones) get no figures. Knows nothing
about engines, files, statuses or how the figures are shown.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from pytest_logprob_drift.numerics.sampling import Truncation
from pytest_logprob_drift.records import JsonObject

PAIRS = ("decode_prefill", "prefill_training", "decode_training")
"""The three pairs, each ``<minuend>_<subtrahend>`` of the per-token difference."""

REPLAY_PAIR = "decode_replay_decode"
"""The decode replay against the sampled logprobs (the rollout's run-to-run noise)."""


REPLAY_TENSORS = frozenset(("logprobs", "token_ids", "attention_mask", "active_mask"))
"""The tensors of a sealed replay file (``score_rollout_prefill.pt``,
``score_rollout_decode_replay.pt``): the replay's logprobs and the token ids it scored, on
``score_rollout.pt``'s grid with its masks."""

SEMANTICS = ("raw", "processed")
"""What a logprob is of: the raw logits, or the processed ones the sampler draws from."""


def processing_is_identity(how: Truncation) -> bool:
    """Whether processed logprobs equal raw ones bit for bit: greedy sampling (nothing is
    processed), or temperature exactly 1.0 without truncation (the division by 1.0 is exact)."""
    return how.greedy or (how.temperature == 1.0 and not how.truncates)


def comparable_pairs(
    *, decode: str, prefill: str, training: str, identity_processing: bool
) -> dict[str, bool]:
    """Per pair of ``PAIRS``: are its two sides the same kind of logprob (``SEMANTICS``)?
    Every pair is when processing is the identity."""
    for name, value in (("decode", decode), ("prefill", prefill), ("training", training)):
        if value not in SEMANTICS:
            raise ValueError(f"{name} semantics must be one of {SEMANTICS}, got {value!r}")
    kinds = {"decode": decode, "prefill": prefill, "training": training}
    out = {}
    for pair in PAIRS:
        left, right = pair.split("_")
        out[pair] = identity_processing or kinds[left] == kinds[right]
    return out


def differences(
    decode: torch.Tensor, prefill: torch.Tensor, training: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The three per-token differences, float64, on the whole grid."""
    d, p, t = decode.double(), prefill.double(), training.double()
    return {"decode_prefill": d - p, "prefill_training": p - t, "decode_training": d - t}


def _stats(values: torch.Tensor) -> dict[str, float | None]:
    """max / mean / p99 of ``|values|`` (None on no tokens)."""
    if values.numel() == 0:
        return {"max": None, "mean": None, "p99": None}
    magnitude = values.abs().double()
    return {
        "max": float(magnitude.max()),
        "mean": float(magnitude.mean()),
        "p99": float(torch.quantile(magnitude, 0.99)),
    }


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per element: the same float32 bits (``-0.0`` differs from ``0.0``; a NaN equals the
    same NaN)."""
    return a.float().contiguous().view(torch.int32) == b.float().contiguous().view(torch.int32)


def first_differences(
    decode: torch.Tensor, prefill: torch.Tensor, active: torch.Tensor
) -> list[int | None]:
    """Per sample, the index among its active tokens (0: the first generated token) of the
    first one whose decode and prefill logprobs are not bitwise equal; None where all are."""
    out: list[int | None] = []
    equal = bitwise_equal(decode, prefill)
    for row in range(active.shape[0]):
        same = equal[row][active[row]]
        differing = (~same).nonzero()
        out.append(int(differing[0]) if differing.numel() else None)
    return out


def path_split(
    *,
    decode: torch.Tensor,
    prefill: torch.Tensor,
    training: torch.Tensor,
    active: torch.Tensor,
    comparable: Mapping[str, bool],
    decode_replay: torch.Tensor | None = None,
) -> JsonObject:
    """The figures of one case's path split (JSON-safe; see the module docstring).
    ``comparable`` says, per pair of ``PAIRS``, whether its two sides are the same kind of
    logprob; an incomparable pair's statistics are None."""
    for name, tensor in (("prefill", prefill), ("training", training), ("active", active)):
        if tensor.shape != decode.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)}, decode {tuple(decode.shape)}"
            )
    mask = active.bool()
    diffs = differences(decode, prefill, training)
    figures: JsonObject = {"active_tokens": int(mask.sum())}
    for pair in PAIRS:
        figures[pair] = _stats(diffs[pair][mask]) if comparable.get(pair, False) else None
    if comparable.get("decode_prefill", False):
        equal = bitwise_equal(decode, prefill)[mask]
        figures["bitwise_equal_fraction"] = (
            None if equal.numel() == 0 else float(equal.double().mean())
        )
        figures["first_difference"] = first_differences(decode, prefill, mask)
    else:
        figures["bitwise_equal_fraction"] = None
        figures["first_difference"] = None
    if decode_replay is not None:
        if decode_replay.shape != decode.shape:
            raise ValueError(
                f"decode replay has shape {tuple(decode_replay.shape)}, "
                f"decode {tuple(decode.shape)}"
            )
        again = (decode_replay.double() - decode.double())[mask]
        equal = bitwise_equal(decode_replay, decode)[mask]
        figures[REPLAY_PAIR] = {
            **_stats(again),
            "bitwise_equal_fraction": None if equal.numel() == 0 else float(equal.double().mean()),
        }
    return figures
