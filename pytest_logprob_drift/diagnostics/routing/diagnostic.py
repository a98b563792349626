"""The routing ``Diagnostic``: its capture, part, files, check and views, for the hubs.

Owns binding ``diagnostics.routing`` to the protocol: the trainer's capture after the paired
scoring beside the rollout's choices the case captured while it generated, when the case asks
for it (``execute.routing``, imported on first use: it needs torch), the part and the routing
files sealed from that capture, the offline check (``check``) and its views (``views``: the run
table's optional columns and lines; ``plot`` and ``section``: the report's run-scope figure,
section and text over every case). Torch-free at import.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_logprob_drift.diagnostics.base import DiagnosticBase
from pytest_logprob_drift.diagnostics.routing import views
from pytest_logprob_drift.diagnostics.routing.config import CONFIG_KEY
from pytest_logprob_drift.numerics.comparison import RoutingDiagnostics, from_builtins
from pytest_logprob_drift.store import layout

if TYPE_CHECKING:
    from pytest_logprob_drift.diagnostics.config_key import ConfigKey
    from pytest_logprob_drift.diagnostics.protocol import (
        Captured,
        CaseUnderCapture,
        Scores,
        Tensors,
    )
    from pytest_logprob_drift.execute.routing import RoutingResult
    from pytest_logprob_drift.numerics.comparison import Comparison, Diagnostics
    from pytest_logprob_drift.outcomes import Outcome
    from pytest_logprob_drift.report.markup import Markup
    from pytest_logprob_drift.report.model import ReportData


def _routing(captured: Captured | None, scores: Scores | None) -> RoutingResult | None:
    """The capture of a case both sides scored (None: not asked for, or not scored)."""
    from pytest_logprob_drift.execute.routing import RoutingResult

    if scores is None or not isinstance(captured, RoutingResult):
        return None
    return captured


@dataclass(frozen=True, slots=True)
class RoutingDiagnostic(DiagnosticBase):
    """``diagnostics.routing`` of a case that asks for the routing capture."""

    name: str = "routing"
    config_key: ConfigKey | None = CONFIG_KEY
    part_type: type[RoutingDiagnostics] = RoutingDiagnostics
    sealed_files: tuple[str, ...] = layout.ROUTING_FILES
    always_in_table: bool = False

    def capture(self, case: CaseUnderCapture) -> Captured | None:
        rolled_out = case.rollout_experts
        if not case.binding.routing or rolled_out is None:
            return None
        from pytest_logprob_drift.execute.routing import routing_diagnostics

        replay = case.binding.training_settings.moe_routing.replay
        return routing_diagnostics(
            case.scorer,
            case.rollout,
            case.training,
            rolled_out=rolled_out,
            replayed=rolled_out.expert_ids if replay else None,
            batch_size=case.batch_size,
            threshold=case.threshold,
        )

    def seal(
        self, outcome: Outcome, scores: Scores | None, captured: Captured | None
    ) -> Mapping[str, RoutingDiagnostics]:
        routing = _routing(captured, scores)
        if routing is None:
            return {}
        return {self.name: from_builtins(routing.entry, RoutingDiagnostics)}

    def files(
        self, outcome: Outcome, scores: Scores | None, captured: Captured | None
    ) -> Mapping[str, Tensors]:
        routing = _routing(captured, scores)
        return {} if routing is None else routing.files

    def check(
        self,
        comparison: Comparison,
        diffs: Tensors,
        files: Mapping[str, Tensors | None],
        scored: Mapping[str, Tensors],
    ) -> Comparison:
        from pytest_logprob_drift.diagnostics.routing.check import check_routing_files

        check_routing_files(
            comparison.diagnostics,
            files[layout.ROUTING_TRAINING],
            files[layout.ROUTING_ROLLOUT],
            diffs,
            scored[layout.SCORE_ROLLOUT],
        )
        return comparison

    def shown(self, diagnostics: Sequence[Diagnostics | None]) -> bool:
        return views.has_routing(diagnostics)

    def table_headers(self) -> tuple[str, ...]:
        return views.HEADERS

    def table_cells(self, diagnostics: Diagnostics | None) -> list[str]:
        return views.cells(diagnostics)

    def run_lines(self, diagnostics: Diagnostics | None) -> list[str]:
        return views.lines(diagnostics)

    def failure_lines(self, diagnostics: Diagnostics | None) -> list[str]:
        return views.lines(diagnostics)

    def report_run_lines(self, data: ReportData) -> list[str]:
        from pytest_logprob_drift.diagnostics.routing.plot import case_lines

        return case_lines(data.cases)

    def report_run_section(self, data: ReportData, place: str, draw: bool) -> Markup | None:
        if place != "body":
            return None
        from pytest_logprob_drift.diagnostics.routing.section import section

        return section(data, draw)


DIAGNOSTIC = RoutingDiagnostic()
