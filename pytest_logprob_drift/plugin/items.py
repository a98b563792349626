"""pytest collection nodes for experiment cases: config file -> experiment -> case items.

Owns turning one experiment config into collectors and items (deterministic, sorted by case
order so every xdist worker collects the same items), node ids that carry the experiment id and
the case label (``exp.json::s0-cpu-smoke::batch.size=1``), markers for scenario level and
changed knob, running an item through the shared runner (the same code path as the CLI: the
item's setup executes the case, so a runtime failure is an error item; its call judges the
verdict), and a failure text that shows the evidence instead of a traceback. Also what a
session refuses before anything is collected (two configs with one experiment id, a
``--drift-expect`` that selects no case) and the exit status of a config that cannot be planned
(a one-line collection error: 2, under xdist too). Planning binds operators against the
session's catalog (``plugin.session``), the one the runner executes with. Importing this module
never imports torch; the runner is imported when the first case executes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from msgspec import UNSET

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.attribution.document import Case as AttributedCase
from pytest_logprob_drift.attribution.document import document_json
from pytest_logprob_drift.attribution.text import layer_properties
from pytest_logprob_drift.diagnostics.registry import installed
from pytest_logprob_drift.errors import DriftError, one_line
from pytest_logprob_drift.execute.protocol import bind_case, order_for_reuse
from pytest_logprob_drift.outcomes import Outcome, expected_outcome
from pytest_logprob_drift.plan.binding import ExecutionCase, ExecutionPlan
from pytest_logprob_drift.plugin.options import FLAGS, keyword_token, marker_name
from pytest_logprob_drift.plugin.reporting import diagnostic_properties
from pytest_logprob_drift.plugin.session import drift_session
from pytest_logprob_drift.policy import render_error

if TYPE_CHECKING:
    from pytest_logprob_drift.execute.runner import CaseResult, Runner


class DriftCaseFailure(Exception):
    """A case ended with an outcome other than the expected one."""

    def __init__(self, result: CaseResult) -> None:
        self.result = result
        super().__init__(f"{result.outcome.value}: {result.reason}")


class DriftConfigFile(pytest.File):
    """A ``--drift-config`` file; its child is the experiment."""

    def collect(self) -> Iterator[pytest.Collector]:
        session = drift_session(self.config)
        execution_plan = plan_file(
            str(self.path),
            pairwise=session.options.pairwise,
            catalog=session.catalog,
            checkpoints=session.runtimes.checkpoints,
        )
        errors = [i for i in execution_plan.issues if i.severity.value == "error"]
        if errors:
            raise DriftCollectionError(
                one_line("; ".join(f"{self.path}: {i.render()}" for i in errors))
            )
        yield DriftExperiment.from_parent(
            self, name=execution_plan.plan.experiment_id, execution_plan=execution_plan
        )

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, (DriftError, DriftCollectionError)):
            text = (
                render_error(excinfo.value, FLAGS)
                if isinstance(excinfo.value, DriftError)
                else str(excinfo.value)
            )
            return one_line(f"{self.path}: {text}" if str(self.path) not in text else text)
        return super().repr_failure(excinfo)


class DriftCollectionError(Exception):
    pass


class DriftCollectionErrors:
    """Makes a drift config that cannot be planned end the session with pytest's collection
    error status (2) under xdist too, where the controller only sees the workers' reports and
    would exit 1."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.failed = False

    def _is_drift_config(self, nodeid: str) -> bool:
        configs = drift_session(self.config).options.configs
        return (self.config.rootpath / nodeid.split("::", 1)[0]).resolve() in configs

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed and self._is_drift_config(report.nodeid):
            self.failed = True

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.failed and session.exitstatus == pytest.ExitCode.TESTS_FAILED:
            session.exitstatus = pytest.ExitCode.INTERRUPTED


