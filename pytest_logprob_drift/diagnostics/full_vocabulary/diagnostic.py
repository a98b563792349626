"""The full-vocabulary ``Diagnostic``: its capture, parts, file, check and run views.

Owns binding ``diagnostics.full_vocabulary`` (and the ``semantic_offset`` member it seals with
it) to the protocol: the reductions captured after the paired scoring when the case asks for
them (``execute.diagnostics``, imported on first use: it needs torch), the two parts and
``divergence.pt`` sealed from that capture, the offline check (``check``) and its views in the
run output, the plugin's failure text and junit properties, and ``run --json``
(``numerics.text``). Torch-free at import.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_logprob_drift.numerics import text
from pytest_logprob_drift.numerics.comparison import Diagnostics, FullVocabulary, from_builtins
from pytest_logprob_drift.store import layout

if TYPE_CHECKING:
    from pathlib import Path

    from pytest_logprob_drift.diagnostics.protocol import (
        AttributionContribution,
        Captured,
        CaseUnderCapture,
        Scores,
        Tensors,
    )
    from pytest_logprob_drift.execute.diagnostics import CaseDiagnostics
    from pytest_logprob_drift.numerics.comparison import Comparison, Record
    from pytest_logprob_drift.outcomes import Outcome
    from pytest_logprob_drift.records import JsonObject
    from pytest_logprob_drift.report.markup import Markup
    from pytest_logprob_drift.report.model import CaseView
    from pytest_logprob_drift.store.attempt import Seal

MEMBERS = ("full_vocabulary", "semantic_offset")
"""The declared members of comparison.json's ``diagnostics`` it seals."""


def _captured(captured: Captured | None) -> CaseDiagnostics | None:
    from pytest_logprob_drift.execute.diagnostics import CaseDiagnostics

    return captured if isinstance(captured, CaseDiagnostics) else None


@dataclass(frozen=True, slots=True)
class FullVocabularyDiagnostic:
    """``diagnostics.full_vocabulary`` / ``semantic_offset`` of a case that asks for them."""

    name: str = "full_vocabulary"
    part_type: type[FullVocabulary] = FullVocabulary
    sealed_files: tuple[str, ...] = (layout.DIVERGENCE,)
    always_in_table: bool = False

    def capture(self, case: CaseUnderCapture) -> Captured | None:
        spec = case.binding.full_vocabulary
        if spec is None:
            return None
        from pytest_logprob_drift.execute.diagnostics import full_vocabulary

        return full_vocabulary(spec, case.rollout, case.training, sampling=case.identity.sampling)

    def seal(
        self, outcome: Outcome, scores: Scores | None, captured: Captured | None
    ) -> Mapping[str, Record]:
        extra = _captured(captured)
        if extra is None:
            return {}
        parts = from_builtins(extra.entries, Diagnostics)
        return {m: part for m in MEMBERS if (part := getattr(parts, m)) is not None}

    def files(
        self, outcome: Outcome, scores: Scores | None, captured: Captured | None
    ) -> Mapping[str, Tensors]:
        extra = _captured(captured)
        if extra is None or extra.tensors is None:
            return {}
        return {layout.DIVERGENCE: extra.tensors}

    def check(
        self,
        comparison: Comparison,
        diffs: Tensors,
        files: Mapping[str, Tensors | None],
        scored: Mapping[str, Tensors],
    ) -> Comparison:
        from pytest_logprob_drift.diagnostics.full_vocabulary.check import check_divergence

        check_divergence(comparison.diagnostics, files[layout.DIVERGENCE], diffs)
        return comparison

    def shown(self, diagnostics: Sequence[Diagnostics | None]) -> bool:
        return text.has_full_vocabulary(diagnostics)

    def table_headers(self) -> tuple[str, ...]:
        return text.HEADERS

    def table_cells(self, diagnostics: Diagnostics | None) -> list[str]:
        return text.cells(diagnostics)

    def run_lines(self, diagnostics: Diagnostics | None) -> list[str]:
        return text.lines(diagnostics)

    def failure_lines(self, diagnostics: Diagnostics | None) -> list[str]:
        return text.lines(diagnostics)

    def report_lines(self, diagnostics: Diagnostics | None) -> list[str]:
        return []

    def properties(self, diagnostics: Diagnostics | None) -> list[tuple[str, str]]:
        return text.properties(diagnostics)

    def json_parts(self, diagnostics: Diagnostics | None) -> JsonObject:
        if diagnostics is None:
            return {}
        return {m: part.to_json() for m in MEMBERS if (part := getattr(diagnostics, m)) is not None}

    def report_headers(self) -> tuple[str, ...]:
        return ()

    def report_cells(self, diagnostics: Diagnostics) -> list[tuple[str, float | None]]:
        return []

    def report_section(self, diagnostics: Diagnostics) -> Markup | None:
        return None

    def report_plot(self, directory: Path, seal: Seal, diagnostics: Diagnostics) -> object | None:
        return None

    def report_figures(self, plot: object | None) -> tuple[tuple[str, Markup], ...]:
        return ()

    def report_run_section(self, cases: Sequence[CaseView], draw: bool) -> Markup | None:
        return None

    def attribution(self) -> AttributionContribution | None:
        return None  # the attribution document has no full-vocabulary member


DIAGNOSTIC = FullVocabularyDiagnostic()
