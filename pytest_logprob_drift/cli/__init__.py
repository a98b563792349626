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


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter with the terminal width taken from ``os`` (argparse asks
    ``shutil``, whose import with its compression modules cost ``plan`` more than planning)."""

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


class RawDescriptionFormatter(_Formatter, argparse.RawDescriptionHelpFormatter):
    """The CLI's formatter, keeping a command's description as written (its lines, lists)."""


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

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

    verify = sub.add_parser("verify", help="re-check seals and recompute every verdict")
    verify.add_argument("run_dir")
    verify.add_argument("--json", action="store_true")
    for command in (run, verify):
        _add_seal_key_options(command)

    report = sub.add_parser("report", help="human report of a run directory (terminal + HTML)")
    report.add_argument("run_dir")
    report.add_argument(
        "--html",
        default=None,
        help="HTML output path, never overwritten "
        "(default: RUN_DIR/report-<newest attempt id>.html)",
    )
    report.add_argument("--json", action="store_true", help="print the report's rows as JSON")

    from pytest_logprob_drift.cli.import_cmd import add_import_parser
    from pytest_logprob_drift.cli.init_cmd import add_init_parser
    from pytest_logprob_drift.cli.prompts_cmd import add_prompts_parser

    add_prompts_parser(sub)
    add_init_parser(sub)
    add_import_parser(sub)
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
    except OSError as exc:  # a file-system failure the store did not name: still one line
        from pytest_logprob_drift.errors import StorageError

        where = exc.filename if exc.filename is not None else "the file system"
        error = StorageError(where, "complete the command", exc)
        print(f"logprob-drift: error: {error.render()}", file=err)
        return int(error.exit_code)
    except MemoryError:
        print("logprob-drift: error: out of memory", file=err)
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

        return import_command(args, out, err)
    raise UsageError(f"unhandled command {args.command}")


def _seal_key(args: argparse.Namespace) -> contextlib.AbstractContextManager[None]:
    """The seal key ``--seal-key-file``/``--seal-key-env`` name, active for the command."""
    from pytest_logprob_drift.store.keys import load_seal_key, sealing_with

    key = load_seal_key(file=args.seal_key_file, env=args.seal_key_env, flags=SEAL_KEY_FLAGS)
    return sealing_with(key)
