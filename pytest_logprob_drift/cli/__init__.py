"""The command line: ``plan``, ``run``, ``verify`` and ``report``.

Owns argument parsing, rendering tables for people (and ``--json`` for machines), and exit
codes: 0 every case as expected, 1 some case had another outcome, 2 usage or config error (one
line naming the JSON path, never a traceback), 3 runtime or internal failure. The work itself
is done by the planner, runner and artifact store; this module only wires and prints. Knows
nothing about torch (execution modules are imported only by ``run``/``verify``/``report``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from pytest_logprob_drift.errors import DriftError
from pytest_logprob_drift.records import IssueSeverity, canonical

EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_USAGE = 2
EXIT_FAILURE = 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2, no usage dump on stderr noise
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="logprob-drift", description="Isolate which configuration change "
                     "makes rollout and training log-probabilities disagree.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    plan = sub.add_parser("plan", help="plan the cases of a config (no engine is created)")
    plan.add_argument("config")
    plan.add_argument("--pairwise", action="store_true", help="also expand the listed pairs")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")

    run = sub.add_parser("run", help="execute every case and seal its artifacts")
    run.add_argument("config")
    run.add_argument("--runtime", required=True)
    run.add_argument("--allow-smoke-operators", action="store_true")
    run.add_argument("--artifacts", default="runs")
    run.add_argument("--expect", action="append", default=[], metavar="SELECTOR=OUTCOME")
    run.add_argument("--pairwise", action="store_true")
    run.add_argument("--json", action="store_true", help="print the final table as JSON")

    verify = sub.add_parser("verify", help="re-check seals and recompute every verdict")
    verify.add_argument("run_dir")
    verify.add_argument("--json", action="store_true")

    report = sub.add_parser("report", help="human report of a run directory (terminal + HTML)")
    report.add_argument("run_dir")
    report.add_argument("--html", default=None, help="HTML output path, never overwritten "
                        "(default: RUN_DIR/report-<newest attempt id>.html)")
    return parser


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    args = build_parser().parse_args(argv)
    try:
        if args.command == "plan":
            return _plan(args, out)
        if args.command == "run":
            from pytest_logprob_drift.cli.run_cmd import run_command

            return run_command(args, out, err)
        if args.command == "verify":
            from pytest_logprob_drift.cli.run_cmd import verify_command

            return verify_command(args, out)
        if args.command == "report":
            from pytest_logprob_drift.report.html import report_command

            return report_command(args, out)
    except DriftError as exc:
        print(f"logprob-drift: error: {exc.render()}", file=err)
        return exc.exit_code
    except KeyboardInterrupt:
        print("logprob-drift: interrupted", file=err)
        return EXIT_FAILURE
    except BrokenPipeError:  # `plan ... | head`: the reader left; not an error of ours
        sys.stderr = open(os.devnull, "w")
        return EXIT_OK
    raise AssertionError(f"unhandled command {args.command}")


def _plan(args: argparse.Namespace, out: TextIO) -> int:
    from pytest_logprob_drift import plan_file

    execution_plan = plan_file(args.config, pairwise=args.pairwise)
    plan = execution_plan.plan
    rows = execution_plan.rows()
    issues = [canonical(i) for i in execution_plan.issues]
    if args.json:
        json.dump({"experiment_id": plan.experiment_id, "scenario_id": plan.scenario_id,
                   "scenario": canonical(plan.scenario), "contract": canonical(plan.contract),
                   "strategy": plan.strategy.value, "cases": rows, "issues": issues},
                  out, indent=2, sort_keys=True)
        out.write("\n")
    else:
        print(f"experiment {plan.experiment_id}  scenario {plan.scenario_id} "
              f"({plan.scenario.level.value}, {plan.scenario.device})  contract "
              f"{plan.contract.source}/{plan.contract.version} threshold "
              f"{plan.contract.threshold:g} {plan.contract.unit}", file=out)
        print(render_table(
            ["case_id", "label", "changed", "lifecycle", "selected_logprob r/t", "execution"],
            [[r["case_id"], r["label"], ",".join(r["changed"]) or "-", r["lifecycle"] or "-",
              _bindings(r), ("executable: " + ",".join(r["executable_by"]))
              if r["executable_by"] else "plan-only"] for r in rows]), file=out)
        print(f"{len(rows)} case(s)", file=out)
        for issue in execution_plan.issues:
            print(issue.render(), file=out)
    if execution_plan.has_errors:
        errors = [i for i in execution_plan.issues if i.severity is IssueSeverity.ERROR]
        print(f"logprob-drift: error: {args.config}: {errors[0].render()}"
              + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""), file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def _bindings(row: dict[str, Any]) -> str:
    by_target = {b["target"]: b["backend"] for b in row["operators"]}
    rollout, training = by_target.get("rollout", "?"), by_target.get("training", "?")
    return rollout if rollout == training else f"{rollout} / {training}"


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def has_error_issues(issues: Sequence[Any]) -> bool:
    return any(i.severity is IssueSeverity.ERROR for i in issues)
