"""The command line: ``plan``, ``run``, ``verify``, ``report``, ``prompts``, ``init`` and
``import``.

Owns argument parsing, the CLI's spelling of execution-policy flags (``--allow-smoke-operators``,
``--expect``, ``--seal-key-file``/``--seal-key-env``: the key made active around ``run`` and
``verify``), dispatching to one module per command, and mapping errors to ``ExitCode``: 0
every case as expected, 1 some case had another outcome, 2 usage or config error (one line
naming the JSON path, never a traceback; also an artifacts location that cannot hold a run),
3 runtime or internal failure (also an I/O failure such as a full disk; a file-system error
no module named is still one line, and so is running out of memory or any other exception
that escapes a command: a bug, never a traceback). The work itself is done by the planner,
runner, store and report; the command modules only wire and print.
Knows nothing about torch (execution modules are imported only by ``run``/``verify``/
``report``) or pytest.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import os
import sys
from collections.abc import Mapping, Sequence

from pytest_logprob_drift.errors import DriftError, ExitCode, Remedy, UsageError, one_line

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Any, TextIO

FLAGS: Mapping[Remedy, str] = {
    Remedy.AUTHORIZE_TEST_OPERATORS: "--allow-smoke-operators",
    Remedy.EXPAND_PAIRS: "--pairwise",
}
"""How the CLI spells each execution-policy remedy."""


RUNTIME_NAMES = "{runtime names}"
"""Placeholder in a help text or epilog for the runtimes a run may name, filled in from the
catalog the frontends assemble only when help is shown (building the parser costs ``plan``
no catalog)."""


def runtime_names() -> str:
    """The runtimes ``--runtime`` accepts, as the catalog names them."""
    from pytest_logprob_drift.policy import runtime_catalog

    return ", ".join(runtime_catalog().names)


def runtime_lines() -> str:
    """One line per runtime: its name, what it executes (levels, devices) and what it pairs."""
    from pytest_logprob_drift.policy import runtime_catalog

    catalog = runtime_catalog()
    lines = []
    for name in catalog.names:
        info = catalog.get(name)
        where = info.where()
        extra = f"; extra '{info.extra}'" if info.extra else ""
        lines.append(f"  {name:<10} {where}{extra}:\n             {info.summary}")
    return "\n".join(lines)


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter with the terminal width taken from ``os`` (argparse asks
    ``shutil``, whose import with its compression modules cost ``plan`` more than planning),
    and the runtime names filled in where a text holds ``RUNTIME_NAMES``."""

    def __init__(self, prog: str) -> None:
        try:
            columns = int(os.environ.get("COLUMNS", "")) or 0
        except ValueError:
            columns = 0
        if not columns:
            try:
                columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
            except (AttributeError, OSError, ValueError):
                columns = 80
        super().__init__(prog, width=max(columns - 2, 20))

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = super()._get_help_string(action)
        if text is not None and RUNTIME_NAMES in text:
            text = text.replace(RUNTIME_NAMES, runtime_names())
        return text


class RawDescriptionFormatter(_Formatter, argparse.RawDescriptionHelpFormatter):
    """The CLI's formatter, keeping a command's description and epilog as written (its lines,
    lists), with ``RUNTIME_NAMES`` replaced by one line per runtime."""

    def _format_text(self, text: str) -> str:
        if RUNTIME_NAMES in text:
            text = text.replace(RUNTIME_NAMES, runtime_lines())
        return super()._format_text(text)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" not in text:  # one paragraph: wrapped to the terminal
            return argparse.HelpFormatter._fill_text(self, text, width, indent)
        return super()._fill_text(text, width, indent)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:  # one line, exit 2, no usage dump on stderr noise
        self.exit(ExitCode.USAGE_ERROR, f"{self.prog}: error: {message}\n")


EXIT_CODES = """\
exit codes:
  0  every case had its expected outcome (PASS unless --expect says otherwise)
  1  some case had another outcome (verify: some attempt or run file is invalid)
  2  usage or config error: one line naming the JSON path or the flag (also an --expect
     selector that matches no planned case, an artifacts location that cannot hold a run)
  3  runtime failure (an engine failed, an I/O failure such as a full disk, a bug)
Every error is one line on stderr, never a traceback."""

EXPECT_SYNTAX = """\
--expect SELECTOR=OUTCOME (repeatable; the last match wins; unmatched cases expect PASS):
  SELECTOR  a case label as `plan` prints it (baseline, rollout.dtype=bfloat16,
            batch.size=1,training.sharding=fsdp), a case id or a prefix of it (4+ hex
            digits), or * for every case; the selector is everything before the last '='
  OUTCOME   PASS, MISMATCH, ZERO_ACTIVE_TOKENS, INVALID_IDENTITY, INVALID_ARTIFACT,
            STRICT_REJECTED or PLAN_ONLY
  A selector that matches no planned case is a usage error (exit 2)."""