def check_configs(config: pytest.Config) -> None:
    """Refuse, before anything is collected or executed, what would make a session silently
    wrong: two configs with one ``experiment_id`` (they would share ``runs/<experiment_id>/``)
    and a ``--drift-expect`` selector that matches no planned case. Case ids and labels come
    from the planner alone (no operator catalog, so no conftest is needed yet); configs that do
    not plan are left to collection, which reports them."""
    from pytest_logprob_drift.config.loader import load_config
    from pytest_logprob_drift.plan.expectations import describe_unmatched, unmatched_expectations
    from pytest_logprob_drift.plan.planner import plan_experiment
    from pytest_logprob_drift.records import Case

    session = drift_session(config)
    options = session.options
    owners: dict[str, Path] = {}
    cases: list[Case] = []
    complete = True
    for path in options.configs:
        try:
            plan = plan_experiment(
                load_config(path, checkpoints=session.runtimes.checkpoints),
                pairwise=options.pairwise,
            )
        except DriftError:
            complete = False
            continue
        complete = complete and not any(i.severity.value == "error" for i in plan.issues)
        other = owners.setdefault(plan.experiment_id, path)
        if other != path:
            raise pytest.UsageError(
                one_line(
                    f"--drift-config {path}: experiment_id {plan.experiment_id!r} is also the "
                    f"experiment_id of {other}; both would write runs/{plan.experiment_id}/: "
                    "give each config its own experiment_id"
                )
            )
        cases.extend(plan.cases)
    if complete and options.configs:
        for expectation in unmatched_expectations(options.run.expectations, cases):
            raise pytest.UsageError(
                one_line(describe_unmatched("--drift-expect", expectation, cases))
            )


class DriftExperiment(pytest.Collector):
    def __init__(self, *, execution_plan: ExecutionPlan, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.execution_plan = execution_plan

    def collect(self) -> Iterator[pytest.Item]:
        plan = self.execution_plan.plan
        kind = drift_session(self.config).options.run.runtime or "plan"
        bindings = {
            ec.case.case_id: bind_case(
                ec, runtime_kind=kind, identity=plan.identity, device=plan.scenario.device
            )
            for ec in self.execution_plan.cases
        }
        ordered = order_for_reuse(
            list(self.execution_plan.cases), lambda ec: bindings[ec.case.case_id]
        )
        for ec in ordered:
            item = DriftCaseItem.from_parent(self, name=ec.case.label, case=ec)
            item.extra_keyword_matches.add(keyword_token(ec.case.label))
            binding = bindings[ec.case.case_id]
            item.add_marker("drift")
            item.add_marker(f"drift_{plan.scenario.level.value}")
            item.add_marker("drift_baseline" if not ec.case.changed else "drift_intervention")
            for path in ec.case.changed:
                item.add_marker(f"drift_knob_{marker_name(path)}")
            item.add_marker(pytest.mark.xdist_group(name=f"drift-{binding.process_fingerprint}"))
            item.user_properties.append(("drift_case_id", ec.case.case_id))
            yield item


class DriftCaseItem(pytest.Item):
    def __init__(self, *, case: ExecutionCase, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.result: CaseResult | None = None

    @property
    def execution_plan(self) -> ExecutionPlan:
        parent = self.parent
        assert isinstance(parent, DriftExperiment)
        return parent.execution_plan

    def _executes(self) -> bool:
        """Whether this session executes the case (not ``--drift-plan-only``, and the runtime
        executes its scenario)."""
        session = drift_session(self.config)
        if session.options.plan_only:
            return False
        assert session.options.run.runtime is not None
        info = session.runtimes.get(session.options.run.runtime)
        return info.executes(self.execution_plan.plan.scenario)

    def setup(self) -> None:
        """Execute the case (or reuse its sealed attempt). A runtime that fails here makes the
        item an error, not a failure: the case produced no verdict to judge."""
        if not self._executes():
            return
        key = str(self.path)
        session = drift_session(self.config)
        runner: Runner = session.runner_for(key, self.execution_plan)
        try:
            result = runner.run_case(self.case)
            session.record_result(key, result)
            attribution = session.case_attribution(key, self.execution_plan, runner, result)
        finally:
            runner.release_engines_except(remaining_cases(self))
        self.result = result
        self._record(result.outcome.value, result)
        if attribution is not None:
            self._record_attribution(attribution)

    def runtest(self) -> None:
        """Judge the executed case against its expected outcome (PLAN_ONLY: skipped, with the
        reason, unless expected)."""
        session = drift_session(self.config)
        options = session.options
        case = self.case.case
        if options.plan_only:
            raise pytest.skip.Exception(
                f"--drift-plan-only: case {case.case_id} planned, not executed",
                _use_item_location=True,
            )
        if not self._executes():
            assert options.run.runtime is not None
            info = session.runtimes.get(options.run.runtime)
            expected = expected_outcome(options.run.expectations, case.case_id, case.label)
            self._record(Outcome.PLAN_ONLY.value, None)
            if expected is not Outcome.PLAN_ONLY:
                scenario = self.execution_plan.plan.scenario
                raise pytest.skip.Exception(
                    f"PLAN_ONLY: {info.plan_only_reason(scenario)}", _use_item_location=True
                )
            return
        if self.result is not None and not self.result.as_expected:
            raise DriftCaseFailure(self.result)

    def _record_attribution(self, entry: AttributedCase) -> None:
        """Junit properties, and a JSON-safe summary that travels with the report."""
        ratio = entry.effect.mean_ratio
        self.user_properties.extend(
            [
                ("drift_attribution", entry.classification),
                ("drift_rollout_max_abs_delta", str(entry.rollout.max_abs_delta)),
                ("drift_training_max_abs_delta", str(entry.training.max_abs_delta)),
                ("drift_earliest_divergence", str(entry.earliest_divergence)),
                ("drift_effect_mean_ratio", str(ratio.value)),
                ("drift_effect_mean_ratio_interval", f"[{ratio.low}, {ratio.high}]"),
                ("drift_attribution_entry", json.dumps(document_json(entry), sort_keys=True)),
            ]
        )
        if entry.path is not UNSET:  # opt-in diagnostics.replay
            self.user_properties.append(("drift_path_attribution", entry.path.classification))
        self.user_properties.extend(layer_properties(entry))

    def _record(self, outcome: str, result: CaseResult | None) -> None:
        self.user_properties.append(("drift_outcome", outcome))
        if result is None:
            return
        c = result.comparison
        self.user_properties.extend(
            [
                ("drift_expected", result.expected.value),
                ("drift_reused", str(result.reused)),
                ("drift_active_tokens", str(None if c is None else c.active_tokens)),
                ("drift_mismatches", str(None if c is None else c.mismatches)),
                ("drift_max_abs_diff", str(None if c is None else c.diagnostics.max_abs_diff)),
                ("drift_threshold", str(None if c is None else c.threshold)),
                ("drift_attempt", str(result.attempt_dir)),
                *diagnostic_properties(None if c is None else c.diagnostics),
            ]
        )

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, DriftCaseFailure):
            return render_evidence(excinfo.value.result)
        if isinstance(excinfo.value, DriftError):
            return f"{self.case.case.label}: {render_error(excinfo.value, FLAGS)}"
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int, str]:
        return (
            self.path,
            0,
            f"{self.parent.name if self.parent else ''}::{self.name} [{self.case.case.case_id}]",
        )


