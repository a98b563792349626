"""The ``run`` command: plan, execute every case, print progress, the table and exit code.

Owns reading the CLI's execution policy (``--runtime``, ``--allow-smoke-operators``,
``--expect``, ``--baseline-repeats``, ``--launcher`` and its Ray flags, the seal key, ``-v``)
into the run settings (``execute.settings``, validated with the CLI's spelling of each
setting, ``SETTINGS``), wiring a config file and those settings to the runner, where vLLM's
and transformers' own logs go (files under the run's ``engine-logs/``, or the terminal with
``-v``), live progress lines, the final table (or ``--json``) and the exit code. Rendering
only; the runner does the work and ``run_attribution`` attributes the finished run. Imports
torch through them, so this module is loaded only for ``run``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TextIO

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.attribution.document import document_json
from pytest_logprob_drift.attribution.materiality import within_contract
from pytest_logprob_drift.attribution.sealed import SealedAttribution
from pytest_logprob_drift.attribution.text import HEADERS as ATTRIBUTION_HEADERS
from pytest_logprob_drift.attribution.text import (
    LAYER_HEADERS,
    PATH_HEADERS,
    layer_rows,
    path_rows,
    summary_lines,
)
from pytest_logprob_drift.attribution.text import rows as attribution_rows
from pytest_logprob_drift.cli import FLAGS, SEAL_KEY_FLAGS
from pytest_logprob_drift.diagnostics.registry import installed
from pytest_logprob_drift.errors import DriftError, ExitCode, Remedy, UsageError, one_line
from pytest_logprob_drift.execute.runner import CaseResult, Runner
from pytest_logprob_drift.execute.runtime_catalog import RuntimeCatalog
from pytest_logprob_drift.execute.settings import RunSettings, Setting, Spelling, run_settings
from pytest_logprob_drift.plan.binding import ExecutionCase, ExecutionPlan
from pytest_logprob_drift.plan.expectations import describe_unmatched, unmatched_expectations
from pytest_logprob_drift.policy import assemble, render_error, render_issue
from pytest_logprob_drift.records import JsonObject, RuntimeInfo
from pytest_logprob_drift.registry.catalog import SemanticOperatorCatalog
from pytest_logprob_drift.run_attribution import seal_run_attribution
from pytest_logprob_drift.runtimes.transformers.logs import transformers_log_file
from pytest_logprob_drift.runtimes.vllm.logs import (
    engine_log_file,
    restore_engine_logs,
    route_engine_logs,
)
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.keys import sealing_with
from pytest_logprob_drift.tables import render_table


def _failure_text(exc: Exception) -> str:
    return (
        render_error(exc, FLAGS) if isinstance(exc, DriftError) else f"{type(exc).__name__}: {exc}"
    )


def _max_abs_diff(result: CaseResult) -> float | None:
    c = result.comparison
    return None if c is None else c.diagnostics.max_abs_diff


def _max_diff(result: CaseResult) -> str:
    value = _max_abs_diff(result)
    return "-" if value is None else f"{value:.3e}"


SETTINGS: Spelling = {
    Setting.RUNTIME: "--runtime",
    Setting.EXPECT: "--expect",
    Setting.BASELINE_REPEATS: "--baseline-repeats",
    Setting.LAUNCHER: "--launcher",
    Setting.RAY_ADDRESS: "--ray-address",
    Setting.RAY_NUM_CPUS: "--ray-num-cpus",
    Setting.RAY_RANK_CPUS: "--ray-rank-cpus",
    Setting.SERIAL: "--serial",
    Setting.SEAL_KEY_FILE: SEAL_KEY_FLAGS[0],
    Setting.SEAL_KEY_ENV: SEAL_KEY_FLAGS[1],
}
"""How ``run`` spells each run setting."""


def run_settings_of(args: argparse.Namespace, runtimes: list[str]) -> RunSettings:
    """``run``'s flags as the validated run settings (UsageError naming the flag)."""
    return run_settings(
        SETTINGS,
        runtime=args.runtime,
        runtimes=runtimes,
        artifacts=Path(args.artifacts),
        allow_test_only=args.allow_smoke_operators,
        expect=args.expect,
        baseline_repeats=args.baseline_repeats,
        launcher=args.launcher,
        ray_address=args.ray_address,
        ray_num_cpus=args.ray_num_cpus,
        ray_rank_cpus=args.ray_rank_cpus,
        serial=args.serial,
        show_engine_logs=args.engine_logs,
        seal_key_file=args.seal_key_file,
        seal_key_env=args.seal_key_env,
        replay=args.replay,
    )


