"""Operator binding: from planned cases to an operator-bound ExecutionPlan and canonical rows.

Owns binding the selected rollout/training ``selected_logprob`` backends into each immutable
case, before any runtime exists: an explicit ``operators`` mapping fixes both sides; otherwise
``logp.backend`` selects the same backend on both sides (``native`` when absent). A
``logp.backend`` baseline value or intervention cannot be combined with an explicit mapping.
Binding a test-only backend is a warning with a remedy (execution needs authorization). Also
owns the canonical rows that planning prints and execution writes to ``plan.jsonl``. Works
against the catalog it is handed; knows nothing about engines, torch, or which backends or
runtimes exist.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_logprob_drift.errors import Remedy
from pytest_logprob_drift.plan.context_parallel import context_parallel_refusal
from pytest_logprob_drift.plan.knobs import canonical_path, value_of
from pytest_logprob_drift.records import (
    Case,
    ExperimentPlan,
    FrozenRecord,
    IssueSeverity,
    KnobValue,
    OperatorSelection,
    PlanIssue,
    RuntimeInfo,
    canonical,
    frozen_mapping,
)
from pytest_logprob_drift.registry.capability import OperatorResolutionError, check_capability
from pytest_logprob_drift.registry.catalog import (
    SELECTED_LOGPROB,
    TARGETS,
    OperatorDescriptor,
    SemanticOperatorCatalog,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Any, TypedDict

    from pytest_logprob_drift.records import JsonValue

    class RuntimeRefusal(TypedDict):
        """One runtime's reason not to execute some cases, with their ids and labels."""

        runtime: str
        reason: str
        case_ids: list[str]
        labels: list[str]


FSDP_WORLD_SIZE = 2
"""Training world size the runtimes use for ``training.sharding=fsdp`` (derived, recorded)."""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class OperatorBinding(FrozenRecord):
    """One side's backend for one semantic operation, fixed before a runtime exists."""

    operation: str
    target: str
    backend: str
    options: Mapping[str, JsonValue]
    descriptor_fingerprint: str
    version: str
    test_only: bool
    source: str
    """``explicit`` (operators mapping) or ``logp.backend``."""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class ExecutionCase(FrozenRecord):
    """A planned case and the operator binding of each side."""

    case: Case
    bindings: tuple[OperatorBinding, ...]
    alignment: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Per target, the alignment properties the bound backend's descriptor declares (what a
    runtime's ``logp_refusals`` are checked against); not part of any row or fingerprint."""

    def runtime_refusals(self, runtime: RuntimeInfo, device: str, checkpoint: str) -> list[str]:
        """Why ``runtime`` cannot execute this case on ``device`` for ``checkpoint`` (its URI),
        known before any engine: the backends it cannot inject, and context parallelism it
        cannot run for that checkpoint (``plan.context_parallel``). Empty when it can."""
        properties = dict(self.alignment)
        reasons = []
        cp = context_parallel_refusal(runtime, self.case.requested, device, checkpoint)
        if cp is not None:
            reasons.append(cp)
        moe = router_knobs_refusal(self.case.requested)
        if moe is not None:
            reasons.append(moe)
        if value_of(self.case.requested, "rollout.expert_parallel") is True and device == "cpu":
            reasons.append(EXPERT_PARALLEL_ON_CPU)
        for b in self.bindings:
            why = runtime.logp_refusal(b.target, b.backend, properties.get(b.target, ()))
            if why is not None:
                reasons.append(why)
        return reasons

    def binding(self, target: str, operation: str = SELECTED_LOGPROB) -> OperatorBinding:
        for b in self.bindings:
            if b.target == target and b.operation == operation:
                return b
        raise KeyError((operation, target))

    @property
    def uses_test_only_operators(self) -> bool:
        return any(b.test_only for b in self.bindings)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class ExecutionPlan(FrozenRecord):
    """The operator-bound plan that execution runs (and its planning issues)."""

    plan: ExperimentPlan
    cases: tuple[ExecutionCase, ...]
    issues: tuple[PlanIssue, ...]
    catalog_fingerprint: str

    @property
    def has_errors(self) -> bool:
        return any(i.severity is IssueSeverity.ERROR for i in self.issues)

    def rows(self, runtimes: Sequence[RuntimeInfo]) -> list[dict[str, Any]]:
        """Canonical rows; ``executable_by`` names those of ``runtimes`` that execute it: its
        scenario, and the backends it binds (``ExecutionCase.runtime_refusals``)."""
        executable = sorted(
            (r for r in runtimes if r.executes(self.plan.scenario)), key=lambda r: r.name
        )
        device, checkpoint = self.plan.scenario.device, self.plan.identity.checkpoint.uri
        return [
            case_row(
                self,
                ec,
                [r.name for r in executable if not ec.runtime_refusals(r, device, checkpoint)],
            )
            for ec in self.cases
        ]

    def refusals(self, runtimes: Sequence[RuntimeInfo]) -> list[RuntimeRefusal]:
        """Why each of ``runtimes`` that executes the scenario still cannot execute some cases
        (``ExecutionCase.runtime_refusals``): one entry per runtime and reason, with the case
        ids and labels it holds for, in case order: what ``plan`` prints beside
        ``executable_by``."""
        device, checkpoint = self.plan.scenario.device, self.plan.identity.checkpoint.uri
        found: dict[tuple[str, str], RuntimeRefusal] = {}
        for runtime in sorted(runtimes, key=lambda r: r.name):
            if not runtime.executes(self.plan.scenario):
                continue
            for ec in self.cases:
                for reason in ec.runtime_refusals(runtime, device, checkpoint):
                    entry = found.setdefault(
                        (runtime.name, reason),
                        {"runtime": runtime.name, "reason": reason, "case_ids": [], "labels": []},
                    )
                    entry["case_ids"].append(ec.case.case_id)
                    entry["labels"].append(ec.case.label)
        return list(found.values())


