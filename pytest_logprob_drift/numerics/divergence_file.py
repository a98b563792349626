"""``divergence.pt``, the sealed form of one case's full-vocabulary diagnostics, and its summary.

Owns which tensors ``divergence.pt`` holds (the per-position reductions on the ``[B, L]`` grid,
the top tokens at the worst positions, the processed-semantics residuals), how they are built
from both sides' full distributions, and the JSON summary (``comparison.json``'s
``full_vocabulary`` and ``semantic_offset`` entries) that is a pure function of them, so that
``verify`` recomputes it exactly. Knows nothing about engines, files on disk or verdicts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from pytest_logprob_drift.numerics.full_vocabulary import (
    DEFAULT_CHUNK_SIZE,
    DIVERGENCE_FIELDS,
    full_vocab_divergence,
    top_contributors,
    worst_rows,
)
from pytest_logprob_drift.numerics.sampling import Truncation
from pytest_logprob_drift.numerics.semantic_offset import (
    processed_residual,
    processing_tensor,
    semantic_offset,
)
from pytest_logprob_drift.records import JsonObject, JSONScalar

__all__ = [
    "SEALED_KEYS",
    "SEALED_TOP_KEYS",
    "SEMANTICS_KEYS",
    "sealed_diagnostics",
    "sealed_tensors",
    "summarize",
]

# ------------------------------------------------------------------------- summaries


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _stats(values: Tensor) -> dict[str, JSONScalar]:
    """mean / p99 / max over the finite values; how many are infinite or NaN."""
    finite = values[torch.isfinite(values)]
    stats: dict[str, JSONScalar] = {
        "mean": None,
        "p99": None,
        "max": None,
        "infinite": int(torch.isinf(values).sum()),
        "nan": int(torch.isnan(values).sum()),
    }
    if finite.numel():
        stats["mean"] = float(finite.mean())
        stats["p99"] = float(torch.quantile(finite, 0.99))
        stats["max"] = float(finite.max())
    return stats


def summarize(
    divergence: Mapping[str, Tensor],
    active: Tensor,
    contributors: Mapping[str, Tensor] | None,
) -> JsonObject:
    """The JSON summary of sealed reductions (``[B, L]`` float64 each, valid where ``active``):
    statistics per reduction, the worst positions by total variation with their top tokens.
    A pure function of the tensors, so ``verify`` recomputes it exactly."""
    positions = active.nonzero()
    summary: JsonObject = {
        "positions": int(positions.shape[0]),
        **{name: _stats(divergence[name][active]) for name in DIVERGENCE_FIELDS[:3]},
        "truncated_positions": int(
            (
                (divergence["log_mass_training_on_rollout_support"][active] != 0)
                | (divergence["log_mass_rollout_on_training_support"][active] != 0)
            ).sum()
        ),
    }
    worst: list[JsonObject] = []
    if contributors is not None:
        for i, row in enumerate(contributors["rows"].tolist()):
            sample, position = (int(v) for v in positions[row].tolist())
            worst.append(
                {
                    "sample": sample,
                    "position": position,
                    **{
                        name: _finite_or_none(float(divergence[name][sample, position]))
                        for name in DIVERGENCE_FIELDS[:3]
                    },
                    "top_tokens": [
                        {
                            "token_id": int(contributors["token_ids"][i, j]),
                            "rollout_logprob": _finite_or_none(
                                float(contributors["rollout_logprobs"][i, j])
                            ),
                            "training_logprob": _finite_or_none(
                                float(contributors["training_logprobs"][i, j])
                            ),
                            "tv_share": float(contributors["tv_share"][i, j]),
                        }
                        for j in range(contributors["token_ids"].shape[1])
                    ],
                }
            )
    summary["worst_positions"] = worst
    return summary


SEALED_TOP_KEYS = (
    "top_rows",
    "top_token_ids",
    "top_rollout_logprobs",
    "top_training_logprobs",
    "top_tv_share",
)
"""``divergence.pt`` holds ``DIVERGENCE_FIELDS`` (float64 ``[B, L]``, 0 where inactive) and
these (the contributors at the worst positions)."""
SEMANTICS_KEYS = ("processed_rollout_residual", "processed_training_residual", "processing")
"""The semantic-offset diagnostic's evidence: ``processed_residual`` of each side against the
other's full logits (float64 ``[B, L]``, 0 where inactive, NaN everywhere when no sampling was
declared) and the declared ``processing_tensor``."""
SEALED_KEYS = frozenset((*DIVERGENCE_FIELDS, *SEALED_TOP_KEYS, *SEMANTICS_KEYS))


def sealed_tensors(
    rollout_full: Tensor,
    training_full: Tensor,
    active: Tensor,
    *,
    top_k: int,
    worst_positions: int,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    truncation: Truncation | None = None,
    token_ids: Tensor | None = None,
    rollout_logprobs: Tensor | None = None,
    training_logprobs: Tensor | None = None,
) -> dict[str, Tensor]:
    """What ``divergence.pt`` seals for one case: the per-position reductions scattered onto
    the ``[B, L]`` grid of ``active``, the top tokens at the worst positions (by total
    variation) and the processed-semantics residuals (``SEMANTICS_KEYS``; computed when
    ``truncation``, the declared sampling, and the ``[B, L]`` ``token_ids`` and both sides'
    sampled-token logprobs are given). ``rollout_full`` / ``training_full`` are ``[A, V]``,
    one row per active position in row-major order."""
    count = int(active.sum())
    if rollout_full.shape[0] != count or training_full.shape[0] != count:
        raise ValueError(
            f"full distributions have {rollout_full.shape[0]} (rollout) and "
            f"{training_full.shape[0]} (training) rows for {count} active positions"
        )
    reductions = full_vocab_divergence(rollout_full, training_full, chunk_size=chunk_size)
    sealed: dict[str, Tensor] = {}
    for name, values in reductions.tensors().items():
        grid = torch.zeros(active.shape, dtype=torch.float64)
        grid[active.cpu()] = values.cpu()
        sealed[name] = grid
    rows = worst_rows(reductions.total_variation.cpu(), worst_positions)
    top = top_contributors(rollout_full, training_full, rows.to(rollout_full.device), k=top_k)
    sealed.update(
        {
            "top_rows": top.rows,
            "top_token_ids": top.token_ids,
            "top_rollout_logprobs": top.rollout_logprobs,
            "top_training_logprobs": top.training_logprobs,
            "top_tv_share": top.tv_share,
        }
    )
    sealed.update(
        _semantics(
            rollout_full,
            training_full,
            active,
            truncation,
            token_ids,
            rollout_logprobs,
            training_logprobs,
        )
    )
    return sealed


def _semantics(
    rollout_full: Tensor,
    training_full: Tensor,
    active: Tensor,
    truncation: Truncation | None,
    token_ids: Tensor | None,
    rollout_logprobs: Tensor | None,
    training_logprobs: Tensor | None,
) -> dict[str, Tensor]:
    mask = active.cpu()
    out = {
        "processed_rollout_residual": torch.full(mask.shape, math.nan, dtype=torch.float64),
        "processed_training_residual": torch.full(mask.shape, math.nan, dtype=torch.float64),
        "processing": processing_tensor(truncation),
    }
    if (
        truncation is None
        or token_ids is None
        or rollout_logprobs is None
        or training_logprobs is None
    ):
        out["processing"] = processing_tensor(None)
        return out
    tokens = token_ids.cpu()[mask]
    for name, reported, other in (
        ("processed_rollout_residual", rollout_logprobs, training_full),
        ("processed_training_residual", training_logprobs, rollout_full),
    ):
        grid = torch.zeros(mask.shape, dtype=torch.float64)
        grid[mask] = processed_residual(reported.cpu()[mask], other, tokens, truncation)
        out[name] = grid
    return out


def sealed_diagnostics(
    sealed: Mapping[str, Tensor], training: Tensor, rollout: Tensor, active: Tensor
) -> dict[str, Any]:
    """comparison.json's ``full_vocabulary`` and ``semantic_offset`` diagnostics, from the
    sealed tensors and the sampled-token logprobs alone (what ``verify`` recomputes)."""
    missing = SEALED_KEYS - set(sealed)
    if missing:
        raise ValueError(f"sealed divergence lacks {sorted(missing)}")
    for name in DIVERGENCE_FIELDS:
        if sealed[name].shape != active.shape or sealed[name].dtype != torch.float64:
            raise ValueError(f"{name} is not float64 {tuple(active.shape)}")
    rows = sealed["top_rows"]
    if rows.dim() != 1 or rows.dtype != torch.long:
        raise ValueError("top_rows must be int64 [W]")
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= int(active.sum())):
        raise ValueError("top_rows names a position that is not active")
    contributors = {
        "rows": rows,
        "token_ids": sealed["top_token_ids"],
        "rollout_logprobs": sealed["top_rollout_logprobs"],
        "training_logprobs": sealed["top_training_logprobs"],
        "tv_share": sealed["top_tv_share"],
    }
    width = (rows.numel(),)
    for name, tensor in contributors.items():
        if name != "rows" and (tensor.dim() != 2 or tensor.shape[:1] != width):
            raise ValueError(f"top_{name} must be [{rows.numel()}, k]")
    for name in SEMANTICS_KEYS[:2]:
        if sealed[name].shape != active.shape or sealed[name].dtype != torch.float64:
            raise ValueError(f"{name} is not float64 {tuple(active.shape)}")
    if sealed["processing"].shape != (4,) or sealed["processing"].dtype != torch.float64:
        raise ValueError("processing is not float64 [4]")
    offset = semantic_offset(
        training,
        rollout,
        active,
        sealed["log_mass_training_on_rollout_support"],
        sealed["log_mass_rollout_on_training_support"],
        processed_rollout_residual=sealed["processed_rollout_residual"],
        processed_training_residual=sealed["processed_training_residual"],
        processing=sealed["processing"],
    )
    return {
        "full_vocabulary": summarize(sealed, active, contributors),
        "semantic_offset": offset.to_json(),
    }
