"""The drift signatures of a sealed attempt: computed, checked, or supplied.

Owns computing ``diagnostics.signatures`` from the tensors of ``token_diffs.pt``
(``numerics.signatures.step_signatures``, a pure function of them) and deciding whether a
recorded list agrees with that recomputation: a list that differs, or one recorded for an
outcome without scores, is refused. Attempts sealed before signatures existed get them
computed here at read time, never by executing anything again. Called through the signatures
diagnostic's ``check`` by ``check.resume``. Never writes anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec
import torch

from pytest_logprob_drift.check.rejudge import ABS_TOLERANCE, REL_TOLERANCE
from pytest_logprob_drift.diagnostics.signatures.diagnostic import SIGNED_OUTCOMES
from pytest_logprob_drift.numerics.comparison import Comparison
from pytest_logprob_drift.numerics.score_signatures import signatures
from pytest_logprob_drift.numerics.signature_record import SealedSignature
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.seal import SealError


def signatures_of_diffs(diffs: Mapping[str, torch.Tensor]) -> tuple[SealedSignature, ...]:
    """The signatures of ``token_diffs.pt``'s tensors; a SealError on token_diffs.pt when they
    cannot give them."""
    try:
        return signatures(
            diffs["training_logprobs"], diffs["rollout_logprobs"], diffs["active_mask"]
        )
    except (KeyError, ValueError) as exc:
        raise SealError(layout.TOKEN_DIFFS, f"signatures: {exc}") from None


def check_signatures(
    comparison: Comparison, diffs: Mapping[str, torch.Tensor]
) -> tuple[SealedSignature, ...] | None:
    """The attempt's signatures: the recorded list when it equals the one recomputed from
    ``diffs``, that recomputation when none is recorded (sealed before signatures existed),
    None for an outcome without scores. A SealError on comparison.json for a recorded list that
    differs or that its outcome should not have."""
    recorded = comparison.diagnostics.signatures
    if comparison.outcome not in SIGNED_OUTCOMES:
        if recorded is not None:
            raise SealError(
                layout.COMPARISON, f"records signatures for outcome {comparison.outcome.value}"
            )
        return None
    recomputed = signatures_of_diffs(diffs)
    if recorded is not None and not _same_list(recorded, recomputed):
        index = next(
            (
                i
                for i, (a, b) in enumerate(zip(recorded, recomputed, strict=False))
                if not _same(a, b)
            ),
            min(len(recorded), len(recomputed)),
        )
        raise SealError(
            layout.COMPARISON,
            f"diagnostics.signatures[{index}] differs from the signatures recomputed offline "
            "from token_diffs.pt",
        )
    return recomputed


def _same_list(
    recorded: tuple[SealedSignature, ...], recomputed: tuple[SealedSignature, ...]
) -> bool:
    return len(recorded) == len(recomputed) and all(map(_same, recorded, recomputed))


def _same(recorded: SealedSignature, recomputed: SealedSignature) -> bool:
    """Equal ids, scopes, samples and evidence keys; evidence figures equal within the
    re-judge's relative tolerance (a float64 statistic recomputed on another CPU may differ
    in its last bits), row and position lists exactly."""
    if (recorded.id, recorded.scope, recorded.sample) != (
        recomputed.id,
        recomputed.scope,
        recomputed.sample,
    ) or recorded.evidence.keys() != recomputed.evidence.keys():
        return False
    for key, value in recorded.evidence.items():
        other = recomputed.evidence[key]
        if isinstance(value, float) or isinstance(other, float):
            if isinstance(value, tuple) or isinstance(other, tuple):
                return False
            if not math.isclose(value, other, rel_tol=REL_TOLERANCE, abs_tol=ABS_TOLERANCE):
                return False
        elif value != other:
            return False
    return True


def with_signatures(comparison: Comparison, part: tuple[SealedSignature, ...] | None) -> Comparison:
    """``comparison`` with ``part`` as its signatures (the recorded list stays; one computed
    at read time fills a comparison sealed without it)."""
    if part is None or comparison.diagnostics.signatures is not None:
        return comparison
    diagnostics = msgspec.structs.replace(comparison.diagnostics, signatures=part)
    return msgspec.structs.replace(comparison, diagnostics=diagnostics)
