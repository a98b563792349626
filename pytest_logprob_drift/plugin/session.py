"""The state of a drift pytest session, as one plugin object registered at configure.

Owns ``DriftSession`` (the pattern of pytest's cacheprovider ``LFPlugin``: registered under
``PLUGIN_NAME`` in ``pytest_configure``, its session hooks are its methods): the validated
options, the seal key and engine-log routing in effect for the session (put back at
unconfigure), the session's operator catalog (built-ins, entry points, the
``pytest_logprob_drift_operators`` hook and the smoke group, assembled by ``policy``; used for
planning and execution alike) and runtime catalog, one runner per experiment file (engines
pooled by fingerprint; created when the first case executes), the results of the cases this
process executed, each case's attribution against its baseline, and at session end sealing
each experiment's attribution and closing the runners while adding up their engine
constructions. Nothing that imports torch is imported unless a case executed. Knows nothing
about collection or reporting.
"""

from __future__ import annotations

import contextvars
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from pytest_logprob_drift.attribution.document import Case, read_case_bytes
from pytest_logprob_drift.errors import UsageError
from pytest_logprob_drift.execute.runtime_catalog import RuntimeCatalog
from pytest_logprob_drift.plugin.options import DriftOptions
from pytest_logprob_drift.policy import operator_catalog
from pytest_logprob_drift.records import CaseKind, JsonObject
from pytest_logprob_drift.registry.catalog import SemanticOperatorCatalog, as_descriptor
from pytest_logprob_drift.runtimes.vllm.logs import (
    EngineLogPolicy,
    restore_engine_logs,
    route_engine_logs,
)
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.files import json_bytes
from pytest_logprob_drift.store.keys import SealKey, activate, deactivate

if TYPE_CHECKING:
    from pytest_logprob_drift.execute.runner import CaseResult, Runner
    from pytest_logprob_drift.plan.binding import ExecutionPlan

PLUGIN_NAME = "logprob-drift-session"