def run_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    catalogs = assemble()
    settings = run_settings_of(args, list(catalogs.runtimes.names))
    with sealing_with(settings.seal_key):
        return _run(args, settings, catalogs.runtimes, catalogs.operators, out, err)


def _check_machine(plan: ExecutionPlan, runtime: RuntimeInfo, *, ray: bool) -> None:
    """Refuse the whole run (UsageError, one line) when this machine cannot run its cases on
    ``runtime``: the GPUs and the engine's CUDA build a cuda scenario needs, before any engine
    starts (``execute.machine_fit``)."""
    if plan.plan.scenario.device != "cuda":
        return
    from pytest_logprob_drift.runtimes.machine import run_refusal

    refusal = run_refusal(plan, runtime, ray=ray)
    if refusal is not None:
        raise UsageError(refusal)


def _run(
    args: argparse.Namespace,
    settings: RunSettings,
    runtimes: RuntimeCatalog,
    operators: SemanticOperatorCatalog,
    out: TextIO,
    err: TextIO,
) -> int:
    expectations = settings.expectations
    execution_plan = plan_file(
        args.config,
        pairwise=args.pairwise,
        catalog=operators,
        checkpoints=runtimes.checkpoints,
    )
    for issue in execution_plan.issues:
        if not (issue.remedy is Remedy.AUTHORIZE_TEST_OPERATORS and settings.allow_test_only):
            print(render_issue(issue, FLAGS), file=err)
    if execution_plan.has_errors:
        return ExitCode.USAGE_ERROR
    planned = execution_plan.plan.cases
    for unmatched in unmatched_expectations(expectations, planned):
        raise UsageError(describe_unmatched("--expect", unmatched, planned))
    if settings.runtime is not None:
        _check_machine(execution_plan, runtimes.get(settings.runtime), ray=settings.launch.is_ray)
    engine_logs = settings.artifacts / execution_plan.plan.experiment_id / layout.ENGINE_LOGS
    previous_logs = route_engine_logs(None if settings.show_engine_logs else engine_logs)
    with Runner.from_settings(
        execution_plan, settings, runtimes=runtimes, catalog=operators
    ) as runner:
        for note in runner.notes:
            print(one_line(f"note: {note}"), file=err)

        live = err if args.json else out  # with --json, stdout carries only the document

        def progress(
            index: int, total: int, ec: ExecutionCase, result: CaseResult | Exception | None
        ) -> None:
            prefix = f"[{index + 1}/{total}] {ec.case.case_id} {ec.case.label}"
            if result is None:
                print(one_line(f"{prefix} ..."), file=live, flush=True)
            elif isinstance(result, Exception):
                print(one_line(f"  case {ec.case.label} failed: {_failure_text(result)}"), file=err)
            else:
                how = "reused" if result.reused else "new"
                line = f"{prefix} -> {result.outcome.value} ({how}) {result.reason}"
                print(one_line(line), file=live, flush=True)
                for skipped in result.skipped_attempts:
                    print(one_line(f"    skipped attempt {skipped}"), file=live)

        crashed: list[tuple[ExecutionCase, Exception]] = []
        results = runner.run(progress=progress, failures=crashed)
        failures = [f"{ec.case.label}: {_failure_text(exc)}" for ec, exc in crashed]
        constructions = (runner.pool.rollout_constructions, runner.pool.training_constructions)
        run_dir = runner.store.directory
    restore_engine_logs(previous_logs)
    if (log := engine_log_file()) is not None and log.parent == engine_logs.resolve():
        print(one_line(f"vLLM logs: {log} (-v shows them here)"), file=err)
    if (log := transformers_log_file()) is not None and log.parent == engine_logs.resolve():
        print(one_line(f"transformers logs: {log} (-v shows them here)"), file=err)
    attribution = attribute_run(run_dir, execution_plan.plan.experiment_id, results, err)
    diagnostics = [None if r.comparison is None else r.comparison.diagnostics for r in results]
    core = [d for d in installed() if d.always_in_table]
    optional = [d for d in installed() if not d.always_in_table and d.shown(diagnostics)]
    rows = [
        [
            r.case_id,
            r.label,
            r.outcome.value,
            "-" if r.comparison is None else r.comparison.active_tokens,
            "-" if r.comparison is None else r.comparison.mismatches,
            _max_diff(r),
            *(cell for diagnostic in core for cell in diagnostic.table_cells(d)),
            "reused" if r.reused else ("new" if r.attempt_dir else "-"),
            "" if r.as_expected else f"expected {r.expected.value}",
            *(cell for diagnostic in optional for cell in diagnostic.table_cells(d)),
        ]
        for r, d in zip(results, diagnostics, strict=True)
    ]
    if args.json:
        json.dump(
            {
                "results": [_result_json(r) for r in results],
                "failures": failures,
                "engine_constructions": {"rollout": constructions[0], "training": constructions[1]},
                "attribution": (
                    None if attribution is None else document_json(attribution.document)
                ),
                "attribution_dir": None if attribution is None else str(attribution.directory),
            },
            out,
            indent=2,
            sort_keys=True,
        )
        out.write("\n")
    else:
        print(
            render_table(
                [
                    "case_id",
                    "label",
                    "outcome",
                    "active",
                    "mismatches",
                    "max|diff|",
                    *(header for diagnostic in core for header in diagnostic.table_headers()),
                    "attempt",
                    "note",
                    *(h for diagnostic in optional for h in diagnostic.table_headers()),
                ],
                rows,
            ),
            file=out,
        )
        for r, d in zip(results, diagnostics, strict=True):
            for line in (line for diagnostic in installed() for line in diagnostic.run_lines(d)):
                print(one_line(f"{r.label}: {line}"), file=out)
        print(
            f"engine constructions: rollout {constructions[0]}, training {constructions[1]}",
            file=out,
        )
        if attribution is not None:
            print_attribution(attribution, out, results)
    if failures:
        return ExitCode.RUNTIME_FAILURE
    return ExitCode.OK if all(r.as_expected for r in results) else ExitCode.UNEXPECTED_OUTCOME


