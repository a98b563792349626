"""The importance-sampling ``Diagnostic``: its part sealed, checked and shown, for the hubs.

Owns binding ``diagnostics.importance_sampling`` to the protocol: sealing the part of a judged
case and checking it offline (``check``, imported on first use: it needs torch), and its views
(the run table's ESS column, the plugin's headline line and junit properties, the report's
columns, verbose lines and case panel). Torch-free at import.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_logprob_drift.diagnostics.base import DiagnosticBase
from pytest_logprob_drift.diagnostics.importance_sampling import section
from pytest_logprob_drift.numerics import importance_text
from pytest_logprob_drift.numerics.comparison import ImportanceSamplingFigures

if TYPE_CHECKING:
    from pytest_logprob_drift.diagnostics.protocol import (
        AttributionContribution,
        Captured,
        Scores,
        Tensors,
    )
    from pytest_logprob_drift.numerics.comparison import Comparison, Diagnostics
    from pytest_logprob_drift.outcomes import Outcome
    from pytest_logprob_drift.records import JsonObject
    from pytest_logprob_drift.report.markup import Markup


@dataclass(frozen=True, slots=True)
class ImportanceSamplingDiagnostic(DiagnosticBase):
    """``diagnostics.importance_sampling`` of every judged case."""

    name: str = "importance_sampling"
    part_type: type[ImportanceSamplingFigures] = ImportanceSamplingFigures
    sealed_files: tuple[str, ...] = ()
    always_in_table: bool = True

    def seal(
        self, outcome: Outcome, scores: Scores | None, captured: Captured | None
    ) -> Mapping[str, ImportanceSamplingFigures]:
        from pytest_logprob_drift.comparison_record import SCORED_OUTCOMES
        from pytest_logprob_drift.diagnostics.importance_sampling import check

        if outcome not in SCORED_OUTCOMES or scores is None:
            return {}
        return {self.name: check.figures(*scores)}

    def check(
        self,
        comparison: Comparison,
        diffs: Tensors,
        files: Mapping[str, Tensors | None],
        scored: Mapping[str, Tensors],
    ) -> Comparison:
        from pytest_logprob_drift.diagnostics.importance_sampling import check

        return check.with_figures(comparison, check.check_importance_sampling(comparison, diffs))

    def shown(self, diagnostics: Sequence[Diagnostics | None]) -> bool:
        return True

    def table_headers(self) -> tuple[str, ...]:
        return (importance_text.ESS_HEADER,)

    def table_cells(self, diagnostics: Diagnostics | None) -> list[str]:
        return [importance_text.ess_cell(diagnostics)]

    def failure_lines(self, diagnostics: Diagnostics | None) -> list[str]:
        headline = importance_text.headline(diagnostics)
        return [] if headline is None else [headline]

    def report_lines(self, diagnostics: Diagnostics | None) -> list[str]:
        return importance_text.lines(diagnostics)

    def properties(self, diagnostics: Diagnostics | None) -> list[tuple[str, str]]:
        return importance_text.properties(diagnostics)

    def json_parts(self, diagnostics: Diagnostics | None) -> JsonObject:
        figures = importance_text.figures_of(diagnostics)
        return {} if figures is None else {self.name: figures.to_json()}

    def report_headers(self) -> tuple[str, ...]:
        return section.HEADERS

    def report_cells(self, diagnostics: Diagnostics) -> list[tuple[str, float | None]]:
        return section.cells(diagnostics)

    def report_section(self, diagnostics: Diagnostics) -> Markup | None:
        return section.panel(diagnostics)

    def attribution(self) -> AttributionContribution | None:
        from pytest_logprob_drift.diagnostics.importance_sampling import attribution  # torch

        return attribution.CONTRIBUTION


DIAGNOSTIC = ImportanceSamplingDiagnostic()
