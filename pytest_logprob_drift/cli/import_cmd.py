"""The ``import`` command: judge what a production RL run already logged, by the contract.

Owns the command line of ``logprob-drift import --format nemo-rl|slime|jsonl PATH...
--artifacts DIR [--experiment-id ID] [--json] [--worst K --prompts-out FILE [--checkpoint
DIR]]`` (the K samples with the most drift written as a prompt file ``init --prompts``
accepts, ``production.worst``; refused before any work when FILE exists, its directory does
not, or DIR has no tokenizer files), the table of the steps once the run is
published (or ``--json``, the shape of ``run``'s; nothing is printed before, so a refusal is
the only line) and the exit code, as ``run``'s: 0 every step
PASS, 1 some step has another outcome, 2 bad input (one line naming the file and the line or
sample; nothing published), 3 a runtime failure. Exit 2 only when nothing was published: a
prompt file that cannot be written once the run is published (no sample to write, the file
appeared meanwhile, a full disk) is one line on stderr and the run's own code. Under
``--seal-key-file``/``--seal-key-env`` (made active by the CLI) every seal carries the keyed
MAC, so a keyed ``verify`` accepts the run. ``--follow LOGDIR [--settle S] [--idle S]
[--poll S] [--exit-on NAMES]`` follows a live run instead (``production.follow``): one line
per complete step and per first crossing, flushed as printed, exit 4 (``ExitCode.SIGNATURE``)
on an ``--exit-on`` crossing. The work is ``production.importer``'s,
imported when the command runs (it loads torch); this module's top is torch-free, so building
the parser costs ``plan`` nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pytest_logprob_drift.errors import DriftError, ExitCode, UsageError, one_line

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, TextIO

    from pytest_logprob_drift.production.importer import ImportedCase

CONTRACT_SOURCE = "ws1"
"""The contract an import is judged by (its ``current`` version), as a run's config names it."""

DESCRIPTION = """\
Judge the per-token logprobs an RL run already logged by the contract's one rule,
abs(training_logprob - rollout_logprob) > threshold, one case per training step, sealed as a
run that `verify` re-checks and `report` renders.

formats:
  nemo-rl  NeMo-RL GRPO's train_data_step<N>.jsonl (token_ids, token_loss_mask,
           sample_loss_mask, generation_logprobs = rollout, prev_logprobs = trainer,
           input_lengths); the step comes from the file name
  slime    slime's --save-debug-train-data / --dump-details train dumps: per rank
           (train_data/<rollout_id>_<rank>.pt, slime's releases and miles; the trainer's
           log_probs only with --get-mismatch-metrics) or format_version 2 (slime's main,
           train_data/<rollout_id>.pt); loaded with torch.load(weights_only=True) only;
           rollout dumps need full unpickling and are never read
  jsonl    the neutral format: one JSON object per sample with step, sample, token_ids,
           prompt_length and response-aligned rollout_logprobs, training_logprobs, mask
           (also .parquet with the 'parquet' extra); see docs/PRODUCTION_RUNS.md

PATH is a file or a directory (its files of the format, not recursively). Input files are at
most 2 GiB; pickles are refused, never unpickled. Exit codes: 0 every step PASS, 1 some step
has another outcome, 2 bad input (nothing published), 3 runtime failure.

--follow LOGDIR follows a live run's log directory: each step sealed as soon as its file is
complete (never a file still being written), one line per step and one per signature or gate
first crossed; stops on SIGINT/SIGTERM or after --idle SECONDS without a new step; exit 4 when
a signature or gate named by --exit-on (or 'any') is first crossed. Neutral JSONL is followed
as one file per step. See docs/PRODUCTION_RUNS.md.

--worst K --prompts-out FILE writes the K samples with the most drift (most mismatching
active tokens, then largest max |diff|, over the steps judged PASS or MISMATCH) as a prompt
file for `init --prompts FILE`: their prompts' token ids as logged, and a source record
naming the run, step and sample of each; --checkpoint DIR adds DIR's tokenizer digests, which
planning then checks."""


