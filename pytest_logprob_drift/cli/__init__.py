"""The command line: ``plan``, ``run``, ``verify`` and ``report``.

Owns argument parsing, the CLI's spelling of execution-policy flags (``--allow-smoke-operators``,
``--expect``), dispatching to one module per command, and mapping errors to ``ExitCode``: 0
every case as expected, 1 some case had another outcome, 2 usage or config error (one line
naming the JSON path, never a traceback), 3 runtime or internal failure. The work itself is
done by the planner, runner, store and report; the command modules only wire and print.
Knows nothing about torch (execution modules are imported only by ``run``/``verify``/
``report``) or pytest.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from pytest_logprob_drift.errors import DriftError, ExitCode, Remedy, UsageError

FLAGS: Mapping[Remedy, str] = {Remedy.AUTHORIZE_TEST_OPERATORS: "--allow-smoke-operators"}
"""How the CLI spells each execution-policy remedy."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2, no usage dump on stderr noise
        self.exit(ExitCode.USAGE_ERROR, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="logprob-drift",
        description="Isolate which configuration change "
        "makes rollout and training log-probabilities disagree.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    plan = sub.add_parser("plan", help="plan the cases of a config (no engine is created)")
    plan.add_argument("config")
    plan.add_argument("--pairwise", action="store_true", help="also expand the listed pairs")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")

    run = sub.add_parser("run", help="execute every case and seal its artifacts")
    run.add_argument("config")
    run.add_argument("--runtime", required=True)
    run.add_argument(
        "--allow-smoke-operators",
        action="store_true",
        help="register and authorize the smoke-only selected_logprob backends",
    )
    run.add_argument("--artifacts", default="runs")
    run.add_argument("--expect", action="append", default=[], metavar="SELECTOR=OUTCOME")
    run.add_argument("--pairwise", action="store_true")
    run.add_argument(
        "--baseline-repeats",
        type=int,
        default=1,
        metavar="N",
        help="execute the baseline N times with the same engines: the run-to-run noise floor "
        "of the attribution (default 1)",
    )
    run.add_argument("--json", action="store_true", help="print the final table as JSON")

    verify = sub.add_parser("verify", help="re-check seals and recompute every verdict")
    verify.add_argument("run_dir")
    verify.add_argument("--json", action="store_true")

    report = sub.add_parser("report", help="human report of a run directory (terminal + HTML)")
    report.add_argument("run_dir")
    report.add_argument(
        "--html",
        default=None,
        help="HTML output path, never overwritten "
        "(default: RUN_DIR/report-<newest attempt id>.html)",
    )
    return parser


def main(
    argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args, out, err)
    except DriftError as exc:
        from pytest_logprob_drift.policy import render_error

        print(f"logprob-drift: error: {render_error(exc, FLAGS)}", file=err)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print("logprob-drift: interrupted", file=err)
        return ExitCode.RUNTIME_FAILURE
    except BrokenPipeError:  # `plan ... | head`: the reader left; not an error of ours
        sys.stderr = open(os.devnull, "w")
        return ExitCode.OK


def _dispatch(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.command == "plan":
        from pytest_logprob_drift.cli.plan_cmd import plan_command

        return plan_command(args, out, err)
    if args.command == "run":
        from pytest_logprob_drift.cli.run_cmd import run_command

        return run_command(args, out, err)
    if args.command == "verify":
        from pytest_logprob_drift.cli.verify_cmd import verify_command

        return verify_command(args, out)
    if args.command == "report":
        from pytest_logprob_drift.cli.report_cmd import report_command

        return report_command(args, out)
    raise UsageError(f"unhandled command {args.command}")
