"""Aligning two executions of the same prompts token by token, and how far each side moved.

Owns pairing the sampled responses of two sealed executions (a case and its reference: the
baseline, a pairwise case's single-knob parent, or a repeat of the baseline) sample by sample:
response tokens are paired only while both executions sampled the same token ids, up to the
first divergence (a differing token, or one response ending earlier), and only where both
score them (active). On those shared tokens it measures, per side, how far the logprobs moved:
max and mean |delta|, the fraction that is bitwise equal, and the first response position
where anything moved. Different token ids are never paired. Vectorized over the batch. Knows
nothing about files, verdicts or runtimes; works on the canonical tensors (``token_ids``,
``attention_mask``, ``active_mask``, ``prompt_lengths``, per-side logprobs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class Alignment:
    """Which positions the case shares with the reference (the same absolute positions in
    both: the prompts are identical, so responses start at the same place)."""

    mask: torch.Tensor
    """``[B, W]`` bool: shared, active in both, before the sample's first divergence."""
    starts: torch.Tensor
    """``[B]`` where each sample's response starts (its prompt length)."""
    first_divergence: tuple[int | None, ...]
    """Per sample: the response offset of the first token that differs (None: identical)."""

    @property
    def shared_tokens(self) -> int:
        return int(self.mask.sum())

    @property
    def earliest_divergence(self) -> int | None:
        found = [d for d in self.first_divergence if d is not None]
        return min(found) if found else None

    @property
    def offsets(self) -> tuple[torch.Tensor, ...]:
        """Per sample: the response offsets (0 = first sampled token) of the shared tokens."""
        return tuple(
            row.nonzero().flatten() - int(start)
            for row, start in zip(self.mask, self.starts, strict=True)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Movement:
    """How far one side's logprobs moved on the shared tokens."""

    shared_tokens: int
    max_abs_delta: float
    mean_abs_delta: float
    bitwise_equal_fraction: float
    first_moved_offset: int | None
    """The earliest response offset, over samples, where this side's logprob moved at all."""

    @property
    def bitwise_equal(self) -> bool:
        return self.shared_tokens > 0 and self.max_abs_delta == 0.0

    def to_json(self) -> dict[str, float | int | None]:
        return {
            "shared_tokens": self.shared_tokens,
            "max_abs_delta": self.max_abs_delta,
            "mean_abs_delta": self.mean_abs_delta,
            "bitwise_equal_fraction": self.bitwise_equal_fraction,
            "first_moved_offset": self.first_moved_offset,
        }


def _padded(tensor: torch.Tensor, width: int, fill: float | bool | int) -> torch.Tensor:
    if tensor.shape[1] == width:
        return tensor
    pad = torch.full((tensor.shape[0], width - tensor.shape[1]), fill, dtype=tensor.dtype)
    return torch.cat([tensor, pad], dim=1)


def align(case: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> Alignment:
    """Pair the two executions' response tokens sample by sample."""
    samples = int(case["token_ids"].shape[0])
    if int(reference["token_ids"].shape[0]) != samples:
        raise ValueError(
            f"the executions have {samples} and {int(reference['token_ids'].shape[0])} samples"
        )
    starts = case["prompt_lengths"]
    if not torch.equal(starts, reference["prompt_lengths"]):
        raise ValueError("the executions have different prompts")
    width = max(int(case["token_ids"].shape[1]), int(reference["token_ids"].shape[1]))
    positions = torch.arange(width).expand(samples, width)
    response = positions >= starts.unsqueeze(1)
    mine = _padded(case["attention_mask"], width, False) & response
    theirs = _padded(reference["attention_mask"], width, False) & response
    tokens_differ = _padded(case["token_ids"], width, -1) != _padded(
        reference["token_ids"], width, -1
    )
    diverged = (mine != theirs) | (mine & theirs & tokens_differ)
    has_divergence = diverged.any(dim=1)
    first = torch.where(
        has_divergence, diverged.to(torch.int8).argmax(dim=1), torch.full((samples,), width)
    )
    shared = (
        _padded(case["active_mask"], width, False)
        & _padded(reference["active_mask"], width, False)
        & mine
        & theirs
        & (positions < first.unsqueeze(1))
    )
    divergence = tuple(
        int(f) - int(s) if bool(d) else None
        for f, s, d in zip(first, starts, has_divergence, strict=True)
    )
    return Alignment(mask=shared, starts=starts, first_divergence=divergence)


def movement(alignment: Alignment, case: torch.Tensor, reference: torch.Tensor) -> Movement:
    """Per-side movement of ``case`` logprobs against ``reference`` on the shared tokens."""
    width = int(alignment.mask.shape[1])
    delta = (
        _padded(case, width, 0.0).to(torch.float64)
        - _padded(reference, width, 0.0).to(torch.float64)
    ).abs()
    flat = delta[alignment.mask]
    if flat.numel() == 0:
        return Movement(
            shared_tokens=0,
            max_abs_delta=0.0,
            mean_abs_delta=0.0,
            bitwise_equal_fraction=0.0,
            first_moved_offset=None,
        )
    moved = alignment.mask & (delta != 0)
    offsets = torch.arange(width).expand_as(moved) - alignment.starts.unsqueeze(1)
    return Movement(
        shared_tokens=int(flat.numel()),
        max_abs_delta=float(flat.max()),
        mean_abs_delta=float(flat.mean()),
        bitwise_equal_fraction=float((flat == 0).to(torch.float64).mean()),
        first_moved_offset=int(offsets[moved].min()) if bool(moved.any()) else None,
    )
