"""Expectations checked against a plan: a ``SELECTOR=OUTCOME`` that selects nothing.

Owns refusing, before anything executes, an expected outcome whose selector matches no planned
case (a misspelt label or case id would otherwise be silently ignored and the run judged
against PASS). Each frontend names its own flag in the message. Knows nothing about execution.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pytest_logprob_drift.outcomes import Expectation
from pytest_logprob_drift.records import Case


def unmatched_expectations(
    expectations: Sequence[Expectation], cases: Iterable[Case]
) -> list[Expectation]:
    """The expectations that select none of ``cases``, in the order given."""
    keys = [(case.case_id, case.label) for case in cases]
    return [e for e in expectations if not any(e.matches(i, label) for i, label in keys)]


def describe_unmatched(flag: str, expectation: Expectation, cases: Sequence[Case]) -> str:
    """One line: which expectation matches nothing, and what it could have named."""
    labels = ", ".join(case.label for case in cases[:8])
    more = f" and {len(cases) - 8} more" if len(cases) > 8 else ""
    return (
        f"{flag} {expectation.selector}={expectation.outcome.value}: selector "
        f"{expectation.selector!r} matches no planned case (a case label, a case id prefix of "
        f"4+ characters, or '*'; planned: {labels}{more})"
    )