MAIN_EPILOG = f"""\
runtimes (run --runtime NAME):
{RUNTIME_NAMES}

{EXIT_CODES}

examples:
  logprob-drift plan experiments/cross_config_s3_qwen3_8b_tp4_cp4_bf16.json
  logprob-drift run experiments/cross_config_s1_vllm_cpu_tiny.json --runtime vllm-hf \\
      --expect rollout.dtype=bfloat16=MISMATCH

`logprob-drift COMMAND --help` describes each command; the documentation is in docs/."""

RUN_EPILOG = f"""\
runtimes:
{RUNTIME_NAMES}
A case whose scenario (level, device) the runtime does not execute is PLAN_ONLY.

{EXPECT_SYNTAX}

{EXIT_CODES}

examples:
  logprob-drift run experiments/cross_config_s1_vllm_cpu_tiny.json --runtime vllm-hf \\
      --expect rollout.dtype=bfloat16=MISMATCH
  logprob-drift run experiments/cross_config_s0_cpu_smoke.json --runtime cpu-smoke \\
      --allow-smoke-operators --expect logp.backend=smoke_only.logp_offset=MISMATCH"""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="logprob-drift",
        description="Isolate which configuration change makes rollout and training "
        "log-probabilities disagree: plan cases from one baseline and declared interventions, "
        "run paired scoring on real engines, judge every active token by "
        "abs(training_logprob - rollout_logprob) > threshold (the versioned numerical "
        "contract's), and seal the evidence on disk.",
        epilog=MAIN_EPILOG,
        formatter_class=RawDescriptionFormatter,
    )
    sub = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser, metavar="COMMAND"
    )

    config_help = "an experiment config (JSON): one baseline plus declared interventions"
    plan = sub.add_parser(
        "plan",
        help="plan the cases of a config (no engine is created)",
        description="Load a config strictly, plan its cases (one change at a time; listed "
        "pairs with --pairwise) and bind each side's selected_logprob backend, without "
        "importing an engine. Prints one row per case: its id, label and lifecycle. Exit 0 "
        "when it plans, 2 with one line per fault (each naming its JSON path).",
        epilog="example:\n"
        "  logprob-drift plan experiments/cross_config_s3_qwen3_8b_tp4_cp4_bf16.json",
        formatter_class=RawDescriptionFormatter,
    )
    plan.add_argument("config", metavar="CONFIG", help=config_help)
    plan.add_argument(
        "--pairwise",
        action="store_true",
        help="also expand the pairs the config lists under 'pairs' (default: one change at a "
        "time only)",
    )
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")

    run = sub.add_parser(
        "run",
        help="execute every case and seal its artifacts",
        description="Execute every planned case on a runtime: sample with the rollout engine, "
        "recompute with the trainer, judge every active token, seal the attempt under "
        "ARTIFACTS/<experiment_id>/, attribute each case against the baseline, and print the "
        "case table. Sealed attempts that match are reused (a rerun resumes).",
        epilog=RUN_EPILOG,
        formatter_class=RawDescriptionFormatter,
    )
    run.add_argument("config", metavar="CONFIG", help=config_help)
    run.add_argument(
        "--runtime",
        required=True,
        metavar="NAME",
        help=f"the runtime that executes the cases: one of {RUNTIME_NAMES}",
    )
    run.add_argument(
        "--allow-smoke-operators",
        action="store_true",
        help="register and authorize the smoke-only selected_logprob backends",
    )
    run.add_argument(
        "--artifacts",
        default="runs",
        metavar="DIR",
        help="the artifact root; the run is DIR/<experiment_id>/ (default: runs)",
    )
    run.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="SELECTOR=OUTCOME",
        help="the outcome a case is expected to have (repeatable; see below); exit 0 when "
        "every case has its expected outcome",
    )
    run.add_argument(
        "--pairwise",
        action="store_true",
        help="also run the pairs the config lists under 'pairs'",
    )
    run.add_argument(
        "--replay",
        action="store_true",
        help="replay every case's sampled sequences on its rollout engine (decode vs prefill "
        "diagnostics, as the config's diagnostics.replay; never a verdict)",
    )
    run.add_argument(
        "--baseline-repeats",
        type=int,
        default=1,
        metavar="N",
        help="execute the baseline N times with the same engines: the run-to-run noise floor "
        "of the attribution (default 1)",
    )
    run.add_argument(
        "--launcher",
        choices=("local", "ray"),
        default="local",
        help="how engines' processes start: local child processes (default) or Ray (training "
        "ranks as actors in a placement group, vLLM's Ray executor for TP > 1, engine groups "
        "side by side when the cluster fits them; extra 'ray')",
    )
    run.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="with --launcher ray: the cluster to join (default: RAY_ADDRESS, else a local "
        "cluster on 127.0.0.1 started and shut down by this run)",
    )
    run.add_argument(
        "--ray-num-cpus",
        type=int,
        default=None,
        metavar="N",
        help="with --launcher ray: CPUs of the local cluster this run starts (default: all)",
    )
    run.add_argument(
        "--ray-rank-cpus",
        type=float,
        default=1.0,
        metavar="C",
        help="with --launcher ray on a CPU scenario: CPUs each training rank actor declares "
        "(default 1)",
    )
    run.add_argument(
        "--serial",
        action="store_true",
        help="with --launcher ray: run every case one after another",
    )
    run.add_argument("--json", action="store_true", help="print the final table as JSON")
    run.add_argument(
        "-v",
        "--engine-logs",
        action="store_true",
        help="show vLLM's and transformers' own logs on the terminal (default: kept in "
        "ARTIFACTS/<experiment>/engine-logs/)",
    )

    verify = sub.add_parser(
        "verify",
        help="re-check seals and recompute every verdict",
        description="Re-hash every sealed file of a run directory, recompute every verdict "
        "from token_diffs.pt (and check it holds exactly the logprobs and mask of both "
        "score files), recompute the diagnostics and the sealed attribution, and list every "
        "invalid attempt or run file. Reads only; nothing is written.",
        epilog="exit codes: 0 everything verifies, 1 some attempt or run file is invalid, "
        "2 usage error (not a run directory, a bad key option), 3 runtime failure.\n\n"
        "example:\n  logprob-drift verify runs/s1-vllm-cpu-tiny",
        formatter_class=RawDescriptionFormatter,
    )
    verify.add_argument(
        "run_dir", metavar="RUN_DIR", help="a run directory (ARTIFACTS/<experiment_id>)"
    )
    verify.add_argument("--json", action="store_true", help="print the findings as JSON")
    for command in (run, verify):
        _add_seal_key_options(command)

    report = sub.add_parser(
        "report",
        help="human report of a run directory (terminal + HTML)",
        description="Print the findings, the case table and the attribution ranking of a run "
        "directory, and write one self-contained HTML page (no network: plots as inline SVG, "
        "the 'report' extra; without it the page says so). Every attempt is verified first; "
        "invalid ones are listed, never plotted.",
        epilog="exit codes: 0 the report was printed (and its page written), 2 usage error "
        "(not a run directory, an HTML path inside the sealed tree or one that exists), "
        "3 runtime failure.\n\n"
        "example:\n  logprob-drift report runs/s1-vllm-cpu-tiny --html s1.html",
        formatter_class=RawDescriptionFormatter,
    )
    report.add_argument(
        "run_dir", metavar="RUN_DIR", help="a run directory (ARTIFACTS/<experiment_id>)"
    )
    page = report.add_mutually_exclusive_group()
    page.add_argument(
        "--html",
        default=None,
        metavar="PATH",
        help="HTML output path, never overwritten "
        "(default: RUN_DIR/report-<newest attempt id>.html)",
    )
    page.add_argument(
        "--no-html",
        action="store_true",
        help="print the report only; write no HTML page (the plots are the page's time)",
    )
    report.add_argument(
        "--json", action="store_true", help="print the report (findings, rows) as JSON"
    )
    report.add_argument(
        "--verbose",
        action="store_true",
        help="also print what each framework's correction would do per case, each side's "
        "weight check, each step's worst samples and, for an imported run, the case table "
        "beside the step table (the page and --json always hold them)",
    )

    from pytest_logprob_drift.cli.import_cmd import add_import_parser
    from pytest_logprob_drift.cli.init_cmd import add_init_parser
    from pytest_logprob_drift.cli.prompts_cmd import add_prompts_parser
    from pytest_logprob_drift.cli.tiny_cmd import add_tiny_parser

    add_prompts_parser(sub)
    add_init_parser(sub)
    add_import_parser(sub)
    _add_seal_key_options(sub.choices["import"])
    add_tiny_parser(sub)
    return parser


