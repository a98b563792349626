"""The report's view of the drift signatures: which known cause the logged numbers point to.

Owns collecting, from a loaded run, the step and sample scope signatures each shown case's
comparison carries (sealed, or, for one sealed before them, computed by the check that
``check.verify`` runs from its token_diffs.pt) and the run scope ones computed here from the
imported steps' sealed ``mean_abs_diff`` (``numerics.signatures.run_signatures``, never
sealed), each as one ``NamedSignature`` with the
sentence the findings, the text report and the page show and the ``report --json`` entry.
Knows nothing about files, seals or how a page is drawn.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_logprob_drift.numerics.signature_record import Evidence, Scope, SignatureId
from pytest_logprob_drift.numerics.signatures import run_signatures
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.records import JsonObject, JsonValue
from pytest_logprob_drift.report.model import CaseView, ReportData

BETTER_SEEN = (SignatureId.TEMPERED, SignatureId.TRUNCATED_SAMPLING, SignatureId.SHIFTED)
"""The signatures an executed case's semantic offset over the full vocabulary sees better."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NamedSignature:
    """One signature where the report shows it: the step (None: not a step of an import, or a
    run scope trend), the sample (the row of the step's token grid), the case it was read
    from (None: run scope) and its evidence; ``index`` numbers it on the page."""

    index: int
    id: SignatureId
    scope: Scope
    step: int | None
    sample: int | None
    case_id: str | None
    label: str | None
    evidence: Mapping[str, JsonValue]
    better_seen: bool = False
    """The case has a semantic offset over the full vocabulary, which sees this cause better."""

    @property
    def anchor(self) -> str:
        return f"signature-{self.index}"

    def where(self) -> str:
        place = (
            "the run"
            if self.scope is Scope.RUN
            else f"step {self.step}"
            if self.step is not None
            else f"case {self.label}"
        )
        return place if self.sample is None else f"{place}, sample {self.sample}"

    def words(self) -> str:
        """One line: the id, where, and the evidence in words."""
        text = f"{self.id.value} ({self.where()}): {_evidence_words(self.id, self.evidence)}"
        if self.better_seen:
            text += " (the case's semantic offset over the full vocabulary sees the cause better)"
        return text

    def to_json(self) -> JsonObject:
        return {
            "id": self.id.value,
            "scope": self.scope.value,
            "step": self.step,
            "sample": self.sample,
            "case_id": self.case_id,
            "evidence": {
                k: list(v) if isinstance(v, tuple) else v for k, v in self.evidence.items()
            },
        }


def _shown(values: Any) -> str:
    return ", ".join(str(v) for v in values)


def _evidence_words(kind: SignatureId, e: Mapping[str, JsonValue]) -> str:
    if kind is SignatureId.ZERO_FILLED:
        return (
            f"the rollout logprob is exactly 0.0 on {e['tokens']} active token(s) (positions "
            f"{_shown(e['positions'])}) the trainer gives {e['training_logprob_sum']:.3g} nats"
        )
    if kind is SignatureId.TEMPERED:
        return (
            f"rollout = training / T with implied T = {e['implied_temperature']:.3f} "
            f"(slope {e['slope']:.3f}, r^2 {e['r2']:.2f}, {e['tokens']} tokens below the top)"
        )
    if kind is SignatureId.TRUNCATED_SAMPLING:
        return (
            f"the rollout is at least the trainer's on {e['share_rollout_at_least_training']:.1%} "
            f"of {e['tokens']} tokens, mean kept mass {e['kept_mass']:.3f} (renormalised after "
            "top-p / top-k)"
        )
    if kind is SignatureId.SHIFTED:
        return (
            f"rollout[t] matches training[t{e['offset']:+d}] (mean |diff| "
            f"{e['shifted_mean_abs_diff']:.3g}) far better than training[t] "
            f"({e['aligned_mean_abs_diff']:.3g}) over {e['pairs']} pairs"
        )
    if kind is SignatureId.SAMPLE_OUTLIERS:
        return (
            f"mean |diff| {e['mean_abs_diff']:.3g} over {e['tokens']} tokens, far above the "
            f"other {e['rest_samples']} samples (median {e['rest_median_mean_abs_diff']:.3g}, "
            f"at most {e['rest_max_mean_abs_diff']:.3g})"
        )
    if kind is SignatureId.POSITION_GROWTH:
        return (
            f"mean |diff| grows over {e['positions']} positions: {e['early_mean_abs_diff']:.3g}"
            f" -> {e['middle_mean_abs_diff']:.3g} -> {e['late_mean_abs_diff']:.3g} by thirds "
            f"({e['growth_per_1k_tokens']:+.3g} per 1K tokens)"
        )
    if kind is SignatureId.STEP_JUMP:
        return (
            f"the step's mean |diff| moves from {e['before_mean_abs_diff']:.3g} "
            f"({e['steps_before']} steps) to {e['after_mean_abs_diff']:.3g} "
            f"({e['steps_after']} steps) and stays"
        )
    return (
        f"the step's mean |diff| grows from {e['first_mean_abs_diff']:.3g} to "
        f"{e['last_mean_abs_diff']:.3g} over steps {e['first_step']}-{e['last_step']} "
        f"(x{e['growth']:.3g}, Spearman {e['spearman_rho']:.2f})"
    )


def _run_figures(data: ReportData) -> list[tuple[int, float]]:
    """``(step, sealed mean |diff|)`` of the judged steps of an import, in step order."""
    if data.steps is None:
        return []
    judged = (Outcome.PASS.value, Outcome.MISMATCH.value)
    figures = []
    for row in data.steps.rows:
        value = data.case(row.label).diagnostics.mean_abs_diff
        if row.outcome in judged and value is not None:
            figures.append((row.step, float(value)))
    return sorted(figures)


def named_signatures(data: ReportData) -> tuple[NamedSignature, ...]:
    """The run's signatures: run scope first, then by step (or case) and sample."""
    found: list[tuple[SignatureId, Scope, int | None, int | None, CaseView | None, Evidence]] = [
        (s.id, Scope.RUN, s.step, None, None, s.evidence)
        for s in run_signatures(_run_figures(data))
    ]
    step_of = {} if data.steps is None else {row.label: row.step for row in data.steps.rows}
    apart = [
        (s.id, s.scope, step_of.get(view.label), s.sample, view, s.evidence)
        for view in data.cases
        for s in view.diagnostics.signatures or ()
    ]
    apart.sort(
        key=lambda f: (
            f[2] is None,
            -1 if f[2] is None else f[2],
            "" if f[4] is None else f[4].label,
            -1 if f[3] is None else f[3],
        )
    )
    found += apart
    return tuple(
        NamedSignature(
            index=index,
            id=kind,
            scope=scope,
            step=step,
            sample=sample,
            case_id=None if view is None else view.case_id,
            label=None if view is None else view.label,
            evidence=evidence,
            better_seen=view is not None
            and kind in BETTER_SEEN
            and view.diagnostics.semantic_offset is not None,
        )
        for index, (kind, scope, step, sample, view, evidence) in enumerate(found, start=1)
    )
