"""How much each sample (row) of a judged case drifts, and the ranking of the worst samples.

Owns the per-row figures of one ``[B, T]`` case, as a pure function of ``(training_logprobs,
rollout_logprobs, active_mask, threshold)`` (what ``token_diffs.pt`` holds): each row's active
tokens, its mismatching active tokens (the contract's rule, ``|training - rollout| >
threshold`` in float64, equality passes) and its max |diff| over its active tokens; and the one
order "the samples with the most drift" are ranked by: most mismatching active tokens first,
then the largest max |diff|, then the earlier step and the earlier row (so the ranking is a
total order and the same data always gives the same list). A row without an active token has
no max |diff| and is never ranked. Never a verdict; knows nothing about files or formats.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class SampleDrift:
    """One row of a case: where it is and how much it drifts."""

    step: int
    """The case's training step (0 for a case that is not a step)."""
    row: int
    active: int
    mismatches: int
    max_abs_diff: float

    def rank_key(self) -> tuple[int, float, int, int]:
        """Sorts the worst first: most mismatches, then largest max |diff|, then earlier
        step and row."""
        return (-self.mismatches, -self.max_abs_diff, self.step, self.row)


def sample_drift(
    training: torch.Tensor,
    rollout: torch.Tensor,
    active: torch.Tensor,
    threshold: float,
    *,
    step: int = 0,
) -> list[SampleDrift]:
    """Every row with at least one active token, in row order (``ValueError`` on shapes that
    differ or a mask that is not bool). Non-finite active scores give a NaN max: rank only
    judged cases (PASS or MISMATCH), whose active scores are finite."""
    if training.shape != rollout.shape or training.shape != active.shape or training.dim() != 2:
        raise ValueError(
            f"expected three [B, T] tensors of one shape, got {tuple(training.shape)}, "
            f"{tuple(rollout.shape)}, {tuple(active.shape)}"
        )
    if active.dtype != torch.bool:
        raise ValueError(f"active_mask has dtype {active.dtype}, expected torch.bool")
    diff = (training.to(torch.float64) - rollout.to(torch.float64)).abs()
    counts = active.sum(dim=1)
    mismatches = (active & (diff > threshold)).sum(dim=1)
    peaks = torch.where(active, diff, torch.zeros_like(diff)).amax(dim=1)
    return [
        SampleDrift(
            step=step,
            row=row,
            active=int(counts[row]),
            mismatches=int(mismatches[row]),
            max_abs_diff=float(peaks[row]),
        )
        for row in range(int(active.shape[0]))
        if int(counts[row]) > 0
    ]


def worst(samples: list[SampleDrift], k: int) -> list[SampleDrift]:
    """The ``k`` worst of ``samples`` by ``SampleDrift.rank_key``."""
    return sorted(samples, key=SampleDrift.rank_key)[:k]
