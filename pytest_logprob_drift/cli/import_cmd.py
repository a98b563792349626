"""The ``import`` command: judge what a production RL run already logged, by the contract.

Owns the command line of ``logprob-drift import --format nemo-rl|slime|jsonl PATH...
--artifacts DIR [--experiment-id ID] [--json]``, the table of the steps once the run is
published (or ``--json``, the shape of ``run``'s; nothing is printed before, so a refusal is
the only line) and the exit code, as ``run``'s: 0 every step
PASS, 1 some step has another outcome, 2 bad input (one line naming the file and the line or
sample; nothing published), 3 a runtime failure. The work is ``production.importer``'s,
imported when the command runs (it loads torch); this module's top is torch-free, so building
the parser costs ``plan`` nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pytest_logprob_drift.errors import ExitCode, one_line

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
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
  slime    slime's --save-debug-train-data / --dump-details train dumps
           (train_data/<rollout_id>.pt, loaded with torch.load(weights_only=True) only;
           rollout dumps need full unpickling and are never read)
  jsonl    the neutral format: one JSON object per sample with step, sample, token_ids,
           prompt_length and response-aligned rollout_logprobs, training_logprobs, mask
           (also .parquet with the 'parquet' extra); see docs/PRODUCTION_RUNS.md

PATH is a file or a directory (its files of the format, not recursively). Input files are at
most 2 GiB; pickles are refused, never unpickled. Exit codes: 0 every step PASS, 1 some step
has another outcome, 2 bad input (nothing published), 3 runtime failure."""


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


def _max_diff(case: ImportedCase) -> str:
    value = case.comparison.diagnostics.max_abs_diff
    return "-" if value is None else f"{value:.3e}"


def _case_json(case: ImportedCase, run_dir: Path) -> dict[str, Any]:
    c = case.comparison
    figures = c.diagnostics.importance_sampling
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
        **({} if figures is None else {"importance_sampling": figures.to_json()}),
    }


def import_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from pytest_logprob_drift.config.contract import resolve_contract
    from pytest_logprob_drift.numerics import importance_text
    from pytest_logprob_drift.outcomes import Outcome
    from pytest_logprob_drift.production.importer import import_run
    from pytest_logprob_drift.tables import render_table

    result = import_run(
        args.input_format,
        args.paths,
        artifacts=Path(args.artifacts),
        contract=resolve_contract(CONTRACT_SOURCE, "current"),
        experiment_id=args.experiment_id,
    )
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
            },
            out,
            indent=2,
            sort_keys=True,
        )
        out.write("\n")
    else:
        rows = [
            [
                c.case_id,
                c.label,
                c.comparison.outcome.value,
                c.samples,
                c.comparison.active_tokens,
                c.comparison.mismatches,
                _max_diff(c),
                importance_text.ess_cell(c.comparison.diagnostics),
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
            importance_text.ESS_HEADER,
        ]
        print(render_table(headers, rows), file=out)
        print(
            one_line(
                f"imported {len(result.cases)} step(s) of {len(result.inputs)} file(s) into "
                f"{result.run_dir} (verify: logprob-drift verify {result.run_dir})"
            ),
            file=out,
        )
    passed = all(c.outcome is Outcome.PASS for c in result.cases)
    return ExitCode.OK if passed else ExitCode.UNEXPECTED_OUTCOME
