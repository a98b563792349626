"""Semantic operator catalog, per-case OperatorSession, and binding operators into cases."""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import Any

import pytest

from pytest_logprob_drift import (
    ConfigError,
    build_execution_plan,
    default_catalog,
    parse_config,
    plan_experiment,
)
from pytest_logprob_drift.errors import Remedy
from pytest_logprob_drift.plan.binding import (
    ExecutionPlan,
    intervention_json_paths,
    side_topology,
)
from pytest_logprob_drift.policy import runtime_catalog
from pytest_logprob_drift.records import IssueSeverity, Lifecycle, frozen_mapping
from pytest_logprob_drift.registry import catalog as registry_module
from pytest_logprob_drift.registry.capability import OperatorResolutionError
from pytest_logprob_drift.registry.catalog import (
    ENTRY_POINT_GROUP,
    NATIVE_DESCRIPTOR,
    SELECTED_LOGPROB,
    FactoryStyle,
    FallbackPolicy,
    OperatorDescriptor,
    SemanticOperatorCatalog,
    load_entry_point_descriptors,
)
from pytest_logprob_drift.registry.session import OperatorSession
from pytest_logprob_drift.runtimes.smoke.operators import (
    SMOKE_BACKEND_IDS,
    SMOKE_DESCRIPTORS,
    SMOKE_OFFSET,
    SMOKE_REFERENCE,
    SMOKE_ROLLOUT_OFFSET,
    SMOKE_ROLLOUT_WEIGHT,
)


def register_smoke_operators(catalog: SemanticOperatorCatalog) -> SemanticOperatorCatalog:
    """What the frontends do under --allow-smoke-operators: add the smoke group's
    descriptors (here taken directly from the smoke package)."""
    return catalog.with_descriptors(SMOKE_DESCRIPTORS)


REFERENCE = "rlkernel.reference_logp"
CHUNKED = "rlkernel.chunked_logp"
VOCAB_PARALLEL = "rlkernel.vocab_parallel_logp"
FACTORY_MODULE = "drift_test_fake_factories"

CATALOG = default_catalog()


def descriptor(backend_id: str, **overrides: Any) -> OperatorDescriptor:
    fields: dict[str, Any] = {
        "operation": SELECTED_LOGPROB,
        "backend_id": backend_id,
        "target_tags": ("rollout", "training"),
        "devices": ("cpu",),
        "dtypes": ("float32",),
        "required_topology": frozen_mapping({}),
        "alignment_properties": ("test",),
        "lifecycle": Lifecycle.ENGINE_CONSTRUCTION,
        "factory": f"{FACTORY_MODULE}:build",
        "version": "t1",
        "build_fingerprint": "t1",
        "factory_style": FactoryStyle.BUILDER,
    }
    fields.update(overrides)
    return OperatorDescriptor(**fields)


@pytest.fixture
def fake_factories(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """A torch-free factory module; each build is recorded so caching can be observed."""
    built: list[dict[str, Any]] = []
    module = types.ModuleType(FACTORY_MODULE)

    def build(*, target: str, options: dict[str, Any]) -> Any:
        def kernel(logits: Any, token_ids: Any) -> Any:
            return (target, options)

        built.append({"target": target, "options": options, "kernel": kernel})
        return kernel

    module.build = build  # type: ignore[attr-defined]
    module.kernel = lambda logits, token_ids: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, FACTORY_MODULE, module)
    return built


def resolve(
    session: OperatorSession,
    backend: str,
    *,
    target: str = "training",
    device: str = "cpu",
    dtype: str | None = "float32",
    topology: dict[str, int] | None = None,
    **kwargs: Any,
) -> Any:
    return session.resolve(
        SELECTED_LOGPROB,
        target,
        backend,
        device=device,
        dtype=dtype,
        topology=topology or {"world_size": 1},
        **kwargs,
    )


def resolution_error(
    session: OperatorSession, backend: str, **kwargs: Any
) -> OperatorResolutionError:
    with pytest.raises(OperatorResolutionError) as info:
        resolve(session, backend, **kwargs)
    return info.value


# ----------------------------------------------------------------------------- catalog


