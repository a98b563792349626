"""The ``report`` command: a run's report in the terminal and as an HTML file.

Owns printing the summary table and invalid attempts, and publishing the HTML page next to the
run (created exclusively, never overwritten). The content comes from ``report.summary`` and
``report.html``. Knows nothing about execution.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from pytest_logprob_drift.errors import ExitCode
from pytest_logprob_drift.report.html import render_html
from pytest_logprob_drift.report.summary import HEADERS, collect, newest_attempt, summary_rows
from pytest_logprob_drift.store.artifacts import publish_bytes
from pytest_logprob_drift.store.verify import require_run_dir
from pytest_logprob_drift.tables import render_table


def report_command(args: argparse.Namespace, out: TextIO) -> int:
    run_dir = Path(args.run_dir)
    require_run_dir(run_dir)
    cases, problems = collect(run_dir)
    rows = summary_rows(cases)
    print(render_table(HEADERS, rows), file=out)
    for p in problems:
        print(f"invalid attempt skipped: {p}", file=out)
    target = Path(args.html) if args.html else run_dir / f"report-{newest_attempt(cases)}.html"
    if target.exists():
        print(f"report {target} already exists; not overwritten", file=out)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        page = render_html(run_dir, HEADERS, rows, cases, problems)
        publish_bytes(target.parent, target.name, page.encode())
        print(f"HTML report: {target}", file=out)
    return ExitCode.OK