def attribute_run(
    run_dir: Path, experiment_id: str, results: list[CaseResult], err: TextIO
) -> SealedAttribution | None:
    """The run's sealed attribution (``run_attribution``); None when the run has no comparable
    baseline, e.g. a plan-only scenario or a rejected baseline (incomparable attempts are said
    on ``err``)."""
    try:
        return seal_run_attribution(run_dir, experiment_id, results)
    except ValueError as exc:
        print(one_line(f"note: no attribution: {exc}"), file=err)
        return None


def _within_contract(results: list[CaseResult]) -> tuple[frozenset[str], float | None]:
    """Labels of the cases within the contract (``attribution.materiality``) and the
    threshold the rule used (the first sealed comparison's)."""
    judged = [(r, r.comparison) for r in results if r.comparison is not None]
    within = frozenset(
        r.label
        for r, c in judged
        if within_contract(r.outcome.value, c.diagnostics.max_abs_diff, float(c.threshold))
    )
    return within, (float(judged[0][1].threshold) if judged else None)


def print_attribution(
    attribution: SealedAttribution, out: TextIO, results: list[CaseResult]
) -> None:
    how = "reused" if attribution.reused else "sealed"
    print(one_line(f"drift attribution ({how}: {attribution.directory})"), file=out)
    ranked = attribution.document.ranked()
    print(render_table(list(ATTRIBUTION_HEADERS), attribution_rows(ranked)), file=out)
    if by_path := path_rows(ranked):
        print("where the drift entered (decode vs prefill, against the baseline):", file=out)
        print(render_table(list(PATH_HEADERS), by_path), file=out)
    if by_layer := layer_rows(ranked):
        print("where in the network each side moved (against the baseline):", file=out)
        print(render_table(list(LAYER_HEADERS), by_layer), file=out)
    within, threshold = _within_contract(results)
    for line in summary_lines(attribution.document, within, threshold):
        print(one_line(line), file=out)


def _result_json(r: CaseResult) -> JsonObject:
    c = r.comparison
    diagnostics = None if c is None else c.diagnostics
    return {
        "case_id": r.case_id,
        "label": r.label,
        "outcome": r.outcome.value,
        "expected": r.expected.value,
        "reused": r.reused,
        "reason": r.reason,
        "attempt_dir": None if r.attempt_dir is None else str(r.attempt_dir),
        "active_tokens": None if c is None else c.active_tokens,
        "mismatches": None if c is None else c.mismatches,
        "max_abs_diff": _max_abs_diff(r),
        **{
            key: part
            for diagnostic in installed()
            for key, part in diagnostic.json_parts(diagnostics).items()
        },
    }