def test_default_catalog_has_native_and_entry_point_backends() -> None:
    ids = CATALOG.backend_ids(SELECTED_LOGPROB)
    assert {"native", REFERENCE, CHUNKED, VOCAB_PARALLEL} <= set(ids)
    assert CATALOG.get(SELECTED_LOGPROB, "native") is NATIVE_DESCRIPTOR
    reference = CATALOG.get(SELECTED_LOGPROB, REFERENCE)
    assert reference is not None
    assert (
        reference.factory
        == "logprob_drift_operators.selected_logprob.reference:reference_selected_logprob"
    )
    assert reference.fallback_policy is FallbackPolicy.NEVER
    assert reference.lifecycle is Lifecycle.ENGINE_CONSTRUCTION
    assert reference.version and reference.build_fingerprint
    vocab = CATALOG.get(SELECTED_LOGPROB, VOCAB_PARALLEL)
    assert vocab is not None and vocab.target_tags == ("training",)
    assert dict(vocab.required_topology["training"]) == {"min_world_size": 2}


def test_entry_point_descriptors_are_published_under_the_group() -> None:
    found = {d.backend_id for d in load_entry_point_descriptors()}
    assert {REFERENCE, CHUNKED, VOCAB_PARALLEL} <= found
    assert ENTRY_POINT_GROUP == "pytest_logprob_drift.operators"


def test_smoke_backends_are_not_in_the_default_catalog() -> None:
    assert not SMOKE_BACKEND_IDS & set(CATALOG.backend_ids(SELECTED_LOGPROB))
    assert not any(d.test_only for d in CATALOG.descriptors)
    assert {
        SMOKE_REFERENCE,
        SMOKE_OFFSET,
        SMOKE_ROLLOUT_OFFSET,
        SMOKE_ROLLOUT_WEIGHT,
    } == SMOKE_BACKEND_IDS
    assert all(d.test_only and d.devices == ("cpu",) for d in SMOKE_DESCRIPTORS)


def test_smoke_registration_is_explicit_and_makes_a_new_catalog() -> None:
    with_smoke = register_smoke_operators(CATALOG)
    assert SMOKE_BACKEND_IDS <= set(with_smoke.backend_ids(SELECTED_LOGPROB))
    assert not SMOKE_BACKEND_IDS & set(CATALOG.backend_ids(SELECTED_LOGPROB))
    assert with_smoke.fingerprint != CATALOG.fingerprint


def test_smoke_backends_cannot_arrive_through_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry_module, "load_entry_point_descriptors", lambda: SMOKE_DESCRIPTORS)
    with pytest.raises(ConfigError, match="test-only backends cannot be registered"):
        registry_module.default_catalog()


def test_catalog_and_descriptors_are_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        NATIVE_DESCRIPTOR.backend_id = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        CATALOG.descriptors = ()  # type: ignore[misc]
    assert isinstance(CATALOG.descriptors, tuple)


def test_conflicting_descriptors_are_refused() -> None:
    with pytest.raises(ConfigError, match="two different descriptors"):
        SemanticOperatorCatalog((descriptor("x"), descriptor("x", version="t2")))
    same = SemanticOperatorCatalog((descriptor("x"), descriptor("x")))
    assert same.backend_ids(SELECTED_LOGPROB) == ("x", "x")


def test_descriptor_fingerprint_tracks_every_field() -> None:
    base = descriptor("x")
    assert base.fingerprint == descriptor("x").fingerprint
    for change in (
        {"version": "t2"},
        {"build_fingerprint": "t2"},
        {"devices": ("cuda",)},
        {"test_only": True},
        {"fallback_policy": FallbackPolicy.DECLARED},
    ):
        assert descriptor("x", **change).fingerprint != base.fingerprint, change


