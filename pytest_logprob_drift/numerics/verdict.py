"""Identity validation and the fixed-threshold verdict.

Owns the only pass/fail rule of the contract::

    mismatch_mask = active_mask & (abs(training_logprobs - rollout_logprobs) > threshold)

evaluated in float64 on float32 (or narrower) scores: widening is exact and the difference of
two nearby float32 values is exact in float64, so the comparison itself adds no rounding that
could flip a verdict at the boundary; equality with the threshold is not a mismatch. Identity is
checked first (checkpoint, tokenizer, token ids, masks, positions, cache and packing, pre-update
state): any difference is INVALID_IDENTITY naming the field, never numerical drift. Zero active
tokens is ZERO_ACTIVE_TOKENS; non-floating or non-finite active scores are INVALID_ARTIFACT (a
non-finite one with its real ``active_tokens`` and the ``nonfinite_tokens`` among them; one
sealed with ``active_tokens`` 0 and no ``nonfinite_tokens`` is of the earlier form,
``NumericCheck.as_sealed``).
Diagnostics (mean, percentiles, max, ratio, worst tokens, KL estimates and the metrics RL
frameworks log) never change the verdict. Knows nothing about engines or files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from pytest_logprob_drift.numerics.comparison import NumericCheck
from pytest_logprob_drift.numerics.importance_sampling import approx_kl_k1, approx_kl_k3
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.records import JsonObject, JsonValue

IDENTITY_TENSORS = ("token_ids", "attention_mask", "active_mask", "position_ids")
WORST_TOKENS = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    outcome: Outcome
    reason: str
    threshold: float
    active_tokens: int
    mismatches: int
    diagnostics: Mapping[str, Any]
    worst_tokens: tuple[Mapping[str, Any], ...]
    identity_violations: tuple[str, ...]
    nonfinite_tokens: int | None = None
    """Active tokens with a non-finite logprob on either side (INVALID_ARTIFACT for
    non-finite scores only; None otherwise)."""

    def to_json(self) -> JsonObject:
        document: JsonObject = {
            "outcome": self.outcome.value,
            "reason": self.reason,
            "threshold": self.threshold,
            "active_tokens": self.active_tokens,
            "mismatches": self.mismatches,
            "diagnostics": dict(self.diagnostics),
            "worst_tokens": [dict(w) for w in self.worst_tokens],
            "identity_violations": list(self.identity_violations),
        }
        if self.nonfinite_tokens is not None:
            document["nonfinite_tokens"] = self.nonfinite_tokens
        return document

    def numeric_check(self) -> NumericCheck:
        """The numerical verdict alone, as comparison.json records it beside the verdict and
        as resume and ``verify`` recompute it from ``token_diffs.pt``."""
        return NumericCheck(
            outcome=self.outcome,
            mismatches=self.mismatches,
            active_tokens=self.active_tokens,
            threshold=self.threshold,
            nonfinite_tokens=self.nonfinite_tokens,
        )


def identity_violations(
    expected: Mapping[str, JsonValue],
    rollout_identity: Mapping[str, JsonValue],
    training_identity: Mapping[str, JsonValue],
    rollout_tensors: Mapping[str, torch.Tensor],
    consumed: Mapping[str, torch.Tensor],
    readonly_violations: tuple[str, ...],
) -> list[str]:
    """Every way the two scorers did not share one logical input (empty when they did)."""
    problems: list[str] = []
    for key in sorted(set(expected) | set(rollout_identity) | set(training_identity)):
        want = expected.get(key)
        r, t = rollout_identity.get(key), training_identity.get(key)
        if key in expected and want is not None:
            for side, got in (("rollout", r), ("training", t)):
                if got != want:
                    problems.append(f"{key}: {side} used {got!r}, identity requires {want!r}")
        elif r != t:
            problems.append(f"{key}: rollout {r!r} != training {t!r}")
    for name in IDENTITY_TENSORS:
        a, b = rollout_tensors.get(name), consumed.get(name)
        if a is None or b is None:
            problems.append(f"{name}: missing on the {'rollout' if a is None else 'training'} side")
        elif a.shape != b.shape:
            problems.append(
                f"{name}: shape {tuple(a.shape)} (rollout) != {tuple(b.shape)} (training)"
            )
        elif not torch.equal(a, b):
            where = (a != b).nonzero()[0].tolist()
            problems.append(f"{name}: differs between rollout and training at {where}")
    problems.extend(f"read-only scorer: {v}" for v in readonly_violations)
    return problems


def _invalid(
    outcome: Outcome, reason: str, threshold: float, violations: tuple[str, ...] = ()
) -> Verdict:
    return Verdict(
        outcome=outcome,
        reason=reason,
        threshold=threshold,
        active_tokens=0,
        mismatches=0,
        diagnostics={},
        worst_tokens=(),
        identity_violations=violations,
    )


def _nonfinite(
    training: torch.Tensor,
    rollout: torch.Tensor,
    active_count: int,
    nonfinite: torch.Tensor,
    threshold: float,
) -> Verdict:
    """INVALID_ARTIFACT for non-finite active scores: the first one named (training side
    first), with the real active count and how many of them are non-finite."""
    count = int(nonfinite.sum())
    bad_training = nonfinite & ~torch.isfinite(training)
    name = "training" if bool(bad_training.any()) else "rollout"
    where = (bad_training if name == "training" else nonfinite).nonzero()[0].tolist()
    return Verdict(
        outcome=Outcome.INVALID_ARTIFACT,
        reason=f"{name} logprob is non-finite at active position {where} ({count} of "
        f"{active_count} active tokens non-finite)",
        threshold=threshold,
        active_tokens=active_count,
        mismatches=0,
        diagnostics={},
        worst_tokens=(),
        identity_violations=(),
        nonfinite_tokens=count,
    )


def mismatch_mask(
    training: torch.Tensor, rollout: torch.Tensor, active: torch.Tensor, threshold: float
) -> torch.Tensor:
    """The contract's rule, exactly: strict ``>``, in float64."""
    diff = torch.abs(training.to(torch.float64) - rollout.to(torch.float64))
    return active & (diff > threshold)


