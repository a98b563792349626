"""The path-split ``Diagnostic``: its capture, part, files, check and views, for the hubs.

Owns binding ``diagnostics.path_split`` to the protocol: the replay captured after the paired
scoring when the case asks for it (``execute.replay``, imported on first use: it needs torch),
the part and the replay files sealed from that capture, the offline check (``check``) and its
views (``views``: the run table's optional columns, lines and junit properties; ``plot``: the
report's two figures). Torch-free at import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from pytest_logprob_drift.diagnostics.base import TextViewsDiagnostic
from pytest_logprob_drift.diagnostics.path_split import views as path_split_views
from pytest_logprob_drift.diagnostics.path_split.config import CONFIG_KEY
from pytest_logprob_drift.numerics.comparison import PathSplit, from_builtins
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
    from pytest_logprob_drift.execute.replay import ReplayResult
    from pytest_logprob_drift.numerics.comparison import Comparison, Diagnostics
    from pytest_logprob_drift.outcomes import Outcome
    from pytest_logprob_drift.report.markup import Markup
    from pytest_logprob_drift.store.attempt import Seal


def _replay(captured: Captured | None) -> ReplayResult | None:
    from pytest_logprob_drift.execute.replay import ReplayResult

    return captured if isinstance(captured, ReplayResult) else None


@dataclass(frozen=True, slots=True)
class PathSplitDiagnostic(TextViewsDiagnostic):
    """``diagnostics.path_split`` of a case that asks for the replay."""

    name: str = "path_split"
    config_key: ConfigKey | None = CONFIG_KEY
    part_type: type[PathSplit] = PathSplit
    sealed_files: tuple[str, ...] = layout.REPLAY_FILES
    views: ClassVar[TextViews] = path_split_views

    def capture(self, case: CaseUnderCapture) -> Captured | None:
        if not case.binding.replay:
            return None
        from pytest_logprob_drift.execute.replay import replay_diagnostics

        return replay_diagnostics(
            case.engine,
            case.identity,
            case.rollout,
            case.training,
            case.read_back,
            batch_size=case.batch_size,
            logp=case.rollout_logp,
        )

    def seal(
        self, outcome: Outcome, scores: Scores | None, captured: Captured | None
    ) -> Mapping[str, PathSplit]:
        replay = _replay(captured)
        return {} if replay is None else {self.name: from_builtins(replay.entry, PathSplit)}

    def files(
        self, outcome: Outcome, scores: Scores | None, captured: Captured | None
    ) -> Mapping[str, Tensors]:
        replay = _replay(captured)
        return {} if replay is None else replay.files

    def check(
        self,
        comparison: Comparison,
        diffs: Tensors,
        files: Mapping[str, Tensors | None],
        scored: Mapping[str, Tensors],
    ) -> Comparison:
        from pytest_logprob_drift.diagnostics.path_split.check import check_path_split

        check_path_split(
            comparison.diagnostics,
            files[layout.SCORE_ROLLOUT_PREFILL],
            files[layout.SCORE_ROLLOUT_DECODE_REPLAY],
            scored[layout.SCORE_ROLLOUT],
            scored[layout.SCORE_TRAINING],
        )
        return comparison

    def report_plot(self, directory: Path, seal: Seal, diagnostics: Diagnostics) -> object | None:
        from pytest_logprob_drift.diagnostics.path_split.plot import load_plot  # loads torch

        return load_plot(directory, seal, diagnostics.path_split)

    def report_figures(self, plot: object | None) -> tuple[tuple[str, Markup], ...]:
        if plot is None:
            return ()
        from pytest_logprob_drift.diagnostics.path_split import plot as drawn  # loads torch

        assert isinstance(plot, drawn.PathSplitPlot)
        return (
            ("path-split", drawn.distributions_svg(plot)),
            ("path-split-position", drawn.by_position_svg(plot)),
        )

    def attribution(self) -> AttributionContribution | None:
        from pytest_logprob_drift.diagnostics.path_split.attribution import CONTRIBUTION  # torch

        return CONTRIBUTION


DIAGNOSTIC = PathSplitDiagnostic()
