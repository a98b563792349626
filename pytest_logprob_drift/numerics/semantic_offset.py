"""The semantic-offset diagnostic: whether a case's differences are the sampling semantics.

Owns the two explanations a case's ``training - rollout`` can have besides numerical noise: a
per-position ``log S`` (a truncation renormalization at temperature 1), or, at any temperature,
one side reporting the processed distribution (``numerics.sampling``) of the other side's full
logits, recomputed here. Never a verdict. Knows nothing about engines, files or thresholds.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from pytest_logprob_drift.numerics.comparison import SemanticOffsetSummary
from pytest_logprob_drift.numerics.sampling import Truncation, processed_logits

__all__ = [
    "EXPLANATIONS",
    "OFFSET_MIN_FRACTION",
    "OFFSET_TOLERANCE",
    "processed_residual",
    "processing_tensor",
    "semantic_offset",
]

OFFSET_TOLERANCE = 1e-5
"""|diff - predicted offset| below which a position counts as explained."""
OFFSET_MIN_FRACTION = 0.9
"""Share of active positions that must be explained for the diagnostic to fire."""


_PROCESSED_BLOCK_BYTES = 64 << 20
"""Bytes of one row block of the processed recompute (float32 ``b x V``; top_p sorts it)."""


def processed_residual(
    reported: Tensor, full: Tensor, token_ids: Tensor, how: Truncation
) -> Tensor:
    """float64 ``[A]``: ``|reported - log_softmax(processed_logits(full))[token]|`` per row.

    The hypothesis "this side reported the processed logprob (``how``: the declared
    temperature and truncation, ``sampling.processed_logits``) of the other side's
    distribution": ``full`` is the other side's ``[A, V]`` logits (or logprobs: a constant
    shift per row changes nothing, temperature and truncation included), ``reported`` this
    side's sampled-token logprobs ``[A]`` and ``token_ids`` the sampled tokens ``[A]``. Row
    blocks of about 64 MiB of float32, whatever A. NaN where a row is not a distribution."""
    rows, vocab = full.shape
    out = torch.full((rows,), math.nan, dtype=torch.float64)
    block = max(1, _PROCESSED_BLOCK_BYTES // max(1, 4 * vocab))
    for r0 in range(0, rows, block):
        r1 = min(rows, r0 + block)
        logp = torch.log_softmax(processed_logits(full[r0:r1], how), dim=-1)
        picked = logp.gather(-1, token_ids[r0:r1].long().unsqueeze(-1).to(logp.device))
        out[r0:r1] = (reported[r0:r1].double().cpu() - picked.squeeze(-1).double().cpu()).abs()
    return out


EXPLANATIONS = ("truncation_renormalization", "processed_rollout", "processed_training")
"""What the semantic-offset diagnostic can say explains a case's differences: a per-position
``log S`` (truncation renormalization at temperature 1), the rollout's processed logprobs of
the trainer's logits, or the trainer's processed logprobs of the rollout's logits."""


def _processing_text(processing: Tensor) -> str:
    """``temperature 0.7, top_p 0.9`` from the sealed ``[temperature, top_p, top_k, min_p]``."""
    t, p, k, m = (float(v) for v in processing.tolist())
    parts = [f"temperature {t:g}"]
    if not math.isnan(p):
        parts.append(f"top_p {p:g}")
    if not math.isnan(k):
        parts.append(f"top_k {int(k)}")
    if not math.isnan(m):
        parts.append(f"min_p {m:g}")
    return ", ".join(parts)


def processing_tensor(how: Truncation | None) -> Tensor:
    """float64 ``[4]``: ``[temperature, top_p, top_k, min_p]`` (NaN: not given / no truncation
    declared), sealed so that the diagnostic's text is recomputed offline."""
    if how is None:
        return torch.full((4,), math.nan, dtype=torch.float64)
    values = [how.temperature, how.top_p, how.top_k, how.min_p]
    return torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float64)


def _processing_changes_logits(processing: Tensor) -> bool:
    """Whether the declared processing changes a distribution at all (not greedy, and a
    temperature other than 1 or some truncation)."""
    t, p, k, m = (float(v) for v in processing.tolist())
    if math.isnan(t) or t < 1e-5:
        return False
    return t != 1.0 or (not math.isnan(p) and p < 1.0) or not math.isnan(k) or m > 0.0


