"""The drift figures an RL framework logs, computed from an imported step as that framework does.

Owns slime's ``train_rollout_logprob_abs_diff`` (``slime_figures``) and the contract's rule
applied apart to the tokens a run masked itself (``masked_by_run``: NeMo-RL's
``grpo.seq_logprob_error_threshold`` overwrites ``sample_mask`` before the step is logged, so
the sequences it dropped for drift look inactive). None of them is a verdict: the contract's
rule on the active tokens is the only one. Knows nothing about files, formats or the store.

slime (``slime/backends/megatron_utils/loss.py`` ``policy_loss_function``, ``cp_utils.py``
``get_sum_of_sample_mean`` and ``reduce_train_step_metrics``, at v0.3.1 and on main): the
figure of one training step is ``sum_i sum_t |log_probs - rollout_log_probs| * loss_mask /
max(D_i, 1)`` over its samples, ``D_i`` the loss-mask total of sample ``i``'s rollout group
(``rollout_mask_sums``; a sample's own total when every sample is its own rollout), divided by
the step's ``global_batch_size`` (its rollout count). With ``--calculate-per-token-loss`` it is
``sum_i sum_t |diff| * loss_mask / sum_i max(sum_t loss_mask, 1)``, the token mean. The
difference is multiplied by the mask as slime does, so a NaN at an inactive position makes the
figure NaN in slime and absent here (a sealed figure is finite).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_logprob_drift.records import JsonObject

if TYPE_CHECKING:  # the report reads the keys below without torch
    import torch

SLIME_FIGURE = "slime_train_rollout_logprob_abs_diff"
SLIME_PER_TOKEN_FIGURE = "slime_train_rollout_logprob_abs_diff_per_token_loss"


@dataclass(frozen=True, slots=True, kw_only=True)
class SlimeBatch:
    """What slime's figure needs beyond the token grid: each row's denominator (its rollout
    group's loss-mask total, ``D_i``) and the step's global batch size (None when the rollout
    was trained in several steps, each logging its own figure over samples the dump does not
    tell apart)."""

    denominators: tuple[float, ...]
    global_batch_size: int | None


def slime_denominators(
    masks: Sequence[float], groups: Sequence[int | None], recorded: Sequence[float | None]
) -> tuple[float, ...]:
    """Each sample's ``D_i``: the ``rollout_mask_sums`` slime recorded for it, else the summed
    loss-mask totals of the samples sharing its ``rollout_ids`` group (its own total when it
    has none), as ``generate_train_data`` computes them."""
    totals: dict[int, float] = {}
    for total, group in zip(masks, groups, strict=True):
        if group is not None:
            totals[group] = totals.get(group, 0.0) + total
    return tuple(
        float(r) if r is not None else (totals[g] if g is not None else float(m))
        for m, g, r in zip(masks, groups, recorded, strict=True)
    )


def slime_figures(
    training: torch.Tensor, rollout: torch.Tensor, active: torch.Tensor, batch: SlimeBatch
) -> JsonObject:
    """slime's figure in both modes over a ``[B, T]`` grid (rows = samples), finite ones only
    (float64 on the logged values); none for a rollout trained in several steps."""
    import torch

    figures: JsonObject = {}
    if batch.global_batch_size is None or batch.global_batch_size <= 0:
        return figures  # several training steps: each logged its own figure
    masked = (training.to(torch.float64) - rollout.to(torch.float64)).abs() * active
    sums = masked.sum(dim=1)
    tokens = active.sum(dim=1).to(torch.float64).clamp(min=1.0)
    per_token = float(sums.sum() / tokens.sum())
    if math.isfinite(per_token):
        figures[SLIME_PER_TOKEN_FIGURE] = per_token
    denominators = torch.tensor(batch.denominators, dtype=torch.float64).clamp(min=1.0)
    per_sample = float((sums / denominators).sum() / batch.global_batch_size)
    if math.isfinite(per_sample):
        figures[SLIME_FIGURE] = per_sample
    return figures


MASKED_BY_RUN = "masked_by_run"


def masked_by_run(
    training: torch.Tensor, rollout: torch.Tensor, masked: torch.Tensor, threshold: float
) -> JsonObject:
    """The ``masked`` tokens (``[B, T]``, the run's own mask) judged apart by the contract's
    rule: samples, tokens, mismatches (``|diff| > threshold``), the largest finite |diff|
    (None: none) and the non-finite tokens among them."""
    import torch

    diff = (training.to(torch.float64) - rollout.to(torch.float64)).abs()[masked]
    finite = torch.isfinite(diff)
    return {
        "samples": int(masked.any(dim=1).sum()),
        "tokens": int(masked.sum()),
        "mismatches": int((diff > threshold).sum()),
        "max_abs_diff": float(diff[finite].max()) if bool(finite.any()) else None,
        "nonfinite_tokens": int((~finite).sum()),
    }
