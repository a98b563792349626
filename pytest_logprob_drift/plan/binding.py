"""Operator binding: from planned cases to an operator-bound ExecutionPlan and canonical rows.

Owns binding the selected rollout/training ``selected_logprob`` backends into each immutable
case, before any runtime exists: an explicit ``operators`` mapping fixes both sides; otherwise
``logp.backend`` selects the same backend on both sides (``native`` when absent). A
``logp.backend`` baseline value or intervention cannot be combined with an explicit mapping.
Also owns the canonical rows that planning prints and execution writes to ``plan.jsonl``, and
which runtimes execute each case's scenario level. Knows nothing about engines or torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_logprob_drift.execute.runtime_catalog import RUNTIMES, RuntimeInfo
from pytest_logprob_drift.plan.planner import canonical_path
from pytest_logprob_drift.records import (
    Case,
    ExperimentPlan,
    IssueSeverity,
    KnobValue,
    OperatorSelection,
    PlanIssue,
    canonical,
    frozen_mapping,
)
from pytest_logprob_drift.registry.catalog import (
    NATIVE_BACKEND,
    SELECTED_LOGPROB,
    TARGETS,
    OperatorResolutionError,
    SemanticOperatorCatalog,
    check_capability,
)
from pytest_logprob_drift.runtimes.smoke.operators import SMOKE_DESCRIPTORS

FSDP_WORLD_SIZE = 2
"""Training world size the runtimes use for ``training.sharding=fsdp`` (derived, recorded)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OperatorBinding:
    """One side's backend for one semantic operation, fixed before a runtime exists."""

    operation: str
    target: str
    backend: str
    options: Mapping[str, Any]
    descriptor_fingerprint: str
    version: str
    is_smoke_only: bool
    source: str
    """``explicit`` (operators mapping) or ``logp.backend``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionCase:
    case: Case
    bindings: tuple[OperatorBinding, ...]

    def binding(self, target: str, operation: str = SELECTED_LOGPROB) -> OperatorBinding:
        for b in self.bindings:
            if b.target == target and b.operation == operation:
                return b
        raise KeyError((operation, target))

    @property
    def uses_smoke_operators(self) -> bool:
        return any(b.is_smoke_only for b in self.bindings)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionPlan:
    plan: ExperimentPlan
    cases: tuple[ExecutionCase, ...]
    issues: tuple[PlanIssue, ...]
    catalog_fingerprint: str

    @property
    def has_errors(self) -> bool:
        return any(i.severity is IssueSeverity.ERROR for i in self.issues)

    def executable_by(self, runtime: RuntimeInfo) -> bool:
        return runtime.executes(self.plan.scenario)

    def rows(self) -> list[dict[str, Any]]:
        return [case_row(self, ec) for ec in self.cases]


def side_topology(requested: Mapping[str, KnobValue], target: str) -> dict[str, int]:
    if target == "rollout":
        tp = int(requested.get("rollout.tensor_parallel_size", 1))
        cp = int(requested.get("rollout.context_parallel_size", 1))
        return {"world_size": tp * cp, "tensor_parallel_size": tp, "context_parallel_size": cp}
    sharded = requested.get("training.sharding", "none") == "fsdp"
    return {"world_size": FSDP_WORLD_SIZE if sharded else 1}


def side_dtype(requested: Mapping[str, KnobValue], target: str) -> str | None:
    key = "rollout.dtype" if target == "rollout" else "training.compute_dtype"
    value = requested.get(key)
    return None if value is None else str(value)


def _selection_for(case: Case, explicit: OperatorSelection | None, target: str) \
        -> tuple[str, Mapping[str, Any], str]:
    if explicit is not None:
        side = explicit.rollout if target == "rollout" else explicit.training
        return side.backend, side.options, "explicit"
    return str(case.requested.get("logp.backend", NATIVE_BACKEND)), frozen_mapping({}), \
        "logp.backend"


def build_execution_plan(plan: ExperimentPlan, catalog: SemanticOperatorCatalog, *,
                         intervention_paths: Mapping[str, str] | None = None
                         ) -> ExecutionPlan:
    """Bind operators into every case; problems become structured issues.

    ``catalog`` is what is registered for this execution. Smoke backends that are known but not
    registered are reported as warnings here (planning is not execution); the runner refuses to
    execute them without registration and authorization.
    """
    issues: list[PlanIssue] = list(plan.issues)
    explicit = {s.operation: s for s in plan.operators}.get(SELECTED_LOGPROB)
    if explicit is not None:
        baseline_case = plan.cases[0] if plan.cases else None
        for path, json_path in (intervention_paths or {}).items():
            if path == "logp.backend":
                issues.append(PlanIssue(
                    severity=IssueSeverity.ERROR, code="LOGP_BACKEND_WITH_EXPLICIT_OPERATORS",
                    path=json_path, message="a logp.backend intervention cannot be combined "
                    "with the fixed $.operators.selected_logprob mapping: it would not change "
                    "execution"))
        if baseline_case is not None and "logp.backend" in baseline_case.requested:
            issues.append(PlanIssue(
                severity=IssueSeverity.ERROR, code="LOGP_BACKEND_WITH_EXPLICIT_OPERATORS",
                path="$.baseline.logp.backend", message="logp.backend and "
                "$.operators.selected_logprob both select the backend; keep one"))

    smoke_known = {d.backend_id: d for d in SMOKE_DESCRIPTORS}
    device = plan.scenario.device
    bound: list[ExecutionCase] = []
    reported: set[tuple[str, str, str]] = set()
    for case in plan.cases:
        bindings: list[OperatorBinding] = []
        for target in TARGETS:
            backend, options, source = _selection_for(case, explicit, target)
            if source == "explicit":
                json_path = f"$.operators.{SELECTED_LOGPROB}.{target}"
            elif "logp.backend" in case.changed:
                json_path = (intervention_paths or {}).get("logp.backend", "$.interventions")
            else:
                json_path = "$.baseline.logp.backend"
            descriptor = catalog.get(SELECTED_LOGPROB, backend)
            if descriptor is None and backend in smoke_known:
                descriptor = smoke_known[backend]
                key = ("smoke", backend, "")
                if key not in reported:
                    reported.add(key)
                    issues.append(PlanIssue(
                        severity=IssueSeverity.WARNING, code="SMOKE_OPERATOR",
                        path=json_path, message=f"{backend} is a smoke-only backend: "
                        "executing it needs --allow-smoke-operators"))
            if descriptor is None:
                key = ("unknown", backend, json_path)  # once per backend and JSON path
                if key not in reported:
                    reported.add(key)
                    known = ", ".join(catalog.backend_ids(SELECTED_LOGPROB))
                    issues.append(PlanIssue(
                        severity=IssueSeverity.ERROR, code="UNKNOWN_BACKEND", path=json_path,
                        message=f"no {SELECTED_LOGPROB} backend {backend!r} is registered "
                        f"(known: {known})"))
                continue
            try:
                check_capability(descriptor, target=target, device=device,
                                 dtype=side_dtype(case.requested, target),
                                 topology=side_topology(case.requested, target),
                                 allow_smoke=True)
            except OperatorResolutionError as exc:
                issues.append(PlanIssue(severity=IssueSeverity.ERROR, code=exc.code,
                                        path=json_path,
                                        message=f"case {case.label}: {exc.message}"))
                continue
            bindings.append(OperatorBinding(
                operation=SELECTED_LOGPROB, target=target, backend=backend,
                options=frozen_mapping(dict(options)),
                descriptor_fingerprint=descriptor.fingerprint, version=descriptor.version,
                is_smoke_only=descriptor.is_smoke_only, source=source))
        if len(bindings) == len(TARGETS):
            bound.append(ExecutionCase(case=case, bindings=tuple(bindings)))
    return ExecutionPlan(plan=plan, cases=tuple(bound), issues=tuple(issues),
                         catalog_fingerprint=catalog.fingerprint)


def case_row(execution_plan: ExecutionPlan, ec: ExecutionCase) -> dict[str, Any]:
    """The canonical row shared by `plan` output and `plan.jsonl`."""
    case = ec.case
    plan = execution_plan.plan
    runtimes = [name for name, info in sorted(RUNTIMES.items()) if info.executes(plan.scenario)]
    return {
        "case_id": case.case_id,
        "label": case.label,
        "kind": case.kind.value,
        "changed": list(case.changed),
        "lifecycle": None if case.lifecycle is None else case.lifecycle.value,
        "requested": canonical(case.requested),
        "operators": [canonical(b) for b in ec.bindings],
        "scenario_level": plan.scenario.level.value,
        "device": plan.scenario.device,
        "executable_by": runtimes,
        "contract_version": plan.contract.version,
        "threshold": plan.contract.threshold,
    }


def intervention_json_paths(interventions: Sequence[Any]) -> dict[str, str]:
    """``canonical knob path -> JSON path`` of each declared intervention."""
    return {canonical_path(i.path): f"{i.json_path}.path" for i in interventions}
