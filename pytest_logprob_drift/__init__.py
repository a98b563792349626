"""pytest-logprob-drift: isolate which configuration change makes rollout and training disagree.

The package root is the common planning and execution facade only. Importing it never imports
torch, transformers or vLLM; runtimes load them lazily when a case executes. Runtime, artifact,
schema and operator internals stay in their owning modules.
"""

from __future__ import annotations

from pytest_logprob_drift.config.loader import load_config, parse_config
from pytest_logprob_drift.errors import (
    ArtifactError,
    ConfigError,
    ConfigErrors,
    DriftError,
    UsageError,
)
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.plan.binding import ExecutionPlan, build_execution_plan
from pytest_logprob_drift.plan.planner import plan_experiment
from pytest_logprob_drift.records import ExperimentConfig, ExperimentPlan
from pytest_logprob_drift.registry.catalog import SemanticOperatorCatalog, default_catalog

__all__ = [
    "ArtifactError",
    "ConfigError",
    "ConfigErrors",
    "DriftError",
    "ExecutionPlan",
    "ExperimentConfig",
    "ExperimentPlan",
    "Outcome",
    "UsageError",
    "build_execution_plan",
    "default_catalog",
    "load_config",
    "parse_config",
    "plan_experiment",
    "plan_file",
]

__version__ = "0.1.0"


def plan_file(
    path: str, *, pairwise: bool = False, catalog: SemanticOperatorCatalog | None = None
) -> ExecutionPlan:
    """Load, plan and operator-bind a config file (no engine, no torch), against ``catalog``
    (default: what the frontends plan against, ``policy.assemble().operators``)."""
    from pytest_logprob_drift.plan.binding import intervention_json_paths

    if catalog is None:
        from pytest_logprob_drift.policy import assemble

        catalog = assemble().operators
    config = load_config(path)
    plan = plan_experiment(config, pairwise=pairwise)
    return build_execution_plan(
        plan, catalog, intervention_paths=intervention_json_paths(config.interventions)
    )
