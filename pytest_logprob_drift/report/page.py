"""Building and publishing a report page: the one call both frontends make.

Owns choosing where the page goes (``RUN_DIR/report-<newest shown attempt>.html`` unless a
path is given), loading the run with links relative to that place, rendering, and publishing
the page with ``store.artifacts.publish_bytes`` (created exclusively: an existing page is never
overwritten, and says so). Knows nothing about how the frontends print or which tokenizer a
checkpoint has (the frontend hands in a decoder factory).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_logprob_drift.report.html import render_page
from pytest_logprob_drift.report.load import load_report
from pytest_logprob_drift.report.model import DecoderFactory, ReportData
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.artifacts import publish_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedReport:
    data: ReportData
    path: Path
    written: bool
    size: int = 0


def default_name(data: ReportData) -> str:
    shown = [v.attempt_id for v in data.cases if v.attempt_id is not None]
    return layout.report_page_name(max(shown, default=None))


def publish_report(
    run_dir: Path, target: Path | None = None, *, decoder_factory: DecoderFactory | None = None
) -> PublishedReport:
    """Load ``run_dir``, render its page and create it at ``target`` (never overwriting)."""
    page_dir = target.parent if target is not None else run_dir
    data = load_report(run_dir, page_dir=page_dir, decoder_factory=decoder_factory)
    path = target if target is not None else run_dir / default_name(data)
    if path.exists():
        return PublishedReport(data=data, path=path, written=False)
    page = render_page(data).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        publish_bytes(path.parent, path.name, page)
    except FileExistsError:  # someone published it meanwhile
        return PublishedReport(data=data, path=path, written=False)
    return PublishedReport(data=data, path=path, written=True, size=len(page))
