"""The attribution of a finished run: what both frontends do once the cases have executed.

Owns finding the baseline among a run's case results (by ``CaseKind.BASELINE``), collecting
the attempts the run sealed for the other cases, and attributing them against the baseline
and its repeats into one sealed attribution (``attribution.sealed``). Imports torch through
the attribution, so a frontend imports this module only after a case executed. Knows nothing
about argparse, pytest or how results are printed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pytest_logprob_drift.attribution.sealed import SealedAttribution, attribute_and_seal
from pytest_logprob_drift.execute.runner import CaseResult
from pytest_logprob_drift.records import CaseKind


def baseline_of(results: Sequence[CaseResult]) -> CaseResult | None:
    """The executed baseline among ``results`` (None when it has no attempt)."""
    return next(
        (r for r in results if r.kind is CaseKind.BASELINE and r.attempt_dir is not None), None
    )


def seal_run_attribution(
    run_dir: Path, experiment_id: str, results: Sequence[CaseResult]
) -> SealedAttribution | None:
    """Attribute every executed case against the baseline and seal it; None when there is
    nothing to attribute (no executed baseline, e.g. a plan-only scenario or a rejected
    baseline, or no other executed case). ValueError when the attempts are not comparable,
    OSError when the attribution cannot be written."""
    baseline = baseline_of(results)
    if baseline is None or baseline.attempt_dir is None:
        return None
    cases = [r.attempt_dir for r in results if r is not baseline and r.attempt_dir is not None]
    if not cases:
        return None
    return attribute_and_seal(
        run_dir, experiment_id, baseline.attempt_dir, baseline.repeat_dirs, cases
    )