EXPERT_PARALLEL_ON_CPU = (
    "rollout.expert_parallel=true on cpu: vLLM 0.32's CPU build does not run expert "
    "parallelism (CPUUnquantizedExperts.apply never passes the expert_map to cpu_fused_moe, "
    "experts/cpu_moe.py; a TP 2 engine with enable_expert_parallel segfaulted in "
    "cpu_fused_moe on its first prefill), and the transformers rollout has none"
)


def router_knobs_refusal(requested: Mapping[str, KnobValue]) -> str | None:
    """Why a case cannot change the training MoE router (``training.moe_routing``,
    ``training.router_dtype``) under ``training.sharding=fsdp``: the router hooks (and the
    rollout's expert ids that replay needs) run in the in-process scorer only, never reach the
    FSDP rank processes; None when it can."""
    if value_of(requested, "training.sharding") != "fsdp":
        return None
    named = [
        f"{path}={requested[path]}"
        for path in ("training.moe_routing", "training.router_dtype")
        if path in requested and requested[path] != value_of({}, path)
    ]
    if not named:
        return None
    return (
        f"{', '.join(named)} under training.sharding=fsdp: the router hooks run in the "
        "unsharded scorer only (the rollout's expert ids do not reach the FSDP ranks)"
    )


def side_topology(requested: Mapping[str, KnobValue], target: str) -> dict[str, int]:
    if target == "rollout":
        tp = int(value_of(requested, "rollout.tensor_parallel_size"))
        cp = int(value_of(requested, "rollout.context_parallel_size"))
        return {"world_size": tp * cp, "tensor_parallel_size": tp, "context_parallel_size": cp}
    sharded = value_of(requested, "training.sharding") == "fsdp"
    return {"world_size": FSDP_WORLD_SIZE if sharded else 1}


def side_dtype(requested: Mapping[str, KnobValue], target: str) -> str | None:
    key = "rollout.dtype" if target == "rollout" else "training.compute_dtype"
    value = requested.get(key)
    return None if value is None else str(value)


_NO_OPTIONS: Mapping[str, JsonValue] = frozen_mapping({})


def _selection_for(
    case: Case, explicit: OperatorSelection | None, target: str
) -> tuple[str, Mapping[str, JsonValue], str]:
    if explicit is not None:
        side = explicit.rollout if target == "rollout" else explicit.training
        return side.backend, side.options, "explicit"
    return (
        str(value_of(case.requested, "logp.backend")),
        _NO_OPTIONS,
        "logp.backend",
    )


def build_execution_plan(
    plan: ExperimentPlan,
    catalog: SemanticOperatorCatalog,
    *,
    intervention_paths: Mapping[str, str] | None = None,
) -> ExecutionPlan:
    """Bind operators into every case; problems become structured issues.

    ``catalog`` is what planning can see. Test-only backends in it bind with a warning
    (planning is not execution); the runner refuses to execute them unless the execution
    policy authorizes them.
    """
    paths = dict(intervention_paths or {})
    explicit = {s.operation: s for s in plan.operators}.get(SELECTED_LOGPROB)
    issues: list[PlanIssue] = list(plan.issues)
    if explicit is not None:
        issues.extend(_explicit_mapping_conflicts(plan, paths))
    binder = _Binder(catalog=catalog, device=plan.scenario.device, issues=issues)
    bound: list[ExecutionCase] = []
    for case in plan.cases:
        bindings = [
            b for target in TARGETS if (b := binder.bind(case, target, explicit, paths)) is not None
        ]
        if len(bindings) == len(TARGETS):
            alignment = tuple(
                (b.target, d.alignment_properties)
                for b in bindings
                if (d := catalog.get(SELECTED_LOGPROB, b.backend)) is not None
            )
            bound.append(ExecutionCase(case=case, bindings=tuple(bindings), alignment=alignment))
    return ExecutionPlan(
        plan=plan, cases=tuple(bound), issues=tuple(issues), catalog_fingerprint=catalog.fingerprint
    )


