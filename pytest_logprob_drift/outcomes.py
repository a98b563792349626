"""The one outcome enum shared by comparator, runner, CLI and plugin.

Owns the closed set of verdicts a case can end with, their pytest status words and letters,
and how ``SELECTOR=OUTCOME`` expectations parse and match (each frontend names its own flag
for them). Knows nothing about how an outcome is computed.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_logprob_drift.errors import UsageError


class Outcome(enum.Enum):
    PASS = "PASS"
    MISMATCH = "MISMATCH"
    ZERO_ACTIVE_TOKENS = "ZERO_ACTIVE_TOKENS"
    INVALID_IDENTITY = "INVALID_IDENTITY"
    INVALID_ARTIFACT = "INVALID_ARTIFACT"
    STRICT_REJECTED = "STRICT_REJECTED"
    PLAN_ONLY = "PLAN_ONLY"

    @property
    def letter(self) -> str:
        return _LETTERS[self]


_LETTERS: Mapping[Outcome, str] = {
    Outcome.PASS: ".",
    Outcome.MISMATCH: "M",
    Outcome.ZERO_ACTIVE_TOKENS: "Z",
    Outcome.INVALID_IDENTITY: "I",
    Outcome.INVALID_ARTIFACT: "A",
    Outcome.STRICT_REJECTED: "R",
    Outcome.PLAN_ONLY: "s",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Expectation:
    """``SELECTOR=OUTCOME``: SELECTOR is a case label, a case id (prefix), or ``*``."""

    selector: str
    outcome: Outcome

    def matches(self, case_id: str, label: str) -> bool:
        return self.selector in ("*", label) or (
            len(self.selector) >= 4 and case_id.startswith(self.selector)
        )


def parse_expectation(text: str) -> Expectation:
    """``SELECTOR=OUTCOME``; a UsageError starting with ``repr(text)`` otherwise (the frontend
    puts its flag in front)."""
    selector, sep, outcome = text.rpartition("=")
    if not sep or not selector:
        raise UsageError(
            f"{text!r}: expected SELECTOR=OUTCOME, e.g. 'rollout.dtype=bfloat16=MISMATCH'"
        )
    try:
        parsed = Outcome(outcome.strip().upper())
    except ValueError:
        raise UsageError(
            f"{text!r}: unknown outcome {outcome!r}; one of {', '.join(o.value for o in Outcome)}"
        ) from None
    return Expectation(selector=selector.strip(), outcome=parsed)


def expected_outcome(expectations: Sequence[Expectation], case_id: str, label: str) -> Outcome:
    """The last matching expectation wins; PASS when none matches."""
    result = Outcome.PASS
    for expectation in expectations:
        if expectation.matches(case_id, label):
            result = expectation.outcome
    return result