def judge(
    training: torch.Tensor,
    rollout: torch.Tensor,
    active: torch.Tensor,
    threshold: float,
    *,
    violations: tuple[str, ...] = (),
) -> Verdict:
    """The verdict for one case; identity violations win over any numerics."""
    if violations:
        return _invalid(Outcome.INVALID_IDENTITY, violations[0], threshold, violations)
    if active.dtype != torch.bool:
        return _invalid(
            Outcome.INVALID_ARTIFACT,
            f"active_mask has dtype {active.dtype}, expected torch.bool",
            threshold,
        )
    if training.shape != rollout.shape or training.shape != active.shape:
        return _invalid(
            Outcome.INVALID_ARTIFACT,
            f"shapes differ: training "
            f"{tuple(training.shape)}, rollout {tuple(rollout.shape)}, active "
            f"{tuple(active.shape)}",
            threshold,
        )
    for name, scores in (("training", training), ("rollout", rollout)):
        if not scores.is_floating_point():
            return _invalid(
                Outcome.INVALID_ARTIFACT,
                f"{name} logprobs have non-floating dtype {scores.dtype}",
                threshold,
            )
    active_count = int(active.sum())
    if active_count == 0:
        return _invalid(Outcome.ZERO_ACTIVE_TOKENS, "no active tokens to compare", threshold)
    nonfinite = active & ~(torch.isfinite(training) & torch.isfinite(rollout))
    if bool(nonfinite.any()):
        return _nonfinite(training, rollout, active_count, nonfinite, threshold)
    overflow = _overflowing_difference(training, rollout, active)
    if overflow is not None:
        return _invalid(
            Outcome.INVALID_ARTIFACT,
            f"|training - rollout| overflows float64 at active position {overflow} (scores "
            "of about 1e308: not logprobs)",
            threshold,
        )
    mask = mismatch_mask(training, rollout, active, threshold)
    mismatches = int(mask.sum())
    diagnostics, worst = _diagnostics(training, rollout, active)
    diagnostics["mismatch_ratio"] = mismatches / active_count
    if mismatches:
        w = worst[0]
        reason = (
            f"{mismatches}/{active_count} active tokens differ by more than {threshold:g}"
            f"; worst |diff| {w['abs_diff']:.3e} at sample {w['sample']} position "
            f"{w['position']}"
        )
        outcome = Outcome.MISMATCH
    else:
        reason = (
            f"all {active_count} active tokens within {threshold:g} (max |diff| "
            f"{diagnostics['max_abs_diff']:.3e})"
        )
        outcome = Outcome.PASS
    return Verdict(
        outcome=outcome,
        reason=reason,
        threshold=threshold,
        active_tokens=active_count,
        mismatches=mismatches,
        diagnostics=diagnostics,
        worst_tokens=tuple(worst),
        identity_violations=(),
    )


