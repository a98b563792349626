"""Offline check of an attempt's sealed full-vocabulary diagnostics.

Owns deciding whether ``divergence.pt`` and the ``full_vocabulary`` / ``semantic_offset``
entries of comparison.json agree: the summary is recomputed from the sealed tensors and the
sampled-token logprobs of ``token_diffs.pt`` alone (``divergence.sealed_diagnostics``) and must
equal what comparison.json records (its tensors on ``token_diffs.pt``'s grid); a summary
recorded without its tensors is refused. Used by ``check.resume`` (so resume, ``verify`` and
the report all apply it). Never writes anything; knows nothing about engines.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
import torch

from pytest_logprob_drift.numerics.comparison import (
    Diagnostics,
    SemanticOffsetSummary,
    from_builtins,
)
from pytest_logprob_drift.numerics.divergence_file import (
    SEALED_KEYS,
    sealed_diagnostics,
)
from pytest_logprob_drift.numerics.full_vocabulary import DIVERGENCE_FIELDS
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.seal import SealError


def check_divergence(
    recorded: Diagnostics,
    divergence: Mapping[str, torch.Tensor] | None,
    diffs: Mapping[str, torch.Tensor],
) -> None:
    """Raise SealError naming the file at fault unless comparison.json's ``recorded``
    diagnostics and the sealed ``divergence`` tensors are consistent."""
    if divergence is None:
        if recorded.semantic_offset is not None or recorded.full_summary is not None:
            raise SealError(
                layout.DIVERGENCE,
                "comparison.json records full-vocabulary diagnostics but they are not sealed",
            )
        return
    if set(divergence) != SEALED_KEYS:
        raise SealError(
            layout.DIVERGENCE, f"expected tensors {sorted(SEALED_KEYS)}, found {sorted(divergence)}"
        )
    grid = diffs["active_mask"].shape
    if divergence[DIVERGENCE_FIELDS[0]].shape != grid:
        raise SealError(
            layout.DIVERGENCE,
            f"tensors on a {list(divergence[DIVERGENCE_FIELDS[0]].shape)} grid, token_diffs.pt's "
            f"active mask is {list(grid)}",
        )
    try:
        recomputed = sealed_diagnostics(
            divergence,
            diffs["training_logprobs"],
            diffs["rollout_logprobs"],
            diffs["active_mask"],
        )
        parts = from_builtins(recomputed, Diagnostics)
    except ValueError as exc:  # e.g. a non-finite recomputed value
        raise SealError(layout.DIVERGENCE, str(exc)) from None
    for key, want, got in (
        ("full_vocabulary", parts.full_vocabulary, recorded.full_vocabulary),
        ("semantic_offset", parts.semantic_offset, _without_execution_evidence(recorded)),
    ):
        if want != got:
            raise SealError(
                layout.DIVERGENCE,
                f"the {key} summary recomputed offline differs from comparison.json's",
            )


def _without_execution_evidence(recorded: Diagnostics) -> SemanticOffsetSummary | None:
    """The recorded semantic-offset summary less what execution alone knows (``reproduces``:
    the rollout's sampler), i.e. what the sealed tensors determine."""
    offset = recorded.semantic_offset
    return None if offset is None else msgspec.structs.replace(offset, reproduces=None)
