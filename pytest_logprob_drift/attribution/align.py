"""Aligning two executions of the same prompts token by token, and how far each side moved.

Owns pairing the sampled responses of two sealed executions (a case and its reference: the
baseline, a pairwise case's single-knob parent, or a repeat of the baseline) sample by sample:
response tokens are paired only while both executions sampled the same token ids, up to the
first divergence (a differing token, or one response ending earlier), and only where both
score them (active). On those shared tokens it measures, per side, how far the logprobs moved:
max and mean |delta| and the fraction that is bitwise equal. Different token ids are never
paired. Knows nothing about files, verdicts or runtimes; works on the canonical tensors
(``token_ids``, ``attention_mask``, ``active_mask``, ``prompt_lengths``, per-side logprobs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class Alignment:
    """Which positions of the case pair with which of the reference, per sample."""

    shared: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    """Per sample: (positions in the case, positions in the reference), same length."""
    offsets: tuple[torch.Tensor, ...]
    """Per sample: the response offsets (0 = first sampled token) of the shared tokens."""
    first_divergence: tuple[int | None, ...]
    """Per sample: the response offset of the first token that differs (None: identical)."""

    @property
    def shared_tokens(self) -> int:
        return sum(int(case.numel()) for case, _ in self.shared)

    @property
    def earliest_divergence(self) -> int | None:
        found = [d for d in self.first_divergence if d is not None]
        return min(found) if found else None


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


def _response(batch: Mapping[str, torch.Tensor], sample: int) -> tuple[torch.Tensor, int]:
    """The valid response token ids of one sample, and where the response starts."""
    start = int(batch["prompt_lengths"][sample])
    length = int(batch["attention_mask"][sample].sum())
    return batch["token_ids"][sample, start:length], start


def align(case: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor]) -> Alignment:
    """Pair the two executions' response tokens sample by sample (same prompts assumed)."""
    samples = int(case["token_ids"].shape[0])
    if int(reference["token_ids"].shape[0]) != samples:
        raise ValueError(
            f"the executions have {samples} and {int(reference['token_ids'].shape[0])} samples"
        )
    shared: list[tuple[torch.Tensor, torch.Tensor]] = []
    offsets: list[torch.Tensor] = []
    divergence: list[int | None] = []
    for i in range(samples):
        mine, my_start = _response(case, i)
        theirs, their_start = _response(reference, i)
        common = min(int(mine.numel()), int(theirs.numel()))
        differs = (mine[:common] != theirs[:common]).nonzero()
        if differs.numel():
            first: int | None = int(differs[0, 0])
        elif mine.numel() != theirs.numel():
            first = common  # one response ended (or ran on) where the other did not
        else:
            first = None
        prefix = common if first is None else first
        candidates = torch.arange(prefix)
        both = (
            case["active_mask"][i, my_start + candidates]
            & reference["active_mask"][i, their_start + candidates]
        )
        kept = candidates[both]
        shared.append((my_start + kept, their_start + kept))
        offsets.append(kept)
        divergence.append(first)
    return Alignment(
        shared=tuple(shared), offsets=tuple(offsets), first_divergence=tuple(divergence)
    )


def movement(alignment: Alignment, case: torch.Tensor, reference: torch.Tensor) -> Movement:
    """Per-side movement of ``case`` logprobs against ``reference`` on the shared tokens."""
    deltas = [
        (case[i, mine].to(torch.float64) - reference[i, theirs].to(torch.float64)).abs()
        for i, (mine, theirs) in enumerate(alignment.shared)
    ]
    flat = torch.cat(deltas) if deltas else torch.zeros(0, dtype=torch.float64)
    if flat.numel() == 0:
        return Movement(
            shared_tokens=0,
            max_abs_delta=0.0,
            mean_abs_delta=0.0,
            bitwise_equal_fraction=0.0,
            first_moved_offset=None,
        )
    moved = [
        int(offsets[delta != 0].min())
        for delta, offsets in zip(deltas, alignment.offsets, strict=True)
        if bool((delta != 0).any())
    ]
    return Movement(
        shared_tokens=int(flat.numel()),
        max_abs_delta=float(flat.max()),
        mean_abs_delta=float(flat.mean()),
        bitwise_equal_fraction=float((flat == 0).to(torch.float64).mean()),
        first_moved_offset=min(moved) if moved else None,
    )
