"""Session-scoped state of a drift pytest session: catalogs, runners, construction counts.

Owns the ``StashKey`` s under which the plugin keeps its state, the session's operator
catalog (built-ins, entry points, the ``pytest_logprob_drift_operators`` hook and the smoke
group, assembled by ``policy``; used for planning and execution alike) and runtime catalog,
one runner per experiment file (engines pooled by fingerprint; created when the first case
executes), and closing the runners at session end while adding up their engine
constructions. Knows nothing about collection or reporting.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

from pytest_logprob_drift.execute.runtime_catalog import RuntimeCatalog
from pytest_logprob_drift.plugin.options import DriftOptions
from pytest_logprob_drift.policy import operator_catalog
from pytest_logprob_drift.registry.catalog import SemanticOperatorCatalog, as_descriptor

if TYPE_CHECKING:
    from pytest_logprob_drift.execute.runner import CaseResult, Runner
    from pytest_logprob_drift.plan.binding import ExecutionPlan

OPTIONS_KEY = pytest.StashKey[DriftOptions]()
RUNTIMES_KEY = pytest.StashKey[RuntimeCatalog]()
RUNNERS_KEY = pytest.StashKey[dict[str, "Runner"]]()
CATALOG_KEY = pytest.StashKey[SemanticOperatorCatalog]()
CONSTRUCTIONS_KEY = pytest.StashKey[Counter[str]]()
"""Engine constructions of the runners closed so far: ``rollout`` and ``training``."""
RESULTS_KEY = pytest.StashKey[dict[str, list["CaseResult"]]]()
"""Per experiment file: the results of the cases this process executed, baseline first."""
SEALED_KEY = pytest.StashKey[list[str]]()
"""The attribution directories sealed at the end of this session."""


def session_catalog(config: pytest.Config) -> SemanticOperatorCatalog:
    """The operator catalog of this session (computed once; ConfigError on a bad descriptor)."""
    if CATALOG_KEY not in config.stash:
        extra = [
            as_descriptor(item)
            for results in config.hook.pytest_logprob_drift_operators(config=config)
            for item in results
        ]
        config.stash[CATALOG_KEY] = operator_catalog(
            extra, extra_source="pytest_logprob_drift_operators"
        )
    return config.stash[CATALOG_KEY]


def runner_for(config: pytest.Config, key: str, execution_plan: ExecutionPlan) -> Runner:
    """The session-scoped runner of one experiment file (created on first use)."""
    from pytest_logprob_drift.execute.launch import Launch
    from pytest_logprob_drift.execute.runner import Runner

    runners = config.stash[RUNNERS_KEY]
    if key not in runners:
        options = config.stash[OPTIONS_KEY]
        assert options.runtime is not None
        runners[key] = Runner(
            execution_plan,
            runtime=options.runtime,
            runtimes=config.stash[RUNTIMES_KEY],
            catalog=session_catalog(config),
            artifacts=options.artifacts,
            allow_test_only=options.allow_smoke,
            expectations=options.expectations,
            baseline_repeats=options.baseline_repeats,
            # Items run one at a time in pytest; engine groups never overlap here.
            launch=Launch(
                launcher=options.launcher, ray_address=options.ray_address, concurrent=False
            ),
        )
    return runners[key]


def record_result(config: pytest.Config, key: str, result: CaseResult) -> None:
    results = config.stash[RESULTS_KEY].setdefault(key, [])
    if all(r.case_id != result.case_id for r in results):
        results.append(result)


def baseline_result(
    config: pytest.Config, key: str, execution_plan: ExecutionPlan, runner: Runner
) -> CaseResult | None:
    """The experiment's baseline result: executed earlier in this session, or now (a sealed
    attempt is reused when there is one) so that every case can be attributed."""
    for result in config.stash[RESULTS_KEY].get(key, []):
        if result.label == "baseline":
            return result
    baseline = next((ec for ec in execution_plan.cases if not ec.case.changed), None)
    if baseline is None:
        return None
    result = runner.run_case(baseline)
    record_result(config, key, result)
    return result


def case_attribution(
    config: pytest.Config,
    key: str,
    execution_plan: ExecutionPlan,
    runner: Runner,
    result: CaseResult,
) -> dict[str, Any] | None:
    """This case against the baseline (one entry of the attribution document), or None when
    there is nothing comparable."""
    from pytest_logprob_drift.attribution.sealed import attribute_attempts

    if result.attempt_dir is None or result.label == "baseline":
        return None
    baseline = baseline_result(config, key, execution_plan, runner)
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
    cases: list[dict[str, Any]] = document["cases"]
    return cases[0] if cases else None


def seal_attributions(config: pytest.Config) -> None:
    """Seal the attribution of every experiment this process executed a baseline for."""
    from pytest_logprob_drift.attribution.sealed import attribute_and_seal

    runners = config.stash.get(RUNNERS_KEY, {})
    sealed = config.stash.setdefault(SEALED_KEY, [])
    for key, results in config.stash.get(RESULTS_KEY, {}).items():
        baseline = next((r for r in results if r.label == "baseline"), None)
        cases = [r.attempt_dir for r in results if r is not baseline and r.attempt_dir]
        if baseline is None or baseline.attempt_dir is None or not cases or key not in runners:
            continue
        runner = runners[key]
        try:
            done = attribute_and_seal(
                runner.store.directory,
                runner.plan.plan.experiment_id,
                baseline.attempt_dir,
                baseline.repeat_dirs,
                cases,
            )
        except (ValueError, OSError):
            continue
        sealed.append(str(done.directory))


def close_runners(config: pytest.Config) -> Counter[str]:
    """Close every runner; the session's engine constructions so far."""
    runners = config.stash.get(RUNNERS_KEY, {})
    counts = config.stash.get(CONSTRUCTIONS_KEY, Counter())
    while runners:
        _, runner = runners.popitem()
        runner.close()
        counts["rollout"] += runner.pool.rollout_constructions
        counts["training"] += runner.pool.training_constructions
    return counts
