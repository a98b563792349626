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
from typing import TYPE_CHECKING

import pytest

from pytest_logprob_drift.execute.runtime_catalog import RuntimeCatalog
from pytest_logprob_drift.plugin.options import DriftOptions
from pytest_logprob_drift.policy import operator_catalog
from pytest_logprob_drift.registry.catalog import SemanticOperatorCatalog, as_descriptor

if TYPE_CHECKING:
    from pytest_logprob_drift.execute.runner import Runner
    from pytest_logprob_drift.plan.binding import ExecutionPlan

OPTIONS_KEY = pytest.StashKey[DriftOptions]()
RUNTIMES_KEY = pytest.StashKey[RuntimeCatalog]()
RUNNERS_KEY = pytest.StashKey[dict[str, "Runner"]]()
CATALOG_KEY = pytest.StashKey[SemanticOperatorCatalog]()
CONSTRUCTIONS_KEY = pytest.StashKey[Counter[str]]()
"""Engine constructions of the runners closed so far: ``rollout`` and ``training``."""


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
        )
    return runners[key]


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
