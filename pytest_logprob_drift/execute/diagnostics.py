"""Full-vocabulary diagnostics of one executed case: what is sealed and what is summarized.

Owns turning the two sides' full next-token distributions (``RolloutOutput.full_vocab`` and
``TrainingOutput.full_vocab``, ``[A, V]`` each) into the tensors sealed as ``divergence.pt``
(per-position reductions, the top tokens at the worst positions and the processed-semantics
residuals at the identity's temperature and truncation, never an ``[A, V]`` tensor) and the
``full_vocabulary`` / ``semantic_offset`` entries of comparison.json's diagnostics, or into the
reason they are unavailable. Never changes a verdict. Used by
``execute.case``; the reductions and the summary are ``divergence``'s. Knows no engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pytest_logprob_drift.execute.protocol import RolloutOutput, TrainingOutput
from pytest_logprob_drift.numerics.divergence_file import sealed_diagnostics, sealed_tensors
from pytest_logprob_drift.numerics.sampling import Truncation
from pytest_logprob_drift.records import FullVocabularySpec, SamplingSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseDiagnostics:
    """``tensors`` to seal (None when unavailable) and the comparison.json entries."""

    tensors: dict[str, torch.Tensor] | None
    entries: dict[str, Any]


def full_vocabulary(
    spec: FullVocabularySpec,
    rollout: RolloutOutput,
    training: TrainingOutput,
    *,
    sampling: SamplingSpec | None = None,
) -> CaseDiagnostics:
    """The case's full-vocabulary diagnostics, or why there are none. ``sampling`` (the
    identity's) is the processing the semantic-offset diagnostic recomputes from each side's
    full logits (temperature and truncation); without it only the ``log S`` explanation can
    fire."""
    missing = [
        side
        for side, full in (("rollout", rollout.full_vocab), ("training", training.full_vocab))
        if full is None
    ]
    if missing:
        return _unavailable(
            f"the {' and '.join(missing)} side did not hand back its full distributions "
            "(this runtime or configuration does not provide them)"
        )
    active = rollout.tensors["active_mask"]
    try:
        tensors = sealed_tensors(
            rollout.full_vocab,
            training.full_vocab,
            active,
            top_k=spec.top_k,
            worst_positions=spec.worst_positions,
            truncation=None if sampling is None else Truncation.of(sampling),
            token_ids=rollout.tensors["token_ids"],
            rollout_logprobs=rollout.tensors["logprobs"],
            training_logprobs=training.logprobs,
        )
    except (ValueError, TypeError) as exc:
        return _unavailable(f"the full distributions do not fit the case: {exc}")
    entries = sealed_diagnostics(
        tensors, training.logprobs, rollout.tensors["logprobs"], active.cpu()
    )
    if rollout.sampler is not None:  # execution evidence: which sampler is reproduced, vs what
        entries["semantic_offset"]["reproduces"] = reproduction_statement(rollout.sampler)
    return CaseDiagnostics(tensors=tensors, entries=entries)


def reproduction_statement(sampler: str) -> str:
    """What the semantic-offset diagnostic reproduces, against the rollout's own sampler."""
    return f"numerics.sampling (vLLM's CPU sampler's rules); the rollout sampled with {sampler}"


def _unavailable(reason: str) -> CaseDiagnostics:
    return CaseDiagnostics(tensors=None, entries={"full_vocabulary": {"unavailable": reason}})
