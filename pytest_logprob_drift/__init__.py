"""pytest-logprob-drift: isolate which configuration change makes rollout and training disagree.

The package root is the common planning and execution facade only. Importing it never imports
torch, transformers or vLLM; runtimes load them lazily when a case executes. Runtime, artifact,
schema and operator internals stay in their owning modules.

The facade's names are resolved on first use (PEP 562): ``import pytest_logprob_drift`` itself
loads nothing else, so a process that only needs one command (``python -m pytest_logprob_drift
plan``) pays only for the modules that command imports.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path
    from typing import Any

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
    from pytest_logprob_drift.records import BuiltinCheckpoint, ExperimentConfig, ExperimentPlan
    from pytest_logprob_drift.registry.catalog import SemanticOperatorCatalog, default_catalog

_FACADE = {
    "ArtifactError": "pytest_logprob_drift.errors",
    "ConfigError": "pytest_logprob_drift.errors",
    "ConfigErrors": "pytest_logprob_drift.errors",
    "DriftError": "pytest_logprob_drift.errors",
    "UsageError": "pytest_logprob_drift.errors",
    "Outcome": "pytest_logprob_drift.outcomes",
    "ExecutionPlan": "pytest_logprob_drift.plan.binding",
    "build_execution_plan": "pytest_logprob_drift.plan.binding",
    "plan_experiment": "pytest_logprob_drift.plan.planner",
    "ExperimentConfig": "pytest_logprob_drift.records",
    "ExperimentPlan": "pytest_logprob_drift.records",
    "SemanticOperatorCatalog": "pytest_logprob_drift.registry.catalog",
    "default_catalog": "pytest_logprob_drift.registry.catalog",
}
"""Each facade name and the module that owns it."""

__all__ = [
    "ArtifactError",
    "ConfigError",
    "ConfigErrors",
    "DriftError",
    "ExecutionPlan",
    "ExperimentConfig",
    "ExperimentPlan",
    "Outcome",
    "SemanticOperatorCatalog",
    "UsageError",
    "build_execution_plan",
    "default_catalog",
    "load_config",
    "parse_config",
    "plan_experiment",
    "plan_file",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    owner = _FACADE.get(name)
    if owner is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(owner), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_FACADE})


def _registered_checkpoints() -> Mapping[str, BuiltinCheckpoint]:
    """The built-in checkpoints the frontends plan against: ``policy``'s runtimes'."""
    from pytest_logprob_drift.policy import runtime_catalog

    return runtime_catalog().checkpoints


def load_config(
    path: str | Path, *, checkpoints: Mapping[str, BuiltinCheckpoint] | None = None
) -> ExperimentConfig:
    """Read and strictly validate a config file, its checkpoint against ``checkpoints``
    (default: the built-in checkpoints of the runtimes the frontends register)."""
    from pytest_logprob_drift.config import loader

    if checkpoints is None:
        checkpoints = _registered_checkpoints()
    return loader.load_config(path, checkpoints=checkpoints)


def parse_config(
    document: Any,
    *,
    source: str | None = None,
    base_dir: Path | None = None,
    checkpoints: Mapping[str, BuiltinCheckpoint] | None = None,
) -> ExperimentConfig:
    """Validate an already-parsed config document (``checkpoints`` as for ``load_config``)."""
    from pytest_logprob_drift.config import loader

    if checkpoints is None:
        checkpoints = _registered_checkpoints()
    return loader.parse_config(document, source=source, base_dir=base_dir, checkpoints=checkpoints)


def plan_file(
    path: str,
    *,
    pairwise: bool = False,
    catalog: SemanticOperatorCatalog | None = None,
    checkpoints: Mapping[str, BuiltinCheckpoint] | None = None,
) -> ExecutionPlan:
    """Load, plan and operator-bind a config file (no engine, no torch), against ``catalog``
    and ``checkpoints`` (default: what the frontends plan against, ``policy.assemble()``'s
    operators and its runtimes' built-in checkpoints)."""
    from pytest_logprob_drift.config import loader
    from pytest_logprob_drift.plan.binding import build_execution_plan, intervention_json_paths
    from pytest_logprob_drift.plan.planner import plan_experiment

    if catalog is None or checkpoints is None:
        from pytest_logprob_drift.policy import assemble

        catalogs = assemble()
        catalog = catalogs.operators if catalog is None else catalog
        checkpoints = catalogs.runtimes.checkpoints if checkpoints is None else checkpoints
    config = loader.load_config(path, checkpoints=checkpoints)
    plan = plan_experiment(config, pairwise=pairwise)
    return build_execution_plan(
        plan, catalog, intervention_paths=intervention_json_paths(config.interventions)
    )