def _overflowing_difference(
    training: torch.Tensor, rollout: torch.Tensor, active: torch.Tensor
) -> list[int] | None:
    """The first active position whose difference of two finite scores is not finite in
    float64 (None: none is)."""
    diff = training.to(torch.float64) - rollout.to(torch.float64)
    bad = active & ~torch.isfinite(diff)
    return bad.nonzero()[0].tolist() if bool(bad.any()) else None


def _overflow_as_none(value: float) -> float | None:
    """A figure that exponentiates: None where it overflows float64 (inf, or NaN from inf -
    inf; ``numerics.comparison.OVERFLOWING_STATISTICS``)."""
    return value if math.isfinite(value) else None


def _diagnostics(
    training: torch.Tensor, rollout: torch.Tensor, active: torch.Tensor
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    t = training.to(torch.float64)[active]
    r = rollout.to(torch.float64)[active]
    signed = t - r
    diff = signed.abs()
    log_ratio = signed  # log(p_train / p_rollout), sampled from the rollout policy
    ascending = torch.sort(diff).values  # one sort: the quantiles and the worst tokens' bar
    quantiles = _quantiles(ascending, (0.5, 0.9, 0.99))
    diagnostics = {
        "mean_abs_diff": float(diff.mean()),
        "p50_abs_diff": float(quantiles[0]),
        "p90_abs_diff": float(quantiles[1]),
        "p99_abs_diff": float(quantiles[2]),
        "max_abs_diff": float(diff.max()),
        "mismatch_ratio": None,
        "approx_kl_k1": approx_kl_k1(log_ratio),
        "approx_kl_k3": _overflow_as_none(approx_kl_k3(log_ratio)),
        "slime_mean_abs_logprob_diff": float(diff.mean()),
        "nemo_rl_token_mult_prob_error": _overflow_as_none(float(torch.exp(diff).mean())),
        "verl_rollout_probs_diff_max": _overflow_as_none(
            float((torch.exp(t) - torch.exp(r)).abs().max())
        ),
    }
    positions = active.nonzero()
    order = _largest(diff, ascending, WORST_TOKENS)
    worst = [
        {
            "sample": int(positions[i][0]),
            "position": int(positions[i][1]),
            "rollout_logprob": float(r[i]),
            "training_logprob": float(t[i]),
            "abs_diff": float(diff[i]),
        }
        for i in order
    ]
    return diagnostics, worst


def _quantiles(ascending: torch.Tensor, levels: tuple[float, ...]) -> torch.Tensor:
    """``torch.quantile`` (linear interpolation) of the values sorted in ``ascending``, without
    sorting them again: the order statistics below and above each rank, interpolated by
    ``torch.lerp`` as ``torch.quantile`` does (the same float64 values)."""
    ranks = torch.tensor(levels, dtype=torch.float64) * (ascending.numel() - 1)
    below = ranks.floor().long()
    return torch.lerp(ascending[below], ascending[ranks.ceil().long()], ranks - below)


def _largest(values: torch.Tensor, ascending: torch.Tensor, count: int) -> list[int]:
    """The indices of the ``count`` largest ``values`` (finite), ties in index order: what a
    stable descending argsort puts first, sorting only the values at or above the
    ``count``-th largest (``ascending``: ``values`` sorted)."""
    if not values.numel():
        return []
    bar = ascending[max(ascending.numel() - count, 0)]
    candidates = (values >= bar).nonzero().squeeze(1)
    ranked = torch.argsort(values[candidates], descending=True, stable=True)
    return candidates[ranked[:count]].tolist()
