"""Re-judging a sealed attempt by the installed numerical contract.

Owns the check that an attempt's verdict is the contract's: the threshold is resolved from the
contract source and version ``comparison.json`` records, through the contract this package
ships (``config.contract``), never read from a sealed file; the threshold sealed in
``comparison.json``, in its re-check and in ``token_diffs.pt`` must each equal it; the verdict
is recomputed from ``token_diffs.pt``'s tensors with it; and, for a judged attempt, every figure
of ``comparison.json`` that the verdict computes (active tokens, mismatches, the statistics and
the worst tokens) must be what the recomputation gives, with the verdict's formula of today
(no sealed figure has had another). A version this release no longer ships is a SealError
naming it. Statistics compare within a relative ``1e-9`` (a reduction's rounding may differ
between CPUs); counts, positions and logprobs exactly. Knows nothing about engines, files or
how an attempt was written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from pytest_logprob_drift.errors import ConfigError
from pytest_logprob_drift.numerics.comparison import (
    STATISTICS_KEYS,
    Comparison,
    NumericCheck,
    Statistics,
    WorstToken,
    from_builtins,
)
from pytest_logprob_drift.numerics.verdict import Verdict, judge
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.seal import SealError

JUDGED_OUTCOMES = (Outcome.PASS, Outcome.MISMATCH, Outcome.ZERO_ACTIVE_TOKENS)
"""The outcomes whose every figure the verdict computed from token_diffs.pt alone."""
REL_TOLERANCE = 1e-9
"""How far a recomputed statistic may be from the sealed one, relatively."""
ABS_TOLERANCE = 1e-300
"""... and absolutely (a statistic of exactly 0 recomputes as 0; subnormal noise aside)."""


def contract_threshold(comparison: Comparison) -> float:
    """The threshold of the contract source and version ``comparison`` records, as this
    release ships it; a SealError on comparison.json naming the version it does not ship, or
    the member whose sealed value disagrees with it."""
    from pytest_logprob_drift.config.contract import resolve_contract

    sealed = comparison.contract
    try:
        installed = resolve_contract(sealed.source, sealed.version)
    except ConfigError as exc:
        raise SealError(
            layout.COMPARISON,
            f"judged under contract {sealed.source!r} version {sealed.version!r}, which this "
            f"release does not ship ({exc.message}); its verdict cannot be re-judged",
        ) from None
    for member, value, want in (
        ("contract.threshold", sealed.threshold, installed.threshold),
        ("contract.unit", sealed.unit, installed.unit),
        ("threshold", comparison.threshold, installed.threshold),
    ):
        if value != want:
            raise SealError(
                layout.COMPARISON,
                f"{member} is {value!r}; contract {sealed.source!r} version "
                f"{sealed.version!r} says {want!r}",
            )
    return installed.threshold


def rejudge(comparison: Comparison, diffs: Mapping[str, torch.Tensor]) -> NumericCheck:
    """The numerical verdict recomputed from ``token_diffs.pt``'s tensors under the installed
    contract's threshold; a SealError naming the first sealed figure that differs from it."""
    threshold = contract_threshold(comparison)
    sealed = float(diffs["threshold"].item())
    if sealed != threshold:
        raise SealError(
            layout.TOKEN_DIFFS,
            f"threshold is {sealed!r}; contract {comparison.contract.source!r} version "
            f"{comparison.contract.version!r} says {threshold!r}",
        )
    verdict = judge(
        diffs["training_logprobs"], diffs["rollout_logprobs"], diffs["active_mask"], threshold
    )
    if comparison.outcome in JUDGED_OUTCOMES and comparison.outcome is verdict.outcome:
        _same_figures(comparison, verdict)
    return verdict.numeric_check()


def _differs(member: str, sealed: object, recomputed: object) -> SealError:
    return SealError(
        layout.COMPARISON,
        f"{member} is {sealed!r}; recomputed from token_diffs.pt under the contract: "
        f"{recomputed!r}",
    )


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=REL_TOLERANCE, abs_tol=ABS_TOLERANCE)


def _same_figures(comparison: Comparison, verdict: Verdict) -> None:
    """Every figure of a judged comparison is the recomputed verdict's."""
    for member in ("active_tokens", "mismatches"):
        if getattr(comparison, member) != getattr(verdict, member):
            raise _differs(member, getattr(comparison, member), getattr(verdict, member))
    recomputed = (
        from_builtins(dict(verdict.diagnostics), Statistics) if verdict.diagnostics else None
    )
    sealed = comparison.diagnostics.statistics
    if (sealed is None) != (recomputed is None):
        raise _differs("diagnostics (statistics)", sealed is not None, recomputed is not None)
    if sealed is not None and recomputed is not None:
        for key in STATISTICS_KEYS:
            got, want = getattr(sealed, key), getattr(recomputed, key)
            if not _close(got, want):
                raise _differs(f"diagnostics.{key}", got, want)
    worst = tuple(WorstToken(**w) for w in verdict.worst_tokens)
    if len(comparison.worst_tokens) != len(worst):
        raise _differs("worst_tokens (count)", len(comparison.worst_tokens), len(worst))
    for i, (got_token, want_token) in enumerate(zip(comparison.worst_tokens, worst, strict=True)):
        if got_token != want_token:
            raise _differs(f"worst_tokens[{i}]", got_token.to_json(), want_token.to_json())
