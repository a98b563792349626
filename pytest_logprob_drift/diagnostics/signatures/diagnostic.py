"""The signatures ``Diagnostic``: its part, check and report sections, for the hubs.

Owns binding ``diagnostics.signatures`` to the protocol: nothing captured, the part sealed for
a judged case from its ``(training, rollout, active)`` scores (``numerics.score_signatures``,
imported on first use: it needs torch), the offline check (``check``) and the report's
run-scope views (``section``: the page's signatures section and the findings' links to it);
no run-table column and no line. Torch-free at import.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_logprob_drift.diagnostics.base import DiagnosticBase
from pytest_logprob_drift.outcomes import Outcome

if TYPE_CHECKING:
    from pytest_logprob_drift.diagnostics.protocol import (
        Captured,
        Scores,
        Tensors,
    )
    from pytest_logprob_drift.numerics.comparison import Comparison, Diagnostics
    from pytest_logprob_drift.report.markup import Markup
    from pytest_logprob_drift.report.model import ReportData

SIGNED_OUTCOMES = (Outcome.PASS, Outcome.MISMATCH)
"""The outcomes whose comparison carries signatures (those with finite active scores)."""


@dataclass(frozen=True, slots=True)
class SignaturesDiagnostic(DiagnosticBase):
    """``diagnostics.signatures`` of every judged case."""

    name: str = "signatures"
    part_type: type[Any] = tuple
    """Its part is declared (``numerics.comparison.Diagnostics.signatures``: a tuple of
    ``SealedSignature``), so the registry never assembles a member from this type."""
    sealed_files: tuple[str, ...] = ()
    always_in_table: bool = False

    def seal(
        self, outcome: Outcome, scores: Scores | None, captured: Captured | None
    ) -> Mapping[str, object]:
        if outcome not in SIGNED_OUTCOMES or scores is None:
            return {}
        from pytest_logprob_drift.numerics.score_signatures import signatures

        return {self.name: signatures(*scores)}

    def check(
        self,
        comparison: Comparison,
        diffs: Tensors,
        files: Mapping[str, Tensors | None],
        scored: Mapping[str, Tensors],
    ) -> Comparison:
        from pytest_logprob_drift.diagnostics.signatures.check import (
            check_signatures,
            with_signatures,
        )

        return with_signatures(comparison, check_signatures(comparison, diffs))

    def shown(self, diagnostics: Sequence[Diagnostics | None]) -> bool:
        return False

    def report_run_section(self, data: ReportData, place: str, draw: bool) -> Markup | None:
        from pytest_logprob_drift.diagnostics.signatures import section
        from pytest_logprob_drift.report.signatures import named_signatures

        if place == "lead":
            return section.signature_section(data, named_signatures(data))
        if place == "findings":
            return section.findings_links(named_signatures(data))
        return None


DIAGNOSTIC = SignaturesDiagnostic()
