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
from typing import TYPE_CHECKING, ClassVar

from pytest_logprob_drift.diagnostics.base import TextViewsDiagnostic
from pytest_logprob_drift.diagnostics.full_vocabulary import section
from pytest_logprob_drift.diagnostics.full_vocabulary.config import CONFIG_KEY
from pytest_logprob_drift.numerics import text
from pytest_logprob_drift.numerics.comparison import Diagnostics, FullVocabulary, from_builtins
from pytest_logprob_drift.store import layout

if TYPE_CHECKING:
    from pytest_logprob_drift.diagnostics.base import TextViews
    from pytest_logprob_drift.diagnostics.config_key import ConfigKey
    from pytest_logprob_drift.diagnostics.protocol import (
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

MEMBERS = ("full_vocabulary", "semantic_offset")
"""The declared members of comparison.json's ``diagnostics`` it seals."""


def _captured(captured: Captured | None) -> CaseDiagnostics | None:
    from pytest_logprob_drift.execute.diagnostics import CaseDiagnostics

    return captured if isinstance(captured, CaseDiagnostics) else None


@dataclass(frozen=True, slots=True)
class FullVocabularyDiagnostic(TextViewsDiagnostic):
    """``diagnostics.full_vocabulary`` / ``semantic_offset`` of a case that asks for them."""

    name: str = "full_vocabulary"
    config_key: ConfigKey | None = CONFIG_KEY
    part_type: type[FullVocabulary] = FullVocabulary
    sealed_files: tuple[str, ...] = (layout.DIVERGENCE,)
    views: ClassVar[TextViews] = text

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

    def json_parts(self, diagnostics: Diagnostics | None) -> JsonObject:
        if diagnostics is None:
            return {}
        return {m: part.to_json() for m in MEMBERS if (part := getattr(diagnostics, m)) is not None}

    def report_page_headers(self, diagnostics: Sequence[Diagnostics]) -> tuple[str, ...]:
        return section.HEADERS if section.has_parts(diagnostics) else ()

    def report_page_cells(self, diagnostics: Diagnostics) -> list[tuple[str, float | None, str]]:
        return section.page_cells(diagnostics)

    def report_token_ids(self, diagnostics: Diagnostics) -> tuple[int, ...]:
        return section.token_ids(diagnostics)

    def report_detail_section(
        self, diagnostics: Diagnostics, texts: Mapping[int, str]
    ) -> Markup | None:
        return section.section(diagnostics, texts)


DIAGNOSTIC = FullVocabularyDiagnostic()
