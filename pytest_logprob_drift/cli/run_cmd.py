"""The ``run`` and ``verify`` commands: progress lines, final tables, exit codes.

Owns wiring a config file to the runner (``run``) and re-checking a run directory offline
(``verify``: every seal, every verdict recomputed from ``token_diffs.pt`` alone). Rendering
only; the runner and the resume module do the work. Imports torch through them, so it is
loaded only for these commands.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, TextIO

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.cli import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_UNEXPECTED,
    EXIT_USAGE,
    render_table,
)
from pytest_logprob_drift.errors import DriftError, UsageError
from pytest_logprob_drift.execute.runner import CaseResult, Runner
from pytest_logprob_drift.outcomes import parse_expectation
from pytest_logprob_drift.plan.binding import ExecutionCase
from pytest_logprob_drift.store.artifacts import COMPLETE, SealError, iter_attempt_dirs
from pytest_logprob_drift.store.resume import check_attempt


def _failure_text(exc: Exception) -> str:
    return exc.render() if isinstance(exc, DriftError) else f"{type(exc).__name__}: {exc}"


def _max_diff(result: CaseResult) -> str:
    value = result.comparison.get("diagnostics", {}).get("max_abs_diff")
    return "-" if value is None else f"{value:.3e}"


def run_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    expectations = [parse_expectation(text) for text in args.expect]
    execution_plan = plan_file(args.config, pairwise=args.pairwise)
    for issue in execution_plan.issues:
        if not (issue.code == "SMOKE_OPERATOR" and args.allow_smoke_operators):
            print(issue.render(), file=err)
    if execution_plan.has_errors:
        return EXIT_USAGE
    with Runner(execution_plan, runtime=args.runtime, artifacts=Path(args.artifacts),
                allow_smoke=args.allow_smoke_operators, expectations=expectations) as runner:
        for note in runner.notes:
            print(f"note: {note}", file=err)

        live = err if args.json else out  # with --json, stdout carries only the document

        def progress(index: int, total: int, ec: ExecutionCase,
                     result: CaseResult | Exception | None) -> None:
            prefix = f"[{index + 1}/{total}] {ec.case.case_id} {ec.case.label}"
            if result is None:
                print(f"{prefix} ...", file=live, flush=True)
            elif isinstance(result, Exception):
                print(f"  case {ec.case.label} failed: {_failure_text(result)}", file=err)
            else:
                how = "reused" if result.reused else "new"
                print(f"{prefix} -> {result.outcome.value} ({how}) {result.reason}", file=live,
                      flush=True)
                for skipped in result.skipped_attempts:
                    print(f"    skipped attempt {skipped}", file=live)

        crashed: list[tuple[ExecutionCase, Exception]] = []
        results = runner.run(progress=progress, failures=crashed)
        failures = [f"{ec.case.label}: {_failure_text(exc)}" for ec, exc in crashed]
        constructions = (runner.pool.rollout_constructions, runner.pool.training_constructions)
    rows = [[r.case_id, r.label, r.outcome.value, r.comparison.get("active_tokens", "-"),
             r.comparison.get("mismatches", "-"), _max_diff(r),
             "reused" if r.reused else ("new" if r.attempt_dir else "-"),
             "" if r.as_expected else f"expected {r.expected.value}"] for r in results]
    if args.json:
        json.dump({"results": [_result_json(r) for r in results], "failures": failures,
                   "engine_constructions": {"rollout": constructions[0],
                                            "training": constructions[1]}},
                  out, indent=2, sort_keys=True)
        out.write("\n")
    else:
        print(render_table(["case_id", "label", "outcome", "active", "mismatches",
                            "max|diff|", "attempt", "note"], rows), file=out)
        print(f"engine constructions: rollout {constructions[0]}, training {constructions[1]}",
              file=out)
    if failures:
        return EXIT_FAILURE
    return EXIT_OK if all(r.as_expected for r in results) else EXIT_UNEXPECTED


def _result_json(r: CaseResult) -> dict[str, Any]:
    return {"case_id": r.case_id, "label": r.label, "outcome": r.outcome.value,
            "expected": r.expected.value, "reused": r.reused, "reason": r.reason,
            "attempt_dir": None if r.attempt_dir is None else str(r.attempt_dir),
            "active_tokens": r.comparison.get("active_tokens"),
            "mismatches": r.comparison.get("mismatches"),
            "max_abs_diff": r.comparison.get("diagnostics", {}).get("max_abs_diff")}


def verify_command(args: argparse.Namespace, out: TextIO) -> int:
    run_dir = Path(args.run_dir)
    if not (run_dir / "cases").is_dir():
        raise UsageError(f"{run_dir}: not a run directory (no cases/ inside)")
    report: list[dict[str, Any]] = []
    bad = 0
    for attempt in iter_attempt_dirs(run_dir):
        entry: dict[str, Any] = {"case_id": attempt.parent.name, "attempt_id": attempt.name}
        if not (attempt / COMPLETE).exists():
            entry.update(status="incomplete", detail="no COMPLETE: never sealed; ignored by "
                         "resume")
        else:
            try:
                checked = check_attempt(attempt, expected_key=None)
                entry.update(status="ok", outcome=checked.outcome.value)
            except SealError as exc:
                bad += 1
                entry.update(status="invalid", file=exc.file, detail=exc.message)
        report.append(entry)
    if args.json:
        json.dump({"attempts": report, "invalid": bad}, out, indent=2, sort_keys=True)
        out.write("\n")
    else:
        print(render_table(["case_id", "attempt", "status", "outcome/file", "detail"],
                           [[e["case_id"], e["attempt_id"], e["status"],
                             e.get("outcome", e.get("file", "")), e.get("detail", "")]
                            for e in report]), file=out)
        print(f"{len(report)} attempt(s), {bad} invalid", file=out)
    return EXIT_UNEXPECTED if bad else EXIT_OK