class DriftSession:
    """One drift pytest session's state; its hooks close the session."""

    def __init__(self, config: pytest.Config, options: DriftOptions, runtimes: RuntimeCatalog):
        self.config = config
        self.options = options
        self.runtimes = runtimes
        self.runners: dict[str, Runner] = {}
        """Per experiment file: its runner (created when its first case executes)."""
        self.results: dict[str, list[CaseResult]] = {}
        """Per experiment file: the results of the cases this process executed."""
        self.constructions: Counter[str] = Counter()
        """Engine constructions of the runners closed so far: ``rollout`` and ``training``
        (on the xdist controller: what the workers reported)."""
        self.sealed: list[str] = []
        """The attribution directories sealed at the end of this session."""
        self._catalog: SemanticOperatorCatalog | None = None
        self._seal_key: contextvars.Token[SealKey | None] = activate(options.run.seal_key)
        self._engine_logs: EngineLogPolicy | None = None
        self._routed = options.run.runtime is not None
        if self._routed:  # vLLM's own logs: a file under the artifacts by default
            self._engine_logs = route_engine_logs(
                None if options.run.show_engine_logs else options.run.artifacts / layout.ENGINE_LOGS
            )

    @property
    def catalog(self) -> SemanticOperatorCatalog:
        """The operator catalog of this session (computed once; ConfigError on a bad
        descriptor)."""
        if self._catalog is None:
            extra = [
                as_descriptor(item)
                for results in self.config.hook.pytest_logprob_drift_operators(config=self.config)
                for item in results
            ]
            self._catalog = operator_catalog(extra, extra_source="pytest_logprob_drift_operators")
        return self._catalog

    def runner_for(self, key: str, execution_plan: ExecutionPlan) -> Runner:
        """The session-scoped runner of one experiment file (created on first use)."""
        from pytest_logprob_drift.execute.runner import Runner

        if key not in self.runners:
            if execution_plan.plan.scenario.device == "cuda":
                from pytest_logprob_drift.runtimes.machine import run_refusal

                assert self.options.run.runtime is not None
                refusal = run_refusal(
                    execution_plan,
                    self.runtimes.get(self.options.run.runtime),
                    ray=self.options.run.launch.is_ray,
                )
                if refusal is not None:  # every case of the file errors with it
                    raise UsageError(refusal)
            self.runners[key] = Runner.from_settings(
                execution_plan, self.options.run, runtimes=self.runtimes, catalog=self.catalog
            )
        return self.runners[key]

    def record_result(self, key: str, result: CaseResult) -> None:
        results = self.results.setdefault(key, [])
        if all(r.case_id != result.case_id for r in results):
            results.append(result)

    def baseline_result(
        self, key: str, execution_plan: ExecutionPlan, runner: Runner
    ) -> CaseResult | None:
        """The experiment's baseline result: executed earlier in this session, or now (a
        sealed attempt is reused when there is one) so that every case can be attributed."""
        for result in self.results.get(key, []):
            if result.kind is CaseKind.BASELINE:
                return result
        baseline = next(
            (ec for ec in execution_plan.cases if ec.case.kind is CaseKind.BASELINE), None
        )
        if baseline is None:
            return None
        result = runner.run_case(baseline)
        self.record_result(key, result)
        return result

    def case_attribution(
        self, key: str, execution_plan: ExecutionPlan, runner: Runner, result: CaseResult
    ) -> Case | None:
        """This case against the baseline (one entry of the attribution document, decoded
        from the bytes the store would seal), or None when there is nothing comparable."""
        from pytest_logprob_drift.attribution.sealed import attribute_attempts

        if result.attempt_dir is None or result.kind is CaseKind.BASELINE:
            return None
        baseline = self.baseline_result(key, execution_plan, runner)
        if baseline is None or baseline.attempt_dir is None:
            return None
        try:
            document = attribute_attempts(
                execution_plan.plan.experiment_id,
                baseline.attempt_dir,
                baseline.repeat_dirs,
                [result.attempt_dir],
            )
        except ValueError:
            return None
        cases: list[JsonObject] = document["cases"]
        return read_case_bytes(json_bytes(cases[0])) if cases else None

    def seal_attributions(self) -> None:
        """Seal the attribution of every experiment this process executed cases of (nothing
        is imported when none executed: an installed plugin costs a session without drift
        cases nothing)."""
        executed = {
            key: results
            for key, results in self.results.items()
            if key in self.runners and any(r.attempt_dir is not None for r in results)
        }
        if not executed:
            return
        from pytest_logprob_drift.run_attribution import seal_run_attribution

        for key, results in executed.items():
            runner = self.runners[key]
            try:
                done = seal_run_attribution(
                    runner.store.directory, runner.plan.plan.experiment_id, results
                )
            except (ValueError, OSError):
                continue
            if done is not None:
                self.sealed.append(str(done.directory))

    def close_runners(self) -> Counter[str]:
        """Close every runner; the session's engine constructions so far."""
        while self.runners:
            _, runner = self.runners.popitem()
            runner.close()
            self.constructions["rollout"] += runner.pool.rollout_constructions
            self.constructions["training"] += runner.pool.training_constructions
        return self.constructions

    @pytest.hookimpl(tryfirst=True)  # before the --drift-report page reads what was sealed
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.seal_attributions()
        counts = self.close_runners()
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None and counts:
            from pytest_logprob_drift.plugin.xdist import WORKEROUTPUT_CONSTRUCTIONS

            workeroutput[WORKEROUTPUT_CONSTRUCTIONS] = dict(counts)

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        deactivate(self._seal_key)
        if self._routed:  # process-wide: never outlive this session
            restore_engine_logs(self._engine_logs)


def drift_session(config: pytest.Config) -> DriftSession:
    """The session object ``pytest_configure`` registered."""
    session = config.pluginmanager.get_plugin(PLUGIN_NAME)
    assert isinstance(session, DriftSession)
    return session
