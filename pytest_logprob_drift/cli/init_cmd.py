"""The ``init`` command: a starter experiment for a checkpoint directory and a prompt file.

Owns wiring the command line to ``plan.starter`` with the named runtime's record from the
catalog the frontends assemble (its declared baseline knobs and standard interventions),
checking the document as ``plan`` would (loaded strictly, planned and operator-bound; an error
is one line and nothing is written) and writing it to a file that does not exist yet (an
existing file is never overwritten: exit 2). ``--seed`` and ``--max-new-tokens`` are bounded
where they are parsed by what a config may hold (``cli.options``). Prints where it wrote (the
path escaped, as every message shows input text) and how many cases it plans, then the run
command with the ``--expect`` selectors of what the starter is for (``expectations``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from pathlib import Path

from pytest_logprob_drift.cli.options import int_option
from pytest_logprob_drift.config.limits import MAX_JSON_INT, MAX_SEED
from pytest_logprob_drift.errors import ExitCode, UsageError, one_line

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, TextIO


def add_init_parser(sub: Any) -> None:
    from pytest_logprob_drift.cli import RUNTIME_NAMES, RawDescriptionFormatter

    init = sub.add_parser(
        "init",
        help="write a starter experiment for a checkpoint directory and a prompt file",
        description="Write a starter experiment: a baseline in the checkpoint's own dtype on "
        "both sides (prefix caching off, an eager rollout, one rollout rank, unsharded SDPA "
        "training, the native kernel, a batch of up to 4 prompts) and the standard "
        "one-at-a-time interventions the runtime executes, each with a description. The "
        "document is checked as `plan` would check it before it is written.",
        epilog="example:\n  logprob-drift init --checkpoint ./my-model --prompts prompts.json "
        "--runtime vllm-hf \\\n      --output experiment.json",
        formatter_class=RawDescriptionFormatter,
    )
    init.add_argument(
        "--checkpoint",
        required=True,
        metavar="DIR",
        help="a Hugging Face checkpoint directory (config.json, weights, tokenizer)",
    )
    init.add_argument(
        "--prompts", required=True, metavar="FILE", help="a prompt file (`prompts` writes one)"
    )
    init.add_argument(
        "--runtime",
        required=True,
        metavar="NAME",
        help=f"the runtime whose standard interventions to write: one of {RUNTIME_NAMES}",
    )
    init.add_argument(
        "--output", required=True, metavar="FILE", help="the experiment file, never overwritten"
    )
    init.add_argument(
        "--experiment-id",
        default=None,
        metavar="ID",
        help="the experiment id, which names the run directory (default: <checkpoint "
        "directory name>-<runtime>)",
    )
    init.add_argument(
        "--max-new-tokens",
        type=int_option(1, MAX_JSON_INT, high_text="2**64 - 1"),
        default=None,
        metavar="N",
        help="tokens sampled per prompt (default: 16)",
    )
    init.add_argument(
        "--seed",
        type=int_option(0, MAX_SEED),
        default=None,
        metavar="N",
        help="the sampling seed (default: 20261129)",
    )
    init.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="the scenario's device (default: cpu); a runtime that does not execute it plans "
        "every case PLAN_ONLY",
    )


def init_command(args: argparse.Namespace, out: TextIO) -> int:
    from pytest_logprob_drift.cli import FLAGS
    from pytest_logprob_drift.config.loader import parse_config
    from pytest_logprob_drift.plan.binding import build_execution_plan, intervention_json_paths
    from pytest_logprob_drift.plan.planner import plan_experiment
    from pytest_logprob_drift.plan.starter import (
        DEFAULT_MAX_NEW_TOKENS,
        DEFAULT_SEED,
        starter_experiment,
    )
    from pytest_logprob_drift.policy import assemble, render_issue
    from pytest_logprob_drift.records import IssueSeverity

    output = Path(args.output)
    if os.path.lexists(output):
        raise UsageError(f"{output}: already exists; init never overwrites a file")
    catalogs = assemble()
    runtime = catalogs.runtimes.get(args.runtime)
    if not runtime.interventions:
        raise UsageError(f"runtime {runtime.name!r} declares no standard interventions")
    document = starter_experiment(
        checkpoint_dir=Path(args.checkpoint),
        prompt_file=Path(args.prompts),
        output=output,
        runtime=runtime,
        experiment_id=args.experiment_id,
        max_new_tokens=(
            DEFAULT_MAX_NEW_TOKENS if args.max_new_tokens is None else args.max_new_tokens
        ),
        seed=DEFAULT_SEED if args.seed is None else args.seed,
        device=args.device,
    )
    config = parse_config(
        document,
        source=str(output),
        base_dir=output.parent,
        checkpoints=catalogs.runtimes.checkpoints,
    )
    plan = build_execution_plan(
        plan_experiment(config),
        catalogs.operators,
        intervention_paths=intervention_json_paths(config.interventions),
    ).plan
    errors = [i for i in plan.issues if i.severity is IssueSeverity.ERROR]
    if errors:
        raise UsageError(f"{output}: the starter does not plan: {render_issue(errors[0], FLAGS)}")
    _write_new(output, json.dumps(document, indent=2) + "\n")
    shown = one_line(str(output))
    print(f"wrote {shown}: {len(plan.cases)} case(s) on runtime {runtime.name}", file=out)
    if not runtime.executes(config.scenario):
        print(
            f"note: every case is plan-only: {one_line(runtime.plan_only_reason(config.scenario))}",
            file=out,
        )
    expect = "".join(f" --expect {shlex.quote(e)}" for e in expectations(document))
    print(f"next: logprob-drift run {shown} --runtime {runtime.name}{expect}", file=out)
    if expect:
        print(
            "  (--expect: the precision trials are expected to drift, so the run exits 0 "
            "when the rest stays within the contract; the attribution says which knob moved)",
            file=out,
        )
    return ExitCode.OK


PRECISION_PATHS = ("rollout.dtype", "training.compute_dtype")
"""The starter's knobs whose trials put a 16-bit format on one side."""


def expectations(document: Mapping[str, Any]) -> list[str]:
    """What the starter is for, as ``--expect`` selectors: with float32 on both sides of the
    baseline, each trial that puts another precision on one side is expected MISMATCH (bf16
    drift is 1e-3 to 1e-1 nats, over the contract) and every other case PASS; with a 16-bit
    baseline every case is (``*=MISMATCH``): the attribution, not the verdict, then tells the
    knobs apart."""
    baseline = document["baseline"]
    sides = (baseline["rollout"]["dtype"], baseline["training"]["compute_dtype"])
    if any(dtype != "float32" for dtype in sides):
        return ["*=MISMATCH"]
    return [
        f"{trial['path']}={value}=MISMATCH"
        for trial in document["interventions"]
        if trial["path"] in PRECISION_PATHS
        for value in trial["values"]
        if value != "float32"
    ]


def _write_new(output: Path, text: str) -> None:
    try:
        with output.open("x", encoding="utf-8") as f:
            f.write(text)
    except FileExistsError:
        raise UsageError(f"{output}: already exists; init never overwrites a file") from None
    except (FileNotFoundError, NotADirectoryError):
        raise UsageError(f"{output}: its directory does not exist") from None
