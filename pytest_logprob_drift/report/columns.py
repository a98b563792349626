"""The case table's columns, declared once: what each shows, and which are behind "more columns".

Owns ``case_columns()``, the ordered list of the page's case-table columns: a title, the cell of
one case (a ``<td>`` built with ``markup.el``, with its sort value in ``data-v``), whether it is
in the default set or behind the page's "more columns" toggle (``more``), and when the column
exists at all (a diagnostic's page columns when its ``report_page_headers`` name them for the
page's cases, the attribution's when a sealed attribution is shown). The default set is chosen
to fit a 1280 px window (the case, its outcome and sizes, max and mean |diff|, and the
attribution's side, effect and interval); every other column is ``more``. A diagnostic adds its
columns through the protocol (``report_headers`` / ``report_page_headers``), as ``more``
entries. Also the case's anchor on the page and an attempt id as a time. Knows nothing about the
rest of the page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from msgspec import UNSET

from pytest_logprob_drift.attribution.document import Ratio
from pytest_logprob_drift.diagnostics.registry import installed
from pytest_logprob_drift.report import gates
from pytest_logprob_drift.report.markup import Child, Markup, el, fragment_link, page_link
from pytest_logprob_drift.report.model import CaseView, ReportData
from pytest_logprob_drift.report.summary import (
    FRAMEWORK_FIGURES,
    PEER_METRICS,
    fmt_diff,
    fmt_ratio,
    framework_figure,
    interval,
)
from pytest_logprob_drift.store import layout

if TYPE_CHECKING:
    from pytest_logprob_drift.diagnostics.protocol import Diagnostic


def case_anchor(view: CaseView) -> str:
    return f"case-{view.case_id}"


def attempt_time(attempt_id: str | None) -> str:
    """An attempt id (``YYYYMMDDTHHMMSS...``) as ``YYYY-MM-DD HH:MM:SS``."""
    if not attempt_id or len(attempt_id) < 16:
        return "-"
    t = attempt_id
    return f"{t[0:4]}-{t[4:6]}-{t[6:8]} {t[9:11]}:{t[11:13]}:{t[13:15]}"


def number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class CellValue:
    """One cell: what it shows, its sort value (``data-v``; else its text sorts) and class."""

    content: Child
    sort: str | None = None
    cls: str = ""

    def element(self, *, more: bool = False) -> Markup:
        cls = " ".join(c for c in (self.cls, "more" if more else "") if c)
        return el("td", self.content, class_=cls or None, data_v=self.sort)


def td(value: Any, *, num: float | None = None, cls: str = "") -> CellValue:
    return CellValue(str(value), None if num is None else repr(num), cls)


def _always(data: ReportData) -> bool:
    return True


def _attributed(data: ReportData) -> bool:
    return data.attribution is not None


Cell = Callable[[CaseView], CellValue]


@dataclass(frozen=True, slots=True, kw_only=True)
class Column:
    title: str
    cell: Cell
    more: bool = False
    """Behind the "more columns" toggle (hidden until it is pressed)."""
    shown: Callable[[ReportData], bool] = _always
    """Whether the page has this column at all."""


def _label(view: CaseView) -> CellValue:
    label = (
        el("a", view.label, href=fragment_link(case_anchor(view)))
        if view.detail is not None
        else view.label
    )
    return CellValue(label, view.label, "label")


def _count(value: int | None) -> CellValue:
    return td("-" if value is None else value, num=number(value), cls="n")


def _statistic(key: str) -> Cell:
    def cell(view: CaseView) -> CellValue:
        value = view.diagnostics.statistic(key)
        return td(fmt_diff(value), num=number(value), cls="n")

    return cell


def _framework_figure(key: str) -> Cell:
    def cell(view: CaseView) -> CellValue:
        value = framework_figure(view.diagnostics, key)
        return td(fmt_diff(value), num=number(value), cls="n")

    return cell


def _has_framework_figure(key: str) -> Callable[[ReportData], bool]:
    def shown(data: ReportData) -> bool:
        return any(framework_figure(v.diagnostics, key) is not None for v in data.cases)

    return shown


def _masked_by_run(view: CaseView) -> CellValue:
    masked = view.diagnostics.masked_by_run
    if masked is None:
        return td("-")
    text = (
        f"{masked.samples} samples, {masked.tokens} tokens: {masked.mismatches} mismatches, "
        f"max |diff| {fmt_diff(masked.max_abs_diff)}"
        + (f", {masked.nonfinite_tokens} non-finite" if masked.nonfinite_tokens else "")
    )
    return td(text, num=masked.mismatches)


def _any_masked_by_run(data: ReportData) -> bool:
    return any(v.diagnostics.masked_by_run is not None for v in data.cases)


def _diagnostic(diagnostic: Diagnostic, index: int) -> Cell:
    def cell(view: CaseView) -> CellValue:
        text, value = diagnostic.report_cells(view.diagnostics)[index]
        return td(text, num=value, cls="n")

    return cell


def _page(diagnostic: Diagnostic, index: int) -> Cell:
    def cell(view: CaseView) -> CellValue:
        text, value, cls = diagnostic.report_page_cells(view.diagnostics)[index]
        return td(text, num=value, cls=cls)

    return cell


def _ratio(view: CaseView, p99: bool = False) -> Ratio | None:
    """The case's mean (or p99) |diff| ratio in the shown attribution (None: none)."""
    if view.attribution is None:
        return None
    effect = view.attribution.effect
    ratio = effect.p99_ratio if p99 else effect.mean_ratio
    return None if ratio is UNSET else ratio