def test_descriptor_from_mapping() -> None:
    data = {
        "operation": SELECTED_LOGPROB,
        "backend_id": "m",
        "target_tags": ["training"],
        "devices": ["cpu"],
        "dtypes": ["float32"],
        "required_topology": {"training": {"min_world_size": 2}},
        "alignment_properties": [],
        "lifecycle": "engine_construction",
        "factory": "a:b",
        "version": "1",
        "build_fingerprint": "f",
    }
    parsed = OperatorDescriptor.from_mapping(data)
    assert parsed.target_tags == ("training",)
    assert parsed.fallback_policy is FallbackPolicy.NEVER and not parsed.test_only
    with pytest.raises(ConfigError, match="malformed operator descriptor"):
        OperatorDescriptor.from_mapping({**data, "lifecycle": "forever"})
    with pytest.raises(ConfigError, match="malformed operator descriptor"):
        OperatorDescriptor.from_mapping({k: v for k, v in data.items() if k != "devices"})


# ----------------------------------------------------------------------------- sessions


def test_unknown_backend_never_falls_back() -> None:
    with OperatorSession(CATALOG, allow_test_only=True) as session:
        error = resolution_error(session, "rlkernel.does_not_exist")
        assert error.code == "UNKNOWN_BACKEND"
        assert "'rlkernel.does_not_exist'" in error.message and "native" in error.message
        assert session.provenance() == []


@pytest.mark.parametrize(
    ("backend", "kwargs", "code"),
    [
        (SMOKE_REFERENCE, {"device": "cuda"}, "UNSUPPORTED_DEVICE"),
        ("narrow", {"dtype": "bfloat16"}, "UNSUPPORTED_DTYPE"),
        (VOCAB_PARALLEL, {"target": "rollout"}, "UNSUPPORTED_TARGET"),
        (
            VOCAB_PARALLEL,
            {"target": "training", "topology": {"world_size": 1}},
            "UNSUPPORTED_TOPOLOGY",
        ),
        (VOCAB_PARALLEL, {"target": "training", "topology": {}}, "UNSUPPORTED_TOPOLOGY"),
    ],
)
def test_strict_capability_codes(backend: str, kwargs: dict[str, Any], code: str) -> None:
    catalog = register_smoke_operators(CATALOG).with_descriptors([descriptor("narrow")])
    with OperatorSession(catalog, allow_test_only=True) as session:
        error = resolution_error(session, backend, **kwargs)
        assert error.code == code, error
        assert backend in error.message
        assert session.provenance() == []


def test_topology_requirement_met() -> None:
    with OperatorSession(CATALOG, allow_test_only=False) as session:
        resolved = resolve(session, VOCAB_PARALLEL, topology={"world_size": 2})
        assert resolved.descriptor.backend_id == VOCAB_PARALLEL


def test_declared_fallback_policy_is_refused_under_strict_execution() -> None:
    catalog = CATALOG.with_descriptors(
        [descriptor("fallbacky", fallback_policy=FallbackPolicy.DECLARED)]
    )
    with OperatorSession(catalog, allow_test_only=False) as session:
        error = resolution_error(session, "fallbacky")
        assert error.code == "FALLBACK_POLICY"
        assert "'declared'" in error.message
        assert session.provenance() == []
    # Without strict execution it resolves, and still never to another backend.
    with OperatorSession(catalog, allow_test_only=False, strict=False) as session:
        assert resolve(session, "fallbacky").descriptor.backend_id == "fallbacky"
        assert resolution_error(session, "fallbacky", device="cuda").code == "UNSUPPORTED_DEVICE"


def test_smoke_backends_need_authorization() -> None:
    catalog = register_smoke_operators(CATALOG)
    with OperatorSession(catalog, allow_test_only=False) as session:
        error = resolution_error(session, SMOKE_OFFSET)
        assert error.code == "TEST_ONLY_NOT_AUTHORIZED"
        assert "test-only backend" in error.message and "--" not in error.message
    with OperatorSession(CATALOG, allow_test_only=True) as session:
        # Authorization without registration is not enough either.
        assert resolution_error(session, SMOKE_OFFSET).code == "UNKNOWN_BACKEND"
    with OperatorSession(catalog, allow_test_only=True) as session:
        assert resolve(session, SMOKE_OFFSET).descriptor.test_only


