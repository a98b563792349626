"""Building and publishing a report page: the one call both frontends make.

Owns choosing where the page goes (``RUN_DIR/report-<newest shown attempt>.html`` unless a
path is given; a given path inside the run's sealed tree, where an unsealed file would make
``verify`` reject the attempt or attribution it lands in, or one that is a directory, is
refused), loading the run with links relative to that place, rendering, and publishing
the page with ``store.files.publish_bytes`` (created exclusively: an existing page is never
overwritten, and says so). Knows nothing about how the frontends print or which tokenizer a
checkpoint has (the frontend hands in a decoder factory).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_logprob_drift.errors import UsageError, one_line
from pytest_logprob_drift.report.html import render_page
from pytest_logprob_drift.report.load import load_report
from pytest_logprob_drift.report.model import DecoderFactory, ReportData
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.files import publish_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedReport:
    data: ReportData
    path: Path
    written: bool
    size: int = 0


def default_name(data: ReportData) -> str:
    shown = [v.attempt_id for v in data.cases if v.attempt_id is not None]
    return layout.report_page_name(max(shown, default=None))


SEALED_TREE = (layout.CASES, layout.ATTRIBUTIONS, layout.SEALS)
"""The directories of a run that hold sealed evidence only (attempts, attributions, run
seals): no report page is written below them."""


def check_page_path(run_dir: Path, target: Path) -> None:
    """Refuse a page path that is a directory or lies inside ``run_dir``'s sealed tree (links
    followed: the place the page would really be written)."""
    if target.is_dir():
        raise UsageError(f"report page {one_line(str(target))} is a directory; name a file")
    where = target.resolve()
    for name in SEALED_TREE:
        tree = (run_dir / name).resolve()
        if where.is_relative_to(tree):
            raise UsageError(
                f"report page {one_line(str(target))} is inside the run's sealed tree "
                f"({one_line(str(run_dir / name))}): an unsealed file there makes verify reject "
                "the evidence it lands in; write the page outside cases/, attributions/ and seals/"
            )


def publish_report(
    run_dir: Path, target: Path | None = None, *, decoder_factory: DecoderFactory | None = None
) -> PublishedReport:
    """Load ``run_dir``, render its page and create it at ``target`` (never overwriting)."""
    if target is not None:
        check_page_path(run_dir, target)
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
