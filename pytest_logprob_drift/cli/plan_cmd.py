"""The ``plan`` command: print the planned, operator-bound cases of a config.

Owns rendering a plan for people (a table with each case's changed knob, lifecycle, bound
backends and which runtimes execute it, then every planning issue) and as ``--json``, and the
exit code (2 when the plan has errors, naming the first). Creates no engine and writes nothing.
Knows nothing about torch or execution.
"""

from __future__ import annotations

import argparse
import json

from pytest_logprob_drift.cli import FLAGS
from pytest_logprob_drift.errors import ExitCode, one_line
from pytest_logprob_drift.policy import assemble, render_issue
from pytest_logprob_drift.records import IssueSeverity, canonical
from pytest_logprob_drift.tables import render_table

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Any, TextIO


def plan_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from pytest_logprob_drift import plan_file

    catalogs = assemble()
    execution_plan = plan_file(
        args.config,
        pairwise=args.pairwise,
        catalog=catalogs.operators,
        checkpoints=catalogs.runtimes.checkpoints,
    )
    plan = execution_plan.plan
    rows = execution_plan.rows(catalogs.runtimes.runtimes)
    refusals = execution_plan.refusals(catalogs.runtimes.runtimes)
    if args.json:
        json.dump(
            {
                "experiment_id": plan.experiment_id,
                "scenario_id": plan.scenario_id,
                "scenario": canonical(plan.scenario),
                "contract": canonical(plan.contract),
                "strategy": plan.strategy.value,
                "cases": rows,
                "issues": [canonical(i) for i in execution_plan.issues],
                "runtime_refusals": refusals,
            },
            out,
            indent=2,
            sort_keys=True,
        )
        out.write("\n")
    else:
        print(
            f"experiment {one_line(plan.experiment_id)}  scenario {one_line(plan.scenario_id)} "
            f"({plan.scenario.level.value}, {plan.scenario.device})  contract "
            f"{plan.contract.source}/{plan.contract.version} threshold "
            f"{plan.contract.threshold:g} {plan.contract.unit}",
            file=out,
        )
        print(
            render_table(
                ["case_id", "label", "changed", "lifecycle", "selected_logprob r/t", "execution"],
                [
                    [
                        r["case_id"],
                        r["label"],
                        ",".join(r["changed"]) or "-",
                        r["lifecycle"] or "-",
                        _bindings(r),
                        ("executable: " + ",".join(r["executable_by"]))
                        if r["executable_by"]
                        else "plan-only",
                    ]
                    for r in rows
                ],
            ),
            file=out,
        )
        print(f"{len(rows)} case(s)", file=out)
        for refusal in refusals:
            print(
                f"note: not executable by {refusal['runtime']} "
                f"({', '.join(refusal['labels'])}): {one_line(refusal['reason'])}",
                file=out,
            )
        for issue in execution_plan.issues:
            print(render_issue(issue, FLAGS), file=out)
    if execution_plan.has_errors:
        errors = [i for i in execution_plan.issues if i.severity is IssueSeverity.ERROR]
        print(
            f"logprob-drift: error: {one_line(args.config)}: {errors[0].render()}"
            + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""),
            file=err,
        )
        return ExitCode.USAGE_ERROR
    return ExitCode.OK


def _bindings(row: dict[str, Any]) -> str:
    by_target = {b["target"]: b["backend"] for b in row["operators"]}
    rollout, training = by_target.get("rollout", "?"), by_target.get("training", "?")
    return rollout if rollout == training else f"{rollout} / {training}"