def test_session_caches_within_a_case_and_not_across_cases(
    fake_factories: list[dict[str, Any]],
) -> None:
    catalog = CATALOG.with_descriptors([descriptor("fake")])
    with OperatorSession(catalog, allow_test_only=False) as first:
        resolved = resolve(first, "fake", options={"k": 1})
        kernel = first.instantiate(resolved)
        assert first.instantiate(resolved) is kernel
        assert first.instantiate(resolve(first, "fake", options={"k": 1})) is kernel
        other_options = first.instantiate(resolve(first, "fake", options={"k": 2}))
        rollout = first.instantiate(resolve(first, "fake", target="rollout", options={"k": 1}))
        assert len({id(kernel), id(other_options), id(rollout)}) == 3
        assert len(fake_factories) == 3
        assert [p["options"] for p in first.provenance()] == [
            {"k": 1},
            {"k": 1},
            {"k": 2},
            {"k": 1},
        ]
    with OperatorSession(catalog, allow_test_only=False) as second:
        assert second.provenance() == []
        again = second.instantiate(resolve(second, "fake", options={"k": 1}))
        assert again is not kernel
        assert len(fake_factories) == 4


def test_closed_session_refuses_use(fake_factories: list[dict[str, Any]]) -> None:
    catalog = CATALOG.with_descriptors([descriptor("fake")])
    session = OperatorSession(catalog, allow_test_only=False)
    resolved = resolve(session, "fake")
    session.instantiate(resolved)
    session.close()
    assert session.provenance() == []
    with pytest.raises(RuntimeError, match="after close"):
        resolve(session, "fake")
    with pytest.raises(RuntimeError, match="after close"):
        session.instantiate(resolved)


def test_failed_factory_does_not_leak_into_the_next_case(
    fake_factories: list[dict[str, Any]],
) -> None:
    catalog = CATALOG.with_descriptors(
        [
            descriptor("broken", factory=f"{FACTORY_MODULE}:missing_attr"),
            descriptor(
                "kernel", factory=f"{FACTORY_MODULE}:kernel", factory_style=FactoryStyle.KERNEL
            ),
        ]
    )
    with OperatorSession(catalog, allow_test_only=False) as session:
        with pytest.raises(OperatorResolutionError) as info:
            session.instantiate(resolve(session, "broken"))
        assert info.value.code == "FACTORY_UNAVAILABLE"
    with OperatorSession(catalog, allow_test_only=False) as session:
        assert session.provenance() == []
        kernel = session.instantiate(resolve(session, "kernel"))
        assert kernel is sys.modules[FACTORY_MODULE].kernel  # type: ignore[attr-defined]
        assert fake_factories == []


def test_native_instantiates_to_the_runtime_path() -> None:
    with OperatorSession(CATALOG, allow_test_only=False) as session:
        resolved = resolve(session, "native", target="rollout", device="cuda", dtype="bfloat16")
        assert session.instantiate(resolved) is None
        (prov,) = session.provenance()
        assert prov["backend"] == "native" and prov["target"] == "rollout"
        assert prov["descriptor_fingerprint"] == NATIVE_DESCRIPTOR.fingerprint
        assert prov["test_only"] is False


# ----------------------------------------------------------------------------- binding


def config_doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema_version": "cross_config.experiment_config.v1",
        "experiment_id": "binding",
        "scenario_id": "binding-cuda",
        "contract_source": "ws1",
        "contract_version": "current",
        "strategy": "one_at_a_time",
        "identity": {
            "checkpoint": {"uri": "/models/tiny", "model_version": "tiny-v1"},
            "tokenizer": {"id": "tiny"},
            "prompts": {"token_ids": [[1, 2]]},
            "sampling": {"seed": 0, "max_new_tokens": 4},
        },
        "baseline": {
            "batch": {"size": 4},
            "rollout": {"dtype": "bfloat16", "tensor_parallel_size": 2},
            "training": {"compute_dtype": "bfloat16", "sharding": "none"},
            "logp": {"backend": "native"},
        },
        "interventions": [
            {"path": "batch.size", "values": [1]},
            {"path": "logp.backend", "values": [REFERENCE]},
        ],
        "scenario": {"level": "S2", "device": "cuda"},
    }
    doc.update(changes)
    return doc