def add_import_parser(sub: Any) -> None:
    from pytest_logprob_drift.cli import RawDescriptionFormatter

    command = sub.add_parser(
        "import",
        help="judge the logprobs a production RL run logged (NeMo-RL, slime, neutral JSONL)",
        description=DESCRIPTION,
        formatter_class=RawDescriptionFormatter,
    )
    command.add_argument(
        "--format",
        required=True,
        choices=("nemo-rl", "slime", "jsonl"),
        dest="input_format",
        help="the input format (see formats above)",
    )
    command.add_argument("paths", nargs="+", metavar="PATH", help="input files or directories")
    command.add_argument(
        "--artifacts",
        default="runs",
        metavar="DIR",
        help="where the run is published: DIR/<experiment id>/ (default: runs)",
    )
    command.add_argument(
        "--experiment-id",
        default=None,
        metavar="ID",
        help="the run directory's name (default: import-<format>-<hash of the inputs>); an "
        "existing run is never written into",
    )
    command.add_argument("--json", action="store_true", help="print the final table as JSON")
    command.add_argument(
        "--worst",
        type=int,
        default=None,
        metavar="K",
        help="with --prompts-out: write the K samples with the most drift as a prompt file",
    )
    command.add_argument(
        "--prompts-out",
        default=None,
        metavar="FILE",
        help="the prompt file --worst writes (never overwritten)",
    )
    command.add_argument(
        "--follow",
        action="store_true",
        help="follow one live log directory (nemo-rl, slime): seal each step once its file is "
        "complete, one line per step and one per signature or gate first crossed",
    )
    command.add_argument(
        "--settle",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="with --follow: the newest NeMo-RL step (or the first per-rank slime step) is "
        "complete once its files have not changed for SECONDS (default 5)",
    )
    command.add_argument(
        "--idle",
        type=float,
        default=None,
        metavar="SECONDS",
        help="with --follow: stop after SECONDS without a new complete step (default: only "
        "on SIGINT/SIGTERM)",
    )
    command.add_argument(
        "--poll",
        type=float,
        default=0.25,
        metavar="SECONDS",
        help="with --follow: how often the directory is listed (default 0.25)",
    )
    command.add_argument(
        "--exit-on",
        default=None,
        metavar="NAMES",
        help="with --follow: exit 4 once one of these comma-separated signatures or gates "
        "(or 'any') is first crossed, the step that crossed it sealed",
    )
    command.add_argument(
        "--checkpoint",
        default=None,
        metavar="DIR",
        help="with --prompts-out: record DIR's tokenizer digests (planning checks them)",
    )


def _max_diff(case: ImportedCase) -> str:
    value = case.comparison.diagnostics.max_abs_diff
    return "-" if value is None else f"{value:.3e}"


def _case_json(case: ImportedCase, run_dir: Path) -> dict[str, Any]:
    from pytest_logprob_drift.diagnostics.registry import installed

    c = case.comparison
    return {
        "case_id": case.case_id,
        "label": case.label,
        "step": case.step,
        "samples": case.samples,
        "outcome": c.outcome.value,
        "reason": c.reason,
        "attempt_dir": str(run_dir / case.attempt),
        "active_tokens": c.active_tokens,
        "mismatches": c.mismatches,
        "max_abs_diff": c.diagnostics.max_abs_diff,
        **{
            key: part
            for diagnostic in installed()
            for key, part in diagnostic.json_parts(c.diagnostics).items()
        },
        **(
            {}
            if c.diagnostics.masked_by_run is None
            else {"masked_by_run": c.diagnostics.masked_by_run.to_json()}
        ),
    }


