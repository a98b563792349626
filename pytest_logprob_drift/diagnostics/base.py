"""Empty defaults of the ``Diagnostic`` protocol, so that a diagnostic writes only what it has.

Owns ``DiagnosticBase`` (every optional member empty: no capture, no files, no columns, no
lines, no properties, no ``run --json`` member, no report columns, page columns, sections, plot,
figures, token ids to decode, run-scope part or attribution contribution; its run-table columns
shown when some case carries its part) and ``TextViewsDiagnostic`` (the run views forwarded to
one text-views module: ``HEADERS``, ``cells``, ``lines`` and ``properties``, the same lines in
the run output and the plugin's failure text). A convenience, not the protocol: a diagnostic
that implements every member itself (the test tree's ``log_ratio_peak``) is just as installed.
Torch-free and typing-free at import.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is never imported at run time (diagnostics/ is cheap to import)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path
    from typing import ClassVar, Protocol

    from pytest_logprob_drift.diagnostics.config_key import ConfigKey
    from pytest_logprob_drift.diagnostics.protocol import (
        AttributionContribution,
        Captured,
        CaseUnderCapture,
        Scores,
        Tensors,
    )
    from pytest_logprob_drift.numerics.comparison import Diagnostics
    from pytest_logprob_drift.outcomes import Outcome
    from pytest_logprob_drift.records import JsonObject
    from pytest_logprob_drift.report.markup import Markup
    from pytest_logprob_drift.report.model import ReportData
    from pytest_logprob_drift.store.attempt import Seal

    class TextViews(Protocol):
        """A text-views module: the run table's columns, a case's lines and properties."""

        @property
        def HEADERS(self) -> tuple[str, ...]: ...

        def cells(self, diagnostics: Diagnostics | None) -> list[str]: ...

        def lines(self, diagnostics: Diagnostics | None) -> list[str]: ...

        def properties(self, diagnostics: Diagnostics | None) -> list[tuple[str, str]]: ...


class DiagnosticBase:
    """The protocol's optional members, each empty; ``name``, ``part_type``, ``seal`` and
    ``check`` are the subclass's own."""

    __slots__ = ()

    if TYPE_CHECKING:
        name: str

    sealed_files: tuple[str, ...] = ()
    always_in_table: bool = False
    config_key: ConfigKey | None = None

    def capture(self, case: CaseUnderCapture) -> Captured | None:
        return None

    def files(
        self, outcome: Outcome, scores: Scores | None, captured: Captured | None
    ) -> Mapping[str, Tensors]:
        return {}

    def shown(self, diagnostics: Sequence[Diagnostics | None]) -> bool:
        """Whether some case carries its part (``diagnostics.<name>``)."""
        return any(d is not None and getattr(d, self.name, None) is not None for d in diagnostics)

    def table_headers(self) -> tuple[str, ...]:
        return ()

    def table_cells(self, diagnostics: Diagnostics | None) -> list[str]:
        return []

    def run_lines(self, diagnostics: Diagnostics | None) -> list[str]:
        return []

    def failure_lines(self, diagnostics: Diagnostics | None) -> list[str]:
        return []

    def report_lines(self, diagnostics: Diagnostics | None) -> list[str]:
        return []

    def properties(self, diagnostics: Diagnostics | None) -> list[tuple[str, str]]:
        return []

    def json_parts(self, diagnostics: Diagnostics | None) -> JsonObject:
        return {}

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

    def report_run_lines(self, data: ReportData) -> list[str]:
        return []

    def report_run_section(self, data: ReportData, place: str, draw: bool) -> Markup | None:
        return None

    def report_page_headers(self, diagnostics: Sequence[Diagnostics]) -> tuple[str, ...]:
        return ()

    def report_page_cells(self, diagnostics: Diagnostics) -> list[tuple[str, float | None, str]]:
        return []

    def report_token_ids(self, diagnostics: Diagnostics) -> tuple[int, ...]:
        return ()

    def report_detail_section(
        self, diagnostics: Diagnostics, texts: Mapping[int, str]
    ) -> Markup | None:
        return None

    def attribution(self) -> AttributionContribution | None:
        return None


class TextViewsDiagnostic(DiagnosticBase):
    """A ``DiagnosticBase`` whose run views are its class's ``views`` module's."""

    __slots__ = ()

    if TYPE_CHECKING:
        views: ClassVar[TextViews]

    def table_headers(self) -> tuple[str, ...]:
        return self.views.HEADERS

    def table_cells(self, diagnostics: Diagnostics | None) -> list[str]:
        return self.views.cells(diagnostics)

    def run_lines(self, diagnostics: Diagnostics | None) -> list[str]:
        return self.views.lines(diagnostics)

    def failure_lines(self, diagnostics: Diagnostics | None) -> list[str]:
        return self.views.lines(diagnostics)

    def properties(self, diagnostics: Diagnostics | None) -> list[tuple[str, str]]:
        return self.views.properties(diagnostics)