def bind(doc: dict[str, Any], catalog: SemanticOperatorCatalog = CATALOG) -> ExecutionPlan:
    config = parse_config(doc)
    return build_execution_plan(
        plan_experiment(config),
        catalog,
        intervention_paths=intervention_json_paths(config.interventions),
    )


def issue_codes(ep: ExecutionPlan) -> list[tuple[str, str]]:
    return [(i.code, i.path) for i in ep.issues]


def test_logp_backend_binds_the_same_backend_on_both_sides() -> None:
    ep = bind(config_doc())
    assert not ep.has_errors and ep.issues == ()
    assert len(ep.cases) == len(ep.plan.cases) == 3
    by_label = {ec.case.label: ec for ec in ep.cases}
    for label, backend in (
        ("baseline", "native"),
        ("batch.size=1", "native"),
        (f"logp.backend={REFERENCE}", REFERENCE),
    ):
        ec = by_label[label]
        assert [(b.target, b.backend, b.source) for b in ec.bindings] == [
            ("rollout", backend, "logp.backend"),
            ("training", backend, "logp.backend"),
        ]
        assert not ec.uses_test_only_operators
    ref = by_label[f"logp.backend={REFERENCE}"].binding("training")
    assert ref.descriptor_fingerprint == CATALOG.get(SELECTED_LOGPROB, REFERENCE).fingerprint  # type: ignore[union-attr]


def test_absent_logp_backend_means_native() -> None:
    doc = config_doc(interventions=[{"path": "batch.size", "values": [1]}])
    del doc["baseline"]["logp"]
    ep = bind(doc)
    assert not ep.has_errors
    assert {b.backend for ec in ep.cases for b in ec.bindings} == {"native"}


def test_explicit_operators_mapping_binds_per_side_backends() -> None:
    doc = config_doc(
        interventions=[{"path": "batch.size", "values": [1]}],
        operators={
            SELECTED_LOGPROB: {
                "rollout": REFERENCE,
                "training": {"backend": CHUNKED, "options": {"chunk_size": 64}},
            }
        },
    )
    del doc["baseline"]["logp"]
    ep = bind(doc)
    assert not ep.has_errors, [i.render() for i in ep.issues]
    for ec in ep.cases:
        rollout, training = ec.binding("rollout"), ec.binding("training")
        assert (rollout.backend, rollout.source, dict(rollout.options)) == (
            REFERENCE,
            "explicit",
            {},
        )
        assert (training.backend, training.source, dict(training.options)) == (
            CHUNKED,
            "explicit",
            {"chunk_size": 64},
        )
    rows = ep.rows(runtime_catalog().runtimes)
    assert [b["backend"] for b in rows[0]["operators"]] == [REFERENCE, CHUNKED]


def test_logp_backend_intervention_with_explicit_mapping_is_refused() -> None:
    doc = config_doc(operators={SELECTED_LOGPROB: {"rollout": REFERENCE, "training": REFERENCE}})
    doc["interventions"] = [
        {"path": "batch.size", "values": [1]},
        {"path": "logp.impl", "values": [CHUNKED]},
    ]
    del doc["baseline"]["logp"]
    ep = bind(doc)
    assert ep.has_errors
    matching = [i for i in ep.issues if i.code == "LOGP_BACKEND_WITH_EXPLICIT_OPERATORS"]
    assert [i.path for i in matching] == ["$.interventions[1].path"]
    assert "$.operators.selected_logprob" in matching[0].message
    assert matching[0].severity is IssueSeverity.ERROR


def test_baseline_logp_backend_with_explicit_mapping_is_refused() -> None:
    doc = config_doc(
        interventions=[{"path": "batch.size", "values": [1]}],
        operators={SELECTED_LOGPROB: {"rollout": "native", "training": "native"}},
    )
    ep = bind(doc)
    assert issue_codes(ep) == [("LOGP_BACKEND_WITH_EXPLICIT_OPERATORS", "$.baseline.logp.backend")]