def semantic_offset(
    training: Tensor,
    rollout: Tensor,
    active: Tensor,
    log_mass_training_on_rollout_support: Tensor,
    log_mass_rollout_on_training_support: Tensor,
    *,
    processed_rollout_residual: Tensor | None = None,
    processed_training_residual: Tensor | None = None,
    processing: Tensor | None = None,
    tolerance: float = OFFSET_TOLERANCE,
    min_fraction: float = OFFSET_MIN_FRACTION,
) -> SemanticOffsetSummary:
    """Do the sampling semantics explain the selected-token differences, and how?

    1. Truncation renormalization (temperature 1): when the rollout renormalizes over a
       truncated support (processed logprobs) and the trainer does not, ``log p_r = log p_t -
       log S`` on the support, with ``S`` the trainer's mass on the rollout's support:
       ``training - rollout = log S``; the other way round ``-log S'``. The prediction is
       ``log_mass_training_on_rollout_support - log_mass_rollout_on_training_support`` per
       position (0 where the supports agree). It fires when some active position is truncated
       by more than ``tolerance`` and at least ``min_fraction`` of the active positions match.
    2. Processed semantics at any temperature: at temperature ``T`` the difference is no
       per-position constant (``log p_r = z/T - logsumexp_S(z/T)`` against ``z -
       logsumexp(z)``), so the processed distribution is recomputed from the other side's full
       logits at the declared temperature and truncation (``processed_residual``, sealed as
       ``processed_rollout_residual`` / ``processed_training_residual``). A side's hypothesis
       fires when the declared processing changes a distribution at all, at least
       ``min_fraction`` of the active positions match within ``tolerance``, and plain
       agreement (``|diff| <= tolerance``) does not already cover ``min_fraction`` of them.
    The first explanation that fires, in that order, is the one reported.
    """
    diff = training.double()[active] - rollout.double()[active]
    predicted = (
        log_mass_training_on_rollout_support[active] - log_mass_rollout_on_training_support[active]
    )
    n = int(diff.numel())
    truncated = int((predicted.abs() > tolerance).sum())
    matched = (diff - predicted).abs() <= tolerance
    fraction = float(matched.double().mean()) if n else 0.0
    if truncated > 0 and fraction >= min_fraction:
        return SemanticOffsetSummary(
            fires=True,
            explanation=EXPLANATIONS[0],
            explained_fraction=fraction,
            truncated_positions=truncated,
            tolerance=tolerance,
            message=(
                f"truncation renormalization: |diff| matches log S within {tolerance:g} at "
                f"{100 * fraction:.0f}% of positions ({truncated} of {n} truncated): the sides "
                "apply different sampling semantics, not different arithmetic"
            ),
        )
    agree = float((diff.abs() <= tolerance).double().mean()) if n else 0.0
    hypotheses = (
        (EXPLANATIONS[1], processed_rollout_residual, "rollout", "trainer"),
        (EXPLANATIONS[2], processed_training_residual, "trainer", "rollout"),
    )
    if processing is not None and n and agree < min_fraction:
        if _processing_changes_logits(processing):
            for name, residual, side, other in hypotheses:
                if residual is None:
                    continue
                explained = float((residual[active] <= tolerance).double().mean())
                if explained >= min_fraction:
                    return SemanticOffsetSummary(
                        fires=True,
                        explanation=name,
                        explained_fraction=explained,
                        truncated_positions=truncated,
                        tolerance=tolerance,
                        message=(
                            f"processed semantics: the {side}'s logprobs match the processed "
                            f"distribution ({_processing_text(processing)}) recomputed from "
                            f"the {other}'s full logits within {tolerance:g} at "
                            f"{100 * explained:.0f}% of positions: the {side} reports "
                            f"processed logprobs and the {other} raw ones, not different "
                            "arithmetic"
                        ),
                    )
    if truncated:
        message = (
            f"supports differ at {truncated} of {n} positions, but log S explains only "
            f"{100 * fraction:.0f}% of the differences"
        )
    else:
        message = "no truncation offset: both sides put mass on the same tokens"
    return SemanticOffsetSummary(
        fires=False,
        explanation=None,
        explained_fraction=fraction,
        truncated_positions=truncated,
        tolerance=tolerance,
        message=message,
    )


# ------------------------------------------------------------------------- sealed form