SEAL_KEY_FLAGS = ("--seal-key-file", "--seal-key-env")


def _add_seal_key_options(command: argparse.ArgumentParser) -> None:
    keyed = command.add_mutually_exclusive_group()
    keyed.add_argument(
        SEAL_KEY_FLAGS[0],
        metavar="PATH",
        default=None,
        help="keyed seals: HMAC-SHA256 with the key in this file (run: seal new attempts with "
        "it and reuse only attempts sealed with it; verify: refuse any seal it did not make)",
    )
    keyed.add_argument(
        SEAL_KEY_FLAGS[1],
        metavar="NAME",
        default=None,
        help=f"like {SEAL_KEY_FLAGS[0]}, with the key in environment variable NAME",
    )


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """The parser ``main`` reads its arguments with, built once per process: an in-process
    caller (a test, an embedding) runs ``main`` hundreds of times, and building the parser of
    every command took 3-4 ms of each call. ``parse_args`` reads it and never changes it, and
    no default is a value a parse could change in place (``--expect`` appends to a copy)."""
    return build_parser()


def main(
    argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    args = _parser().parse_args(argv)
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
    except OSError as exc:  # a file-system failure the store did not name: still one line
        from pytest_logprob_drift.errors import StorageError

        where = exc.filename if exc.filename is not None else "the file system"
        error = StorageError(where, "complete the command", exc)
        print(f"logprob-drift: error: {error.render()}", file=err)
        return int(error.exit_code)
    except MemoryError as exc:  # an allocation failed: one line, never "a bug"
        detail = f" ({one_line(str(exc))})" if str(exc) else ""
        print(f"logprob-drift: error: out of memory{detail}", file=err)
        return ExitCode.RUNTIME_FAILURE
    except Exception as exc:  # a bug of ours: still one line, exit 3
        print(
            "logprob-drift: error: internal error (a bug; please report it): "
            f"{type(exc).__name__}: {one_line(str(exc))[:500]}",
            file=err,
        )
        return ExitCode.RUNTIME_FAILURE


def entry() -> int:
    """The process entry point (the ``logprob-drift`` script, ``python -m``): ``main()`` on
    ``sys.argv``; then, unless a native extension outside the standard library was loaded, the
    heap is left to the operating system.

    At exit CPython's last garbage collections walk and free, one by one, the objects of every
    module a command imported (about 120 for ``plan``): about 4 ms of its 50
    (``benchmarks/bench_plan.py``). ``gc.freeze()`` takes them out of those collections; the
    operating system reclaims the memory, ``atexit`` handlers still run and the standard
    streams are still flushed. Not after engine code: native extensions may check at exit that
    their objects were freed (triton's nanobind prints a leak report for each one that was
    not). ``plan`` loads none (it never imports torch: ``tests/test_hardening_startup.py``);
    ``run``, ``verify`` and ``report`` load torch and take seconds, not milliseconds.
    In-process callers (tests, embedding) use ``main``.
    """
    code = main()
    if not _native_extensions_loaded():
        gc.freeze()
    return code


def _native_extensions_loaded() -> bool:
    """Whether a compiled module from outside the standard library (torch, triton, ...) is
    loaded in this process."""
    stdlib = sys.stdlib_module_names
    return any(
        name.partition(".")[0] not in stdlib
        and str(getattr(module, "__file__", None) or "").endswith((".so", ".pyd"))
        for name, module in list(sys.modules.items())
    )


def _dispatch(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.command == "plan":
        from pytest_logprob_drift.cli.plan_cmd import plan_command

        return plan_command(args, out, err)
    if args.command == "run":
        from pytest_logprob_drift.cli.run_cmd import run_command

        return run_command(args, out, err)  # the seal key is one of its run settings
    if args.command == "verify":
        from pytest_logprob_drift.cli.verify_cmd import verify_command

        with _seal_key(args):
            return verify_command(args, out)
    if args.command == "report":
        from pytest_logprob_drift.cli.report_cmd import report_command

        return report_command(args, out)
    if args.command == "prompts":
        from pytest_logprob_drift.cli.prompts_cmd import prompts_command

        return prompts_command(args, out)
    if args.command == "init":
        from pytest_logprob_drift.cli.init_cmd import init_command

        return init_command(args, out)
    if args.command == "import":
        from pytest_logprob_drift.cli.import_cmd import import_command

        with _seal_key(args):
            return import_command(args, out, err)
    if args.command == "tiny":
        from pytest_logprob_drift.cli.tiny_cmd import tiny_command

        return tiny_command(args, out)
    raise UsageError(f"unhandled command {args.command}")


def _seal_key(args: argparse.Namespace) -> contextlib.AbstractContextManager[None]:
    """The seal key ``--seal-key-file``/``--seal-key-env`` name, active for the command."""
    from pytest_logprob_drift.store.keys import load_seal_key, sealing_with

    key = load_seal_key(file=args.seal_key_file, env=args.seal_key_env, flags=SEAL_KEY_FLAGS)
    return sealing_with(key)