def test_unknown_backend_in_an_intervention() -> None:
    doc = config_doc()
    doc["interventions"][1]["values"] = ["rlkernel.nope"]
    ep = bind(doc)
    assert issue_codes(ep) == [("UNKNOWN_BACKEND", "$.interventions[1].path")]
    assert "'rlkernel.nope'" in ep.issues[0].message and REFERENCE in ep.issues[0].message
    assert [ec.case.label for ec in ep.cases] == ["baseline", "batch.size=1"]


def test_unknown_backend_in_baseline_and_explicit_mapping() -> None:
    doc = config_doc(interventions=[{"path": "batch.size", "values": [1]}])
    doc["baseline"]["logp"]["backend"] = "mystery"
    ep = bind(doc)
    assert issue_codes(ep) == [("UNKNOWN_BACKEND", "$.baseline.logp.backend")]
    assert ep.cases == ()
    doc = config_doc(
        interventions=[{"path": "batch.size", "values": [1]}],
        operators={SELECTED_LOGPROB: {"rollout": "native", "training": "mystery"}},
    )
    del doc["baseline"]["logp"]
    assert issue_codes(bind(doc)) == [("UNKNOWN_BACKEND", "$.operators.selected_logprob.training")]


def test_capability_violations_become_issues() -> None:
    doc = config_doc(
        interventions=[{"path": "batch.size", "values": [1]}],
        operators={SELECTED_LOGPROB: {"rollout": VOCAB_PARALLEL, "training": VOCAB_PARALLEL}},
    )
    del doc["baseline"]["logp"]
    ep = bind(doc)
    codes = {(i.code, i.path) for i in ep.issues}
    assert codes == {
        ("UNSUPPORTED_TARGET", "$.operators.selected_logprob.rollout"),
        ("UNSUPPORTED_TOPOLOGY", "$.operators.selected_logprob.training"),
    }
    assert ep.cases == ()
    # With FSDP training the vocab-parallel backend serves the training side.
    doc["operators"][SELECTED_LOGPROB]["rollout"] = "native"
    doc["baseline"]["training"]["sharding"] = "fsdp"
    assert not bind(doc).has_errors
    assert side_topology({"training.sharding": "fsdp"}, "training") == {"world_size": 2}
    assert (
        side_topology(
            {"rollout.tensor_parallel_size": 2, "rollout.context_parallel_size": 2}, "rollout"
        )["world_size"]
        == 4
    )


def test_smoke_backend_plans_with_a_warning_and_is_cpu_only() -> None:
    doc = config_doc(
        scenario={"level": "S0", "device": "cpu"},
        interventions=[{"path": "logp.backend", "values": [SMOKE_OFFSET]}],
    )
    doc["baseline"]["logp"]["backend"] = SMOKE_REFERENCE
    with_smoke = register_smoke_operators(CATALOG)
    ep = bind(doc, with_smoke)
    assert not ep.has_errors
    assert [(i.code, i.severity, i.remedy) for i in ep.issues] == [
        ("TEST_ONLY_OPERATOR", IssueSeverity.WARNING, Remedy.AUTHORIZE_TEST_OPERATORS)
    ] * 2
    assert all(ec.uses_test_only_operators for ec in ep.cases)
    # Where the smoke group is not loaded, they are unknown backends.
    assert {i.code for i in bind(doc).issues} == {"UNKNOWN_BACKEND"}
    doc["scenario"] = {"level": "S2", "device": "cuda"}
    assert {i.code for i in bind(doc, with_smoke).issues} >= {"UNSUPPORTED_DEVICE"}


def test_rows_share_case_ids_with_the_plan() -> None:
    ep = bind(config_doc())
    rows = ep.rows(runtime_catalog().runtimes)
    assert [r["case_id"] for r in rows] == [c.case_id for c in ep.plan.cases]
    assert set(rows[0]) == {
        "case_id",
        "label",
        "kind",
        "changed",
        "lifecycle",
        "requested",
        "operators",
        "scenario_level",
        "device",
        "executable_by",
        "contract_version",
        "threshold",
    }
    # S2 on cuda: vllm-hf declares it (what the machine has is checked when a run starts).
    assert rows[0]["executable_by"] == ["vllm-hf"]
    assert rows[0]["contract_version"] == ep.plan.contract.version != "current"