def _side(view: CaseView) -> CellValue:
    words = (
        view.attribution.classification
        if view.attribution is not None
        else ("baseline" if not view.changed else "-")
    )
    return td(words, cls="words")


def _mean_ratio(view: CaseView) -> CellValue:
    ratio = _ratio(view)
    value = None if ratio is None else ratio.value
    return td(fmt_ratio(value), num=value, cls="n")


def _interval(view: CaseView) -> CellValue:
    return td(interval(_ratio(view)))


def _p99_ratio(view: CaseView) -> CellValue:
    ratio = _ratio(view, p99=True)
    value = None if ratio is None else ratio.value
    return td(fmt_ratio(value), num=value, cls="n")


def _attempt(view: CaseView) -> CellValue:
    attempt = view.attempt_id or "-"
    comparison = dict(view.files).get(layout.COMPARISON)
    if not comparison:
        return td(attempt)
    link = el("a", attempt_time(attempt), href=page_link(comparison), title=attempt)
    return CellValue(link, attempt)


_CORE_COLUMNS: tuple[Column, ...] = (
    Column(title="case", cell=_label),
    Column(title="outcome", cell=lambda v: CellValue(v.outcome, None, "outcome")),
    Column(title="changed", cell=lambda v: td(", ".join(v.changed) or "(baseline)"), more=True),
    Column(title="active", cell=lambda v: _count(v.active_tokens)),
    Column(title="mismatches", cell=lambda v: _count(v.mismatches)),
    Column(title="max |diff|", cell=_statistic("max_abs_diff")),
    Column(
        title="masked by the run (for drift or another reason; not in the verdict)",
        cell=_masked_by_run,
        shown=_any_masked_by_run,
    ),
    Column(title="p99 |diff|", cell=_statistic("p99_abs_diff"), more=True),
    Column(title="mean |diff|", cell=_statistic("mean_abs_diff")),
    Column(
        title=gates.TITLE,
        cell=lambda v: td(gates.failed_cell(v.gates), num=sum(not g.passed for g in v.gates)),
        shown=lambda data: any(v.gates for v in data.cases),
    ),
    *(Column(title=title, cell=_statistic(key), more=True) for title, key in PEER_METRICS),
    *(
        Column(
            title=title, cell=_framework_figure(key), more=True, shown=_has_framework_figure(key)
        )
        for title, key in FRAMEWORK_FIGURES
    ),
)
"""The columns before the installed diagnostics' (``case_columns``)."""

_LATER_COLUMNS: tuple[Column, ...] = (
    Column(title="which side moved", cell=_side, shown=_attributed),
    Column(title="mean |diff| ratio", cell=_mean_ratio, shown=_attributed),
    Column(title="95% interval", cell=_interval, shown=_attributed),
    Column(title="p99 ratio", cell=_p99_ratio, more=True, shown=_attributed),
    Column(title="attempt (UTC)", cell=_attempt, more=True),
)
"""The columns after the installed diagnostics' (``case_columns``)."""


def case_columns(data: ReportData) -> tuple[Column, ...]:
    """Every case-table column of ``data``'s page in page order, each installed diagnostic's
    among them (its report columns, then every diagnostic's page columns for these cases);
    ``more`` ones are behind the toggle."""
    cases = [v.diagnostics for v in data.cases]
    return (
        *_CORE_COLUMNS,
        *(
            Column(title=title, cell=_diagnostic(diagnostic, i), more=True)
            for diagnostic in installed()
            for i, title in enumerate(diagnostic.report_headers())
        ),
        *(
            Column(title=title, cell=_page(diagnostic, i), more=True)
            for diagnostic in installed()
            for i, title in enumerate(diagnostic.report_page_headers(cases))
        ),
        *_LATER_COLUMNS,
    )


def columns(data: ReportData) -> tuple[Column, ...]:
    """The columns this page has."""
    return tuple(c for c in case_columns(data) if c.shown(data))
