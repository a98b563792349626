"""The layers ``Diagnostic``: its capture, part, files, check and views, for the hubs.

Owns binding ``diagnostics.layers`` to the protocol: the layer capture after the paired
scoring when the case asks for it (``execute.layers``, imported on first use: it needs torch),
the part and the layer files sealed from that capture, the offline check (``check``) and its
views (``text``: the run table's optional columns, lines, junit properties and
the ``run --json`` member; ``plot``: the report's two figures). Torch-free at import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from pytest_logprob_drift.diagnostics.base import TextViewsDiagnostic
from pytest_logprob_drift.diagnostics.layers import text
from pytest_logprob_drift.diagnostics.layers.config import CONFIG_KEY
from pytest_logprob_drift.numerics.comparison import LayerDiagnostics, from_builtins
from pytest_logprob_drift.store import layout

if TYPE_CHECKING:
    from pathlib import Path

    from pytest_logprob_drift.diagnostics.base import TextViews
    from pytest_logprob_drift.diagnostics.config_key import ConfigKey
    from pytest_logprob_drift.diagnostics.protocol import (
        AttributionContribution,
        Captured,
        CaseUnderCapture,
        Scores,
        Tensors,
    )
    from pytest_logprob_drift.execute.layers import LayersResult
    from pytest_logprob_drift.numerics.comparison import Comparison, Diagnostics
    from pytest_logprob_drift.outcomes import Outcome
    from pytest_logprob_drift.records import JsonObject
    from pytest_logprob_drift.report.markup import Markup
    from pytest_logprob_drift.report.model import ReportData
    from pytest_logprob_drift.store.attempt import Seal


def _layers(captured: Captured | None, scores: Scores | None) -> LayersResult | None:
    """The capture of a case both sides scored (None: not asked for, or not scored)."""
    from pytest_logprob_drift.execute.layers import LayersResult

    if scores is None or not isinstance(captured, LayersResult):
        return None
    return captured


@dataclass(frozen=True, slots=True)
class LayersDiagnostic(TextViewsDiagnostic):
    """``diagnostics.layers`` of a case that asks for the layer capture."""

    name: str = "layers"
    config_key: ConfigKey | None = CONFIG_KEY
    part_type: type[LayerDiagnostics] = LayerDiagnostics
    sealed_files: tuple[str, ...] = layout.LAYER_FILES
    views: ClassVar[TextViews] = text

    def capture(self, case: CaseUnderCapture) -> Captured | None:
        spec = case.binding.layers
        if spec is None:
            return None
        from pytest_logprob_drift.execute.layers import layer_diagnostics

        return layer_diagnostics(
            case.engine,
            case.scorer,
            case.identity,
            case.rollout,
            batch_size=case.batch_size,
            spec=spec,
        )

    def seal(
        self, outcome: Outcome, scores: Scores | None, captured: Captured | None
    ) -> Mapping[str, LayerDiagnostics]:
        layers = _layers(captured, scores)
        return {} if layers is None else {self.name: from_builtins(layers.entry, LayerDiagnostics)}

    def files(
        self, outcome: Outcome, scores: Scores | None, captured: Captured | None
    ) -> Mapping[str, Tensors]:
        layers = _layers(captured, scores)
        return {} if layers is None else layers.files

    def check(
        self,
        comparison: Comparison,
        diffs: Tensors,
        files: Mapping[str, Tensors | None],
        scored: Mapping[str, Tensors],
    ) -> Comparison:
        from pytest_logprob_drift.diagnostics.layers.check import check_layers

        check_layers(
            comparison.diagnostics,
            files[layout.LAYERS_TRAINING],
            files[layout.LAYERS_ROLLOUT],
            scored[layout.SCORE_ROLLOUT],
        )
        return comparison

    def json_parts(self, diagnostics: Diagnostics | None) -> JsonObject:
        if diagnostics is None or diagnostics.layers is None:
            return {}
        return {self.name: diagnostics.layers.to_json()}

    def report_plot(self, directory: Path, seal: Seal, diagnostics: Diagnostics) -> object | None:
        from pytest_logprob_drift.diagnostics.layers.plot import load_layer_plot

        return load_layer_plot(directory, seal, diagnostics.layers)

    def report_figures(self, plot: object | None) -> tuple[tuple[str, Markup], ...]:
        if plot is None:
            return ()
        from pytest_logprob_drift.diagnostics.layers import plot as figures  # loads torch

        assert isinstance(plot, figures.LayerPlot)
        return (
            ("layers-heatmap", figures.heatmap_svg(plot)),
            ("layers-by-state", figures.by_state_svg(plot)),
        )

    def report_run_section(self, data: ReportData, place: str, draw: bool) -> Markup | None:
        if place != "body":
            return None
        from pytest_logprob_drift.diagnostics.layers.run_plot import run_section  # numpy

        return run_section(data.cases, draw)

    def attribution(self) -> AttributionContribution | None:
        from pytest_logprob_drift.diagnostics.layers.attribution import CONTRIBUTION  # torch

        return CONTRIBUTION


DIAGNOSTIC = LayersDiagnostic()
