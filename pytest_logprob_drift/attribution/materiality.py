"""Which attributed interventions are material: the rule that keeps noise out of the ranking.

An intervention whose case PASSes with a max |diff| below ``MATERIAL_FRACTION`` of the
contract's threshold (1e-4 nats under ws1's 1e-3) moved, at most, by an amount far inside the
contract: it is "within the contract", listed apart and never ranked as a cause, however its
mean |diff| compares with the baseline's. Any other case (a MISMATCH, a PASS near the threshold,
an outcome that is not a verdict) is material. The sealed attribution document keeps its whole
ranking (``verify`` recomputes it unchanged); this rule is applied where the findings, the
terminal's ranking line and ``report --json``'s ``ranking`` are built from it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from pytest_logprob_drift.outcomes import Outcome

MATERIAL_FRACTION = 0.1
"""A PASS case whose max |diff| is below this fraction of the threshold is within the contract."""


def within_contract(outcome: str, max_abs_diff: float | None, threshold: float | None) -> bool:
    """Whether a case's verdict figures put its intervention within the contract: it PASSes
    and its max |diff| (finite) is below ``MATERIAL_FRACTION`` of a positive threshold."""
    if outcome != Outcome.PASS.value or max_abs_diff is None or threshold is None:
        return False
    if not (math.isfinite(max_abs_diff) and math.isfinite(threshold)) or threshold <= 0:
        return False
    return max_abs_diff < MATERIAL_FRACTION * threshold


def material(ranking: Sequence[str], within: Collection[str]) -> list[str]:
    """The sealed ``ranking`` without the labels that are within the contract, in its order."""
    return [label for label in ranking if label not in within]


def rule_words(threshold: float | None) -> str:
    """The rule in words, with the threshold when known: ``PASS, max |diff| below 0.0001``."""
    if threshold is None:
        return f"PASS, max |diff| below {MATERIAL_FRACTION:g} of the threshold"
    return f"PASS, max |diff| below {MATERIAL_FRACTION * threshold:.3g}"
