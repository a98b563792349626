"""The report's content: the newest valid attempt of every case and its summary row.

Owns reading a run directory for reporting (newest valid attempt per case, through
``store.resume``'s checks, so tampered attempts never reach a report and are listed as
problems instead) and the per-case summary row shared by the terminal table and the HTML page.
Knows nothing about how rows are printed, or about execution.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_logprob_drift.store.artifacts import COMPLETE, SealError, iter_attempt_dirs
from pytest_logprob_drift.store.resume import check_attempt

HEADERS = [
    "case_id",
    "label",
    "outcome",
    "active",
    "mismatches",
    "max|diff|",
    "mismatch ratio",
    "k3 KL",
]


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


def summary_rows(cases: dict[str, dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for case_id, c in sorted(cases.items(), key=lambda kv: kv[1].get("label", "")):
        d = c.get("diagnostics", {})
        rows.append(
            [
                case_id,
                c.get("label"),
                c.get("outcome"),
                c.get("active_tokens"),
                c.get("mismatches"),
                _fmt(d.get("max_abs_diff")),
                _fmt(d.get("mismatch_ratio")),
                _fmt(d.get("approx_kl_k3")),
            ]
        )
    return rows


def newest_attempt(cases: dict[str, dict[str, Any]]) -> str:
    return max((c["attempt_id"] for c in cases.values()), default="empty")


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.3e}"