def import_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from pytest_logprob_drift.config.contract import resolve_contract
    from pytest_logprob_drift.diagnostics.registry import installed
    from pytest_logprob_drift.outcomes import Outcome
    from pytest_logprob_drift.production import worst as worst_samples
    from pytest_logprob_drift.production.importer import import_run
    from pytest_logprob_drift.tables import render_table

    contract = resolve_contract(CONTRACT_SOURCE, "current")
    if args.follow:
        return _follow_command(args, contract, out)
    for option in ("exit_on", "idle"):
        if getattr(args, option) is not None:
            raise UsageError(f"--{option.replace('_', '-')} goes with --follow")
    worst, tokenizer_files = _worst_options(args)
    result = import_run(
        args.input_format,
        args.paths,
        artifacts=Path(args.artifacts),
        contract=contract,
        experiment_id=args.experiment_id,
        worst=worst,
    )
    written: dict[str, Any] | None = None
    not_written: str | None = None
    if worst is not None:
        try:
            document = worst_samples.prompt_document(
                worst,
                experiment_id=result.experiment_id,
                fmt=result.format,
                inputs=result.inputs,
                threshold=contract.threshold,
                tokenizer_files=tokenizer_files,
            )
            worst_samples.write_prompt_file(Path(args.prompts_out), document)
            written = {"path": args.prompts_out, **document}
        except (DriftError, OSError) as exc:  # the run is published: say so, keep its code
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            not_written = f"{args.prompts_out} was not written ({why})"
    if args.json:
        json.dump(
            {
                "run_dir": str(result.run_dir),
                "experiment_id": result.experiment_id,
                "format": result.format,
                "inputs": [
                    {"path": r.path, "sha256": r.sha256, "size": r.size} for r in result.inputs
                ],
                "results": [_case_json(c, result.run_dir) for c in result.cases],
                **({} if written is None else {"prompts_out": written}),
            },
            out,
            indent=2,
            sort_keys=True,
        )
        out.write("\n")
    else:
        core = [d for d in installed() if d.always_in_table]
        rows = [
            [
                c.case_id,
                c.label,
                c.comparison.outcome.value,
                c.samples,
                c.comparison.active_tokens,
                c.comparison.mismatches,
                _max_diff(c),
                *(
                    cell
                    for diagnostic in core
                    for cell in diagnostic.table_cells(c.comparison.diagnostics)
                ),
            ]
            for c in result.cases
        ]
        headers = [
            "case_id",
            "label",
            "outcome",
            "samples",
            "active",
            "mismatches",
            "max|diff|",
            *(header for diagnostic in core for header in diagnostic.table_headers()),
        ]
        print(render_table(headers, rows), file=out)
        _print_masked_by_run(result.cases, out)
        print(
            one_line(
                f"imported {len(result.cases)} step(s) of {len(result.inputs)} file(s) into "
                f"{result.run_dir} (verify: logprob-drift verify {result.run_dir})"
            ),
            file=out,
        )
        if written is not None:
            _print_worst(written, args, out)
    for case in result.cases:
        if case.positive:
            print(
                f"logprob-drift: note: step {case.step}: {case.positive} active logprob(s) "
                "above 0 (a logprob is at most 0; judged as logged)",
                file=err,
            )
    if not_written is not None:
        print(
            one_line(f"logprob-drift: {not_written}; the run is published at {result.run_dir}"),
            file=err,
        )
    passed = all(c.outcome is Outcome.PASS for c in result.cases)
    return ExitCode.OK if passed else ExitCode.UNEXPECTED_OUTCOME


def _print_masked_by_run(cases: Sequence[ImportedCase], out: TextIO) -> None:
    """One line per step whose run masked samples itself (judged apart, not in the verdict)."""
    for c in cases:
        masked = c.comparison.diagnostics.masked_by_run
        if masked is None:
            continue
        worst = "-" if masked.max_abs_diff is None else f"{masked.max_abs_diff:.3e}"
        print(
            f"{c.label}: the run masked {masked.samples} sample(s) itself (for drift or another "
            f"reason): {masked.tokens} tokens, {masked.mismatches} over the threshold, max "
            f"|diff| {worst}"
            + (f", {masked.nonfinite_tokens} non-finite" if masked.nonfinite_tokens else "")
            + "; not in the verdict",
            file=out,
        )


def _worst_options(args: argparse.Namespace) -> tuple[Any, dict[str, str] | None]:
    """The worst-sample collector and the checkpoint's tokenizer digests (None, None without
    ``--worst``); every option refused before the import reads anything."""
    from pytest_logprob_drift.production.worst import WorstSamples, refuse_existing

    if (args.worst is None) != (args.prompts_out is None):
        raise UsageError("--worst K and --prompts-out FILE go together")
    if args.worst is None:
        if args.checkpoint is not None:
            raise UsageError("--checkpoint DIR goes with --worst K --prompts-out FILE")
        return None, None
    worst = WorstSamples(args.worst)
    refuse_existing(Path(args.prompts_out))
    digests = None
    if args.checkpoint is not None:
        from pytest_logprob_drift.config.input_file import InputFileError
        from pytest_logprob_drift.config.prompt_source import tokenizer_file_digests

        directory = Path(args.checkpoint)
        if not directory.is_dir():
            raise UsageError(f"--checkpoint {args.checkpoint}: not a directory")
        try:
            digests = tokenizer_file_digests(directory)
        except (OSError, InputFileError) as exc:
            raise UsageError(
                f"--checkpoint {args.checkpoint}: cannot hash its tokenizer files ({exc})"
            ) from None
        if not digests:
            raise UsageError(
                f"--checkpoint {args.checkpoint}: no tokenizer file (tokenizer.json, "
                "tokenizer_config.json, ...) in the directory"
            )
    return worst, digests


