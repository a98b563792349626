"""What a frontend hands the core: catalogs assembled under one execution policy.

Owns, for the two frontends (the CLI and the pytest plugin), assembling the operator catalog
and the runtime catalog that planning and the runner receive (planning also receives the
built-in checkpoints the runtimes declare): the built-in and production entry-point backends,
backends a conftest adds, the production runtimes, and the ``pytest_logprob_drift.smoke``
entry-point group (the CPU smoke runtime and the smoke-only operators: visible to planning as
test-only, registered for execution only when the policy authorizes them). Also owns turning
a core error's ``Remedy`` into the frontend's own flag. The core (plan, execute, store) never
imports this module. Knows nothing about argparse or pytest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pytest_logprob_drift.errors import DriftError, Remedy
from pytest_logprob_drift.execute.runtime_catalog import RuntimeCatalog
from pytest_logprob_drift.records import FrozenRecord, PlanIssue, RuntimeInfo
from pytest_logprob_drift.registry.catalog import (
    OperatorDescriptor,
    SemanticOperatorCatalog,
    default_catalog,
    entry_point_items,
    production_descriptors,
)
from pytest_logprob_drift.runtimes import PRODUCTION_RUNTIMES

SMOKE_GROUP = "pytest_logprob_drift.smoke"
"""Entry-point group of the smoke runtime (entry ``runtimes``) and smoke operators
(entry ``operators``); absent when the smoke package is removed."""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class ExecutionPolicy(FrozenRecord):
    """What the user authorized on the command line (never in a config)."""

    allow_test_operators: bool = False


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Catalogs(FrozenRecord):
    """The catalogs one frontend session plans and executes with."""

    operators: SemanticOperatorCatalog
    """Everything planning may bind, test-only backends included (the runner registers those
    for execution only under an authorizing policy)."""
    runtimes: RuntimeCatalog
    """The runtimes a run may name; their ``checkpoints`` are what planning checks a config's
    checkpoint against (``plan`` names no runtime, so all of them)."""


def _smoke_group(entry: str) -> list[object]:
    return entry_point_items(SMOKE_GROUP, f"smoke {entry}", name=entry)


def runtime_catalog() -> RuntimeCatalog:
    """The production runtimes and the smoke group's runtime, with the built-in checkpoints
    each declares."""
    smoke = [r for r in _smoke_group("runtimes") if isinstance(r, RuntimeInfo)]
    return RuntimeCatalog(PRODUCTION_RUNTIMES).with_runtimes(smoke)


def operator_catalog(
    extra_operators: Iterable[OperatorDescriptor] = (), *, extra_source: str = "a conftest hook"
) -> SemanticOperatorCatalog:
    """Production backends, ``extra_operators`` (refused if test-only) and the smoke group's
    test-only backends."""
    extra = production_descriptors(extra_operators, extra_source)
    smoke = [d for d in _smoke_group("operators") if isinstance(d, OperatorDescriptor)]
    return default_catalog().with_descriptors((*extra, *smoke))


def assemble(
    extra_operators: Iterable[OperatorDescriptor] = (), *, extra_source: str = "a conftest hook"
) -> Catalogs:
    return Catalogs(
        operators=operator_catalog(extra_operators, extra_source=extra_source),
        runtimes=runtime_catalog(),
    )


def render_error(error: DriftError, flags: Mapping[Remedy, str]) -> str:
    """The error's one line, with the frontend's flag for its remedy."""
    text = error.render()
    if error.remedy is not None:
        text += f"; pass {flags[error.remedy]}"
    return text


def render_issue(issue: PlanIssue, flags: Mapping[Remedy, str]) -> str:
    text = issue.render()
    if issue.remedy is not None:
        text += f"; pass {flags[issue.remedy]}"
    return text
