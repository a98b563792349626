"""Planning: one explicit baseline plus declared interventions, expanded into cases.

Owns validating a config's knob paths and values against the knob catalog (``plan.knobs``) and
the scenario device, the expansion into cases (OAT; opt-in pairwise over explicitly listed
path pairs only), the 256-case cap (checked arithmetically before anything is expanded),
stable case ids and human labels. Every finding becomes a structured ``PlanIssue``; planning
reports them all at once and never creates an engine. Knows nothing about operators'
implementations, runtimes or torch.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Mapping, Sequence

from pytest_logprob_drift.config.contract import resolve_contract
from pytest_logprob_drift.errors import ConfigError, Remedy
from pytest_logprob_drift.plan.knobs import (
    DEVICE_ATTENTION,
    DEVICE_DTYPES,
    KNOBS,
    InvalidKnobValue,
    canonical_path,
    format_value,
    knob_lifecycle,
)
from pytest_logprob_drift.records import (
    PLAN_SCHEMA_VERSION,
    Case,
    CaseKind,
    ExperimentConfig,
    ExperimentPlan,
    IssueSeverity,
    JsonObject,
    KnobValue,
    PlanIssue,
    ResolvedContract,
    Strategy,
    canonical,
    canonical_json,
    frozen_mapping,
    sha256_hex,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Any

CASE_CAP = 256
"""Framework cap on planned cases (baseline included); not configurable."""


def case_label(changes: Sequence[tuple[str, KnobValue]]) -> str:
    if not changes:
        return "baseline"
    return ",".join(f"{path}={format_value(value)}" for path, value in changes)


def case_id_payload(
    *, requested: Mapping[str, KnobValue], config: ExperimentConfig, contract: ResolvedContract
) -> JsonObject:
    """The canonical case definition that ``case_id`` hashes."""
    return {
        "requested": dict(requested),
        "operators": canonical(config.operators),
        "identity": config.identity.canonical_identity(),
        "contract": {"source": contract.source, "version": contract.version},
        "scenario": {"scenario_id": config.scenario_id, **canonical(config.scenario)},
    }


def case_id(
    *, requested: Mapping[str, KnobValue], config: ExperimentConfig, contract: ResolvedContract
) -> str:
    """First 16 hex of SHA-256 over the canonical case definition."""
    return sha256_hex(
        canonical_json(case_id_payload(requested=requested, config=config, contract=contract))
    )[:16]


def _case_id_hasher(
    config: ExperimentConfig, contract: ResolvedContract
) -> Callable[[Mapping[str, KnobValue]], str]:
    """``case_id`` with the per-plan part hashed once (the identity can hold millions of
    prompt token ids). Byte-identical to ``case_id``: canonical JSON sorts the payload keys to
    ``{"contract":..,"identity":..,"operators":..,"requested":..,"scenario":..}``."""
    parts = case_id_payload(requested={}, config=config, contract=contract)
    head = hashlib.sha256(
        (
            f'{{"contract":{canonical_json(parts["contract"])},'
            f'"identity":{canonical_json(parts["identity"])},'
            f'"operators":{canonical_json(parts["operators"])},"requested":'
        ).encode()
    )
    tail = f',"scenario":{canonical_json(parts["scenario"])}}}'

    def hashed(requested: Mapping[str, KnobValue]) -> str:
        digest = head.copy()
        digest.update((canonical_json(dict(requested)) + tail).encode("utf-8"))
        return digest.hexdigest()[:16]

    return hashed


class _Issues:
    def __init__(self) -> None:
        self.items: list[PlanIssue] = []

    def error(self, code: str, path: str, message: str) -> None:
        self.items.append(
            PlanIssue(severity=IssueSeverity.ERROR, code=code, path=path, message=message)
        )

    def warning(self, code: str, path: str, message: str, remedy: Remedy | None = None) -> None:
        self.items.append(
            PlanIssue(
                severity=IssueSeverity.WARNING,
                code=code,
                path=path,
                message=message,
                remedy=remedy,
            )
        )


def _normalize_value(
    issues: _Issues, path: str, raw: Any, json_path: str, device: str
) -> KnobValue | None:
    try:
        value = KNOBS[path].normalize(raw)
    except InvalidKnobValue as exc:
        issues.error("INVALID_VALUE", json_path, f"{path}: {exc}")
        return None
    if path in ("rollout.dtype", "training.compute_dtype") and value not in DEVICE_DTYPES[device]:
        issues.error(
            "UNSUPPORTED_ON_DEVICE",
            json_path,
            f"{path}={value} is not supported on device {device!r}",
        )
        return None
    if path == "training.attention_backend" and value not in DEVICE_ATTENTION[device]:
        issues.error(
            "UNSUPPORTED_ON_DEVICE",
            json_path,
            f"{path}={value} needs cuda; the scenario device is {device!r}",
        )
        return None
    return value


def _known_path(issues: _Issues, raw_path: str, json_path: str) -> str | None:
    path = canonical_path(raw_path)
    if path not in KNOBS:
        issues.error(
            "UNKNOWN_KNOB",
            json_path,
            f"{raw_path!r} is not an allowlisted knob; allowed: {', '.join(KNOBS)}",
        )
        return None
    return path


def plan_experiment(config: ExperimentConfig, *, pairwise: bool = False) -> ExperimentPlan:
    """Expand a config into cases; all problems are returned as structured issues."""
    issues = _Issues()
    try:
        contract = resolve_contract(config.contract_source, config.contract_version)
    except ConfigError as exc:  # name the config file, like every other config fault
        raise ConfigError(exc.path, exc.message, source=exc.source or config.source) from None
    baseline, declared = _baseline(issues, config)
    interventions = _interventions(issues, config, baseline, declared)
    use_pairwise = pairwise or config.strategy is Strategy.PAIRWISE
    pairs = _pairs(issues, config, interventions) if use_pairwise else []
    if not use_pairwise and config.pairs:
        issues.warning(
            "PAIRS_IGNORED",
            "$.pairs",
            "pairs are listed but strategy is one_at_a_time and pairwise planning was not "
            "asked for; no pairwise cases planned",
            remedy=Remedy.EXPAND_PAIRS,
        )

    # The cap is checked arithmetically, before any expansion accumulates.
    total = (
        1
        + sum(len(v) for v in interventions.values())
        + sum(len(interventions[a]) * len(interventions[b]) for a, b in pairs)
    )
    cases: list[Case] = []
    if total > CASE_CAP:
        issues.error(
            "CASE_CAP_EXCEEDED",
            "$.interventions",
            f"the plan would have {total} "
            f"cases; the framework cap is {CASE_CAP}; split the experiment",
        )
    elif not any(i.severity is IssueSeverity.ERROR for i in issues.items):
        cases = _expand(config, contract, baseline, interventions, pairs)

    return ExperimentPlan(
        schema_version=PLAN_SCHEMA_VERSION,
        experiment_id=config.experiment_id,
        scenario_id=config.scenario_id,
        scenario=config.scenario,
        contract=contract,
        strategy=Strategy.PAIRWISE if use_pairwise else Strategy.ONE_AT_A_TIME,
        strict_fallback=config.strict_fallback,
        identity=config.identity,
        cases=tuple(cases),
        issues=tuple(issues.items),
        operators=config.operators,
        diagnostics=config.diagnostics,
    )


def _baseline(issues: _Issues, config: ExperimentConfig) -> tuple[dict[str, KnobValue], set[str]]:
    """Normalized baseline values, and every known path the baseline declares (valid or not)."""
    baseline: dict[str, KnobValue] = {}
    declared: set[str] = set()
    for raw_path, raw in config.baseline.items():
        json_path = config.baseline_json_paths[raw_path]
        path = _known_path(issues, raw_path, json_path)
        if path is None:
            continue
        if path in declared:
            issues.error(
                "DUPLICATE_KNOB", json_path, f"{path} is given twice (alias of {raw_path!r})"
            )
            continue
        declared.add(path)
        value = _normalize_value(issues, path, raw, json_path, config.scenario.device)
        if value is not None:
            baseline[path] = value
    return baseline, declared


def _interventions(
    issues: _Issues, config: ExperimentConfig, baseline: Mapping[str, KnobValue], declared: set[str]
) -> dict[str, list[KnobValue]]:
    """``path -> distinct normalized values`` of each declared intervention."""
    interventions: dict[str, list[KnobValue]] = {}
    for item in config.interventions:
        path = _known_path(issues, item.path, f"{item.json_path}.path")
        if path is None:
            continue
        if path in interventions:
            issues.error(
                "DUPLICATE_INTERVENTION",
                f"{item.json_path}.path",
                f"{path} is declared by more than one intervention; merge their values",
            )
            continue
        if path not in declared:
            issues.error(
                "INTERVENTION_WITHOUT_BASELINE",
                f"{item.json_path}.path",
                f"{path} has no baseline value; declare it under $.baseline",
            )
        interventions[path] = _intervention_values(
            issues, config, path, item.values, item.json_path, baseline
        )
    return interventions


def _intervention_values(
    issues: _Issues,
    config: ExperimentConfig,
    path: str,
    raw_values: Sequence[Any],
    json_path: str,
    baseline: Mapping[str, KnobValue],
) -> list[KnobValue]:
    values: list[KnobValue] = []
    seen: set[KnobValue] = set()  # a set: thousands of values must not cost O(n^2)
    for index, raw in enumerate(raw_values):
        vpath = f"{json_path}.values[{index}]"
        value = _normalize_value(issues, path, raw, vpath, config.scenario.device)
        if value is None:
            continue
        if path in baseline and value == baseline[path]:
            issues.warning(
                "EQUALS_BASELINE",
                vpath,
                f"{path}={format_value(value)} equals the baseline; no separate case is planned",
            )
            continue
        if value in seen:
            issues.warning(
                "DUPLICATE_VALUE",
                vpath,
                f"{path}={format_value(value)} is listed twice; planned once",
            )
            continue
        seen.add(value)
        values.append(value)
    return values


def _pairs(
    issues: _Issues, config: ExperimentConfig, interventions: Mapping[str, list[KnobValue]]
) -> list[tuple[str, str]]:
    """The explicitly listed path pairs, in knob-catalog order, each once."""
    if not config.pairs:
        issues.error(
            "PAIRWISE_WITHOUT_PAIRS",
            "$.pairs",
            "pairwise planning expands only explicitly listed path pairs; $.pairs is empty",
        )
    order = list(KNOBS)
    pairs: list[tuple[str, str]] = []
    for index, (first, second) in enumerate(config.pairs):
        ppath = f"$.pairs[{index}]"
        a = _known_path(issues, first, f"{ppath}[0]")
        b = _known_path(issues, second, f"{ppath}[1]")
        if a is None or b is None:
            continue
        if a == b:
            issues.error("INVALID_PAIR", ppath, f"a pair needs two different paths, got {a} twice")
            continue
        missing = [p for p in (a, b) if p not in interventions]
        if missing:
            issues.error(
                "PAIR_WITHOUT_INTERVENTION",
                ppath,
                f"{', '.join(missing)} has no declared intervention values to pair",
            )
            continue
        key = (a, b) if order.index(a) < order.index(b) else (b, a)
        if key in pairs:
            issues.warning(
                "DUPLICATE_PAIR", ppath, f"pair {key[0]} x {key[1]} is listed twice; planned once"
            )
            continue
        pairs.append(key)
    return pairs


def _expand(
    config: ExperimentConfig,
    contract: ResolvedContract,
    baseline: Mapping[str, KnobValue],
    interventions: Mapping[str, list[KnobValue]],
    pairs: Sequence[tuple[str, str]],
) -> list[Case]:
    hashed_id = _case_id_hasher(config, contract)

    def make(kind: CaseKind, changes: Sequence[tuple[str, KnobValue]]) -> Case:
        requested = dict(baseline)
        requested.update(changes)
        changed = tuple(path for path, _ in changes)
        lifecycle = max((knob_lifecycle(p) for p in changed), key=lambda lc: lc.rank, default=None)
        return Case(
            case_id=hashed_id(requested),
            label=case_label(changes),
            kind=kind,
            requested=frozen_mapping(requested),
            changed=changed,
            lifecycle=lifecycle,
        )

    cases = [make(CaseKind.BASELINE, ())]
    for path, values in interventions.items():
        for value in values:
            cases.append(make(CaseKind.ONE_AT_A_TIME, ((path, value),)))
            if len(cases) > CASE_CAP:
                raise AssertionError("case cap exceeded after the arithmetic check")
    for a, b in pairs:
        for va, vb in itertools.product(interventions[a], interventions[b]):
            cases.append(make(CaseKind.PAIRWISE, ((a, va), (b, vb))))
            if len(cases) > CASE_CAP:
                raise AssertionError("case cap exceeded after the arithmetic check")
    return cases