def _print_worst(written: dict[str, Any], args: argparse.Namespace, out: TextIO) -> None:
    prompts = written["source"]["prompts"]
    print(
        one_line(
            f"wrote the {len(prompts)} sample(s) with the most drift as prompts to "
            f"{written['path']}:"
        ),
        file=out,
    )
    for p in prompts:
        sample = "-" if p["sample"] is None else p["sample"]
        print(
            one_line(
                f"  step {p['step']} sample {sample} (row {p['row']}): {p['mismatches']}/"
                f"{p['active']} mismatching, max |diff| {p['max_abs_diff']:.3e}"
            ),
            file=out,
        )
    checkpoint = args.checkpoint if args.checkpoint is not None else "DIR"
    print(
        one_line(
            f"next: logprob-drift init --checkpoint {checkpoint} --prompts {written['path']} "
            "--runtime vllm-hf --output experiment.json (vLLM samples as in your run; "
            "--runtime hf runs transformers on both sides where vLLM is not installed)"
        ),
        file=out,
    )


def _follow_command(args: argparse.Namespace, contract: Any, out: TextIO) -> int:
    """``import --follow DIR``: one line per complete step and per first crossing, flushed
    as it happens (a sidecar reads them); exit 4 on an ``--exit-on`` crossing, else 0 every
    step PASS, 1 some step has another outcome."""
    from pytest_logprob_drift.outcomes import Outcome
    from pytest_logprob_drift.production.follow import FollowedStep, exit_on_names, follow

    if args.json or args.worst is not None or args.prompts_out is not None:
        raise UsageError(
            "--follow prints one line per step: not with --json, --worst or "
            "--prompts-out (import the run once it is done for those)"
        )
    if len(args.paths) != 1:
        raise UsageError("--follow takes one directory: the run's log directory")
    exit_on = exit_on_names(args.exit_on)

    def shown(step: FollowedStep) -> None:
        case, c = step.case, step.case.comparison
        what = "sealed" if step.sealed else "already sealed"
        print(
            one_line(
                f"step {case.step}: {c.outcome.value}, {case.samples} samples, "
                f"{c.mismatches}/{c.active_tokens} mismatching, max |diff| {_max_diff(case)} "
                f"({what}: {case.attempt})"
            ),
            file=out,
            flush=True,
        )
        for crossing in step.crossings:
            print(
                one_line(
                    f"step {crossing.step}: {crossing.kind} {crossing.name} first crossed "
                    f"({crossing.detail})"
                ),
                file=out,
                flush=True,
            )

    result = follow(
        args.input_format,
        Path(args.paths[0]),
        artifacts=Path(args.artifacts),
        contract=contract,
        experiment_id=args.experiment_id,
        settle=args.settle,
        idle=args.idle,
        poll=args.poll,
        exit_on=exit_on,
        on_step=shown,
        on_start=lambda run_dir: print(
            one_line(f"following {args.paths[0]} ({args.input_format}) into {run_dir}"),
            file=out,
            flush=True,
        ),
    )
    print(
        one_line(
            f"stopped ({result.stopped_by}) after {len(result.steps)} step(s); the run is at "
            f"{result.run_dir} (verify: logprob-drift verify {result.run_dir})"
        ),
        file=out,
        flush=True,
    )
    if result.stopped_by == "exit-on":
        return ExitCode.SIGNATURE
    passed = all(s.case.outcome is Outcome.PASS for s in result.steps)
    return ExitCode.OK if passed else ExitCode.UNEXPECTED_OUTCOME
