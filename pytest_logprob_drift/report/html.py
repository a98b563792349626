"""The ``report`` command: a human report of a run directory, in the terminal and as HTML.

Owns reading every sealed attempt of a run (newest valid attempt per case), and rendering the
per-case outcome, active tokens, mismatches, diagnostics, worst tokens and knob records. Reads
only through the resume module's checks, so tampered attempts never reach the report. Knows
nothing about execution.
"""

from __future__ import annotations

import argparse
import html
from pathlib import Path
from typing import Any, TextIO

from pytest_logprob_drift.cli import EXIT_OK, render_table
from pytest_logprob_drift.errors import UsageError
from pytest_logprob_drift.store.artifacts import (
    COMPLETE,
    SealError,
    iter_attempt_dirs,
    publish_bytes,
)
from pytest_logprob_drift.store.resume import check_attempt


def collect(run_dir: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    latest: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for attempt in iter_attempt_dirs(run_dir):
        if not (attempt / COMPLETE).exists():
            continue
        try:
            checked = check_attempt(attempt, expected_key=None)
        except SealError as exc:
            problems.append(f"{attempt.parent.name}/{attempt.name}: {exc}")
            continue
        case_id = attempt.parent.name
        if case_id not in latest or attempt.name > latest[case_id]["attempt_id"]:
            latest[case_id] = {"attempt_id": attempt.name, **checked.comparison}
    return latest, problems


def report_command(args: argparse.Namespace, out: TextIO) -> int:
    run_dir = Path(args.run_dir)
    if not (run_dir / "cases").is_dir():
        raise UsageError(f"{run_dir}: not a run directory (no cases/ inside)")
    cases, problems = collect(run_dir)
    rows = []
    for case_id, c in sorted(cases.items(), key=lambda kv: kv[1].get("label", "")):
        d = c.get("diagnostics", {})
        rows.append([case_id, c.get("label"), c.get("outcome"), c.get("active_tokens"),
                     c.get("mismatches"), _fmt(d.get("max_abs_diff")),
                     _fmt(d.get("mismatch_ratio")), _fmt(d.get("approx_kl_k3"))])
    headers = ["case_id", "label", "outcome", "active", "mismatches", "max|diff|",
               "mismatch ratio", "k3 KL"]
    print(render_table(headers, rows), file=out)
    for p in problems:
        print(f"invalid attempt skipped: {p}", file=out)
    target = Path(args.html) if args.html else run_dir / f"report-{_stamp(cases)}.html"
    if target.exists():
        print(f"report {target} already exists; not overwritten", file=out)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        publish_bytes(target.parent, target.name, _html(run_dir, headers, rows, cases,
                                                        problems).encode())
        print(f"HTML report: {target}", file=out)
    return EXIT_OK


def _stamp(cases: dict[str, dict[str, Any]]) -> str:
    return max((c["attempt_id"] for c in cases.values()), default="empty")


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.3e}"


def _html(run_dir: Path, headers: list[str], rows: list[list[Any]],
          cases: dict[str, dict[str, Any]], problems: list[str]) -> str:
    esc = html.escape
    parts = [f"<!doctype html><meta charset='utf-8'><title>logprob drift: {esc(str(run_dir))}"
             "</title><style>body{font-family:sans-serif}td,th{padding:2px 8px;"
             "border-bottom:1px solid #ddd}.MISMATCH{color:#b00}.PASS{color:#070}</style>",
             f"<h1>{esc(run_dir.name)}</h1><table><tr>"
             + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr>"]
    for row in rows:
        parts.append("<tr>" + "".join(f"<td class='{esc(str(c))}'>{esc(str(c))}</td>"
                                      for c in row) + "</tr>")
    parts.append("</table>")
    for case_id, c in sorted(cases.items()):
        parts.append(f"<h2>{esc(str(c.get('label')))} <small>{esc(case_id)}</small></h2>"
                     f"<p>{esc(str(c.get('reason', '')))}</p><table><tr><th>sample</th>"
                     "<th>position</th><th>rollout</th><th>training</th><th>|diff|</th></tr>")
        for w in c.get("worst_tokens", []):
            parts.append("<tr>" + "".join(f"<td>{esc(str(w.get(k)))}</td>" for k in (
                "sample", "position", "rollout_logprob", "training_logprob", "abs_diff"))
                + "</tr>")
        parts.append("</table>")
    for p in problems:
        parts.append(f"<p class='MISMATCH'>invalid attempt skipped: {esc(p)}</p>")
    return "".join(parts)