def remaining_cases(item: DriftCaseItem) -> list[ExecutionCase]:
    """Cases of the same experiment that come after ``item`` in this session."""
    items = item.session.items
    try:
        index = items.index(item)
    except ValueError:
        return []
    return [
        other.case
        for other in items[index + 1 :]
        if isinstance(other, DriftCaseItem) and other.parent is item.parent
    ]


def render_evidence(result: CaseResult) -> str:
    c = result.comparison
    lines = [
        f"{result.outcome.value} (expected {result.expected.value}): {result.reason}",
        f"case {result.case_id} {result.label}",
    ]
    if c is None:
        lines.append("threshold None (contract None); active tokens None, mismatches None")
    else:
        lines.append(
            f"threshold {c.threshold} (contract {c.contract.version}); active tokens "
            f"{c.active_tokens}, mismatches {c.mismatches}"
        )
        if c.worst_tokens:
            lines.append(
                "worst tokens:  sample  position  rollout_logprob  training_logprob  |diff|"
            )
            for w in c.worst_tokens:
                lines.append(
                    f"               {w.sample:>6}  {w.position:>8}  "
                    f"{w.rollout_logprob:>15.6f}  {w.training_logprob:>16.6f}  "
                    f"{w.abs_diff:.3e}"
                )
        for diagnostic in installed():
            lines.extend(diagnostic.failure_lines(c.diagnostics))
        for violation in c.identity_violations:
            lines.append(f"identity: {violation}")
        if c.records:
            lines.append(
                "knobs: "
                + "; ".join(
                    f"{r.knob} requested={r.requested!r} actual={r.actual!r} {r.status.value}"
                    for r in c.records
                )
            )
    how = "reused sealed attempt" if result.reused else "new attempt"
    lines.append(f"artifacts ({how}): {result.attempt_dir}")
    return "\n".join(lines)