def _explicit_mapping_conflicts(plan: ExperimentPlan, paths: Mapping[str, str]) -> list[PlanIssue]:
    conflicts: list[PlanIssue] = []
    if "logp.backend" in paths:
        conflicts.append(
            PlanIssue(
                severity=IssueSeverity.ERROR,
                code="LOGP_BACKEND_WITH_EXPLICIT_OPERATORS",
                path=paths["logp.backend"],
                message="a logp.backend intervention cannot be "
                "combined with the fixed $.operators.selected_logprob mapping: it would not change "
                "execution",
            )
        )
    if plan.cases and "logp.backend" in plan.cases[0].requested:
        conflicts.append(
            PlanIssue(
                severity=IssueSeverity.ERROR,
                code="LOGP_BACKEND_WITH_EXPLICIT_OPERATORS",
                path="$.baseline.logp.backend",
                message="logp.backend and "
                "$.operators.selected_logprob both select the backend; keep one",
            )
        )
    return conflicts


class _Binder:
    """Binds one side of one case at a time; reports each problem once per backend/path.
    (A plain class: creating a dataclass costs ``plan`` more at import than it saves.)"""

    __slots__ = ("bindings", "catalog", "device", "issues", "reported")

    def __init__(
        self, *, catalog: SemanticOperatorCatalog, device: str, issues: list[PlanIssue]
    ) -> None:
        self.catalog = catalog
        self.device = device
        self.issues = issues
        self.reported: set[tuple[str, str, str]] = set()
        self.bindings: dict[tuple[str, str, str], OperatorBinding] = {}
        """Per (target, backend, source): the one binding every capable case shares (its
        options and descriptor fingerprint are those of the plan, not of a case)."""

    def _once(self, key: tuple[str, str, str], issue: PlanIssue) -> None:
        if key not in self.reported:
            self.reported.add(key)
            self.issues.append(issue)

    def bind(
        self, case: Case, target: str, explicit: OperatorSelection | None, paths: Mapping[str, str]
    ) -> OperatorBinding | None:
        backend, options, source = _selection_for(case, explicit, target)
        json_path = _selection_json_path(case, target, source, paths)
        descriptor = self.catalog.get(SELECTED_LOGPROB, backend)
        if descriptor is None:
            known = ", ".join(self.catalog.backend_ids(SELECTED_LOGPROB))
            self._once(
                ("unknown", backend, json_path),
                PlanIssue(
                    severity=IssueSeverity.ERROR,
                    code="UNKNOWN_BACKEND",
                    path=json_path,
                    message=f"no {SELECTED_LOGPROB} backend {backend!r} is registered "
                    f"(known: {known})",
                ),
            )
            return None
        if descriptor.test_only:
            self._once(
                ("test_only", backend, ""),
                PlanIssue(
                    severity=IssueSeverity.WARNING,
                    code="TEST_ONLY_OPERATOR",
                    path=json_path,
                    message=f"{backend} is a test-only backend: executing it needs authorization",
                    remedy=Remedy.AUTHORIZE_TEST_OPERATORS,
                ),
            )
        if not self._capable(case, target, descriptor, json_path):
            return None
        key = (target, backend, source)
        binding = self.bindings.get(key)
        if binding is None:
            binding = self.bindings[key] = OperatorBinding(
                operation=SELECTED_LOGPROB,
                target=target,
                backend=backend,
                options=frozen_mapping(dict(options)),
                descriptor_fingerprint=descriptor.fingerprint,
                version=descriptor.version,
                test_only=descriptor.test_only,
                source=source,
            )
        return binding

    def _capable(
        self, case: Case, target: str, descriptor: OperatorDescriptor, json_path: str
    ) -> bool:
        try:
            check_capability(
                descriptor,
                target=target,
                device=self.device,
                dtype=side_dtype(case.requested, target),
                topology=side_topology(case.requested, target),
                allow_test_only=True,
                strict=False,
            )
        except OperatorResolutionError as exc:
            self.issues.append(
                PlanIssue(
                    severity=IssueSeverity.ERROR,
                    code=exc.code,
                    path=json_path,
                    message=f"case {case.label}: {exc.message}",
                )
            )
            return False
        return True


def _selection_json_path(case: Case, target: str, source: str, paths: Mapping[str, str]) -> str:
    if source == "explicit":
        return f"$.operators.{SELECTED_LOGPROB}.{target}"
    if "logp.backend" in case.changed:
        return paths.get("logp.backend", "$.interventions")
    return "$.baseline.logp.backend"


def case_row(
    execution_plan: ExecutionPlan, ec: ExecutionCase, executable_by: Sequence[str]
) -> dict[str, Any]:
    """The canonical row shared by `plan` output and `plan.jsonl`."""
    case = ec.case
    plan = execution_plan.plan
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
        "executable_by": list(executable_by),
        "contract_version": plan.contract.version,
        "threshold": plan.contract.threshold,
    }


def intervention_json_paths(interventions: Sequence[Any]) -> dict[str, str]:
    """``canonical knob path -> JSON path`` of each declared intervention."""
    return {canonical_path(i.path): f"{i.json_path}.path" for i in interventions}
