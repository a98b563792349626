"""The ``report`` command: a run's report in the terminal and as one self-contained HTML file.

Owns printing the findings first (``report.findings``), for an imported run the steps view
(``report.steps``: the per-step figures and the first step each crossed the contract, in
place of the case table), else the case table, then the attribution ranking in text and the
invalid attempts, one screen for a run of a few cases; ``--verbose`` adds each step's worst
samples, each case's corrections and weight checks, and an import's case table (or
``--json``), saying when the shown attribution
does not verify, and publishing the HTML page next to the run (or at ``--html``; created
exclusively, never overwritten, refused inside the run's sealed tree or on a directory; none
with ``--no-html``) through ``report.page``, with the token decoder of ``runtimes.token_text``
so the page shows token text. Knows nothing about execution.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from pytest_logprob_drift.check.verify import require_run_dir
from pytest_logprob_drift.diagnostics.registry import installed
from pytest_logprob_drift.errors import ExitCode, one_line
from pytest_logprob_drift.report.findings import findings
from pytest_logprob_drift.report.load import load_report
from pytest_logprob_drift.report.page import PublishedReport, publish_report
from pytest_logprob_drift.report.steps import Crossing
from pytest_logprob_drift.report.summary import headers as summary_headers
from pytest_logprob_drift.report.summary import ranking_table, report_json, summary_rows
from pytest_logprob_drift.runtimes.token_text import token_decoder
from pytest_logprob_drift.tables import render_table


def report_command(args: argparse.Namespace, out: TextIO) -> int:
    run_dir = Path(args.run_dir)
    require_run_dir(run_dir)
    published: PublishedReport | None = None
    if args.no_html:
        data = load_report(run_dir, page_dir=run_dir, decoder_factory=token_decoder)
    else:
        published = publish_report(
            run_dir, Path(args.html) if args.html else None, decoder_factory=token_decoder
        )
        data = published.data
    if args.json:
        page = None if published is None else str(published.path)
        json.dump(report_json(data, page), out, indent=2, sort_keys=True)
        out.write("\n")
        return ExitCode.OK
    for line in findings(data).lines():
        print(one_line(line), file=out)
    verbose: bool = args.verbose
    if data.steps is not None:
        print("drift over training steps (from each step's sealed comparison):", file=out)
        headers, rows = data.steps.table()
        print(render_table(headers, rows), file=out)
        if verbose:
            for line in data.steps.lines():
                print(one_line(line), file=out)
        else:
            print(one_line(_crossings_line(data.steps.crossings)), file=out)
    if data.steps is None or verbose:
        print(render_table(summary_headers(), summary_rows(data)), file=out)
    for line in (line for diagnostic in installed() for line in diagnostic.report_run_lines(data)):
        print(one_line(line), file=out)
    if verbose:
        for view in data.cases:
            for line in (
                line
                for diagnostic in installed()
                for line in diagnostic.report_lines(view.diagnostics)
            ):
                print(one_line(f"{view.label}: {line}"), file=out)
            for side, line in view.weights:
                print(one_line(f"{view.label}: weights ({side}): {line}"), file=out)
    ranking = ranking_table(data)
    if ranking is not None:
        headers, rows, lines = ranking
        print("drift attribution (sealed, against the baseline):", file=out)
        print(render_table(headers, rows), file=out)
        for line in lines:
            print(one_line(line), file=out)
        if data.attribution_problems:
            print(
                "the sealed attribution above does not verify (shown as sealed, not vouched "
                f"for): {one_line(data.attribution_problems[0])}"
                + (
                    f" (and {len(data.attribution_problems) - 1} more)"
                    if len(data.attribution_problems) > 1
                    else ""
                ),
                file=out,
            )
    for s in data.invalid:
        line = f"invalid attempt (not shown): {s.case_id}/{s.attempt_id}: {s.file}: {s.detail}"
        print(one_line(line), file=out)
    for note in data.unread:
        print(one_line(note), file=out)
    if published is not None and published.written:
        print(one_line(f"HTML report: {published.path} ({published.size / 1e6:.2f} MB)"), file=out)
    elif published is not None:
        print(
            one_line(
                f"HTML report: {published.path} already exists; not overwritten "
                "(--html PATH writes another)"
            ),
            file=out,
        )
    if not verbose:
        print(
            "more: report --verbose (each case's corrections and weight checks), "
            "report --json, the HTML page" + ("" if published else " (without --no-html)"),
            file=out,
        )
    return ExitCode.OK


def _crossings_line(crossings: Sequence[Crossing]) -> str:
    """The first step each figure crossed the contract, in one line."""
    crossed = [c.words() for c in crossings if c.step is not None]
    never = [c.words().rsplit(":", 1)[0] for c in crossings if c.step is None]
    text = "first crossed the contract: " + ("; ".join(crossed) or "no figure")
    if never:
        text += "; never: " + ", ".join(never)
    return text
