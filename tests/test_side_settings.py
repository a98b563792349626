"""Typed knob settings (issue 49): each knob's catalog entry names its side and default;
``bind_case`` builds one frozen settings object per side, once; engines read attributes.

A knob added later is one catalog entry plus one field: the last test adds both, in the test
alone, and runs a real case on the synthetic runtime whose adapter reads the new field.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from drift_testing import S0, S1

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.execute.protocol import Materialized, RuntimeBinding, bind_case
from pytest_logprob_drift.execute.runner import Runner
from pytest_logprob_drift.execute.side_settings import (
    AttentionBackend,
    DType,
    LmHeadDtype,
    LogprobSemantics,
    LogprobsMode,
    MoeRouting,
    RolloutSettings,
    RouterDtype,
    SettingsTypes,
    Sharding,
    SyncPush,
    TrainingSettings,
    WeightSync,
)
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.plan import knobs
from pytest_logprob_drift.plan.knobs import KNOBS, KnobSpec, Side
from pytest_logprob_drift.policy import assemble
from pytest_logprob_drift.records import (
    ApplicationStatus,
    JSONScalar,
    Knob,
    KnobValue,
    Lifecycle,
    ScoringIdentity,
)
from pytest_logprob_drift.runtimes.smoke.runtime import CpuSmokeAdapter, SyntheticRollout


def test_every_default_is_a_value_its_knob_takes() -> None:
    for path, spec in KNOBS.items():
        assert spec.normalize(spec.default) == spec.default, path
        assert spec.knob.path.startswith(f"{spec.side.value}.") != (spec.side is Side.REQUEST)


@pytest.mark.parametrize(
    ("enum_type", "choices"),
    [
        (DType, knobs.DTYPES),
        (AttentionBackend, knobs.ATTENTION_BACKENDS),
        (Sharding, knobs.SHARDINGS),
        (LogprobsMode, knobs.LOGPROBS_MODES),
        (LogprobSemantics, knobs.LOGPROB_SEMANTICS),
        (LmHeadDtype, knobs.LM_HEAD_DTYPES),
        (SyncPush, knobs.WEIGHT_SYNCS),
    ],
)
def test_each_enum_is_its_knobs_value_set(enum_type: type[enum.Enum], choices: tuple[str]) -> None:
    assert [e.value for e in enum_type] == list(choices)


def test_a_case_that_names_nothing_runs_with_the_catalogs_defaults() -> None:
    execution_plan = plan_file(str(S1))
    ec = execution_plan.cases[0]
    binding = bind_case(
        ec, runtime_kind="vllm-hf", identity=execution_plan.plan.identity, device="cpu"
    )
    assert "lm_head_dtype" not in binding.rollout  # not named: not sealed, not hashed
    assert binding.rollout_settings == RolloutSettings(
        tensor_parallel_size=1,
        context_parallel_size=1,
        dtype=DType(ec.case.requested["rollout.dtype"]),
        enable_prefix_caching=bool(ec.case.requested["rollout.enable_prefix_caching"]),
        enforce_eager=True,
        logprobs_mode=LogprobsMode.RAW_LOGPROBS,
        lm_head_dtype=LmHeadDtype.COMPUTE,
        weight_sync=WeightSync(push=SyncPush.CHECKPOINT),
        expert_parallel=False,
    )
    assert binding.training_settings == TrainingSettings(
        attention_backend=AttentionBackend(ec.case.requested["training.attention_backend"]),
        compute_dtype=DType(ec.case.requested["training.compute_dtype"]),
        sharding=Sharding.NONE,
        logprob_semantics=LogprobSemantics.RAW,
        lm_head_dtype=LmHeadDtype.COMPUTE,
        moe_routing=MoeRouting(),
        router_dtype=RouterDtype.MODEL,
    )
    assert binding.request_settings.batch_size == ec.case.requested["batch.size"]
    assert binding.request_settings.logp_backend == "native"
    # The sealed form is the binding without its typed settings.
    sealed = binding.sealed()
    assert not {"rollout_settings", "training_settings", "request_settings"} & set(sealed)
    assert sealed["rollout"] == dict(binding.rollout)
    with pytest.raises(dataclasses.FrozenInstanceError):
        binding.rollout_settings.dtype = DType.FLOAT16  # type: ignore[misc]


def test_named_values_are_typed() -> None:
    by_label = {ec.case.label: ec for ec in plan_file(str(S1)).cases}
    identity = plan_file(str(S1)).plan.identity

    def settings(label: str) -> RuntimeBinding:
        return bind_case(by_label[label], runtime_kind="vllm-hf", identity=identity, device="cpu")

    tp = settings("rollout.tensor_parallel_size=2").rollout_settings
    assert tp.tensor_parallel_size == 2 and type(tp.tensor_parallel_size) is int
    fsdp = settings("training.sharding=fsdp").training_settings
    assert fsdp.sharding is Sharding.FSDP and fsdp.sharded
    bf16 = settings("rollout.dtype=bfloat16").rollout_settings
    assert bf16.dtype is DType.BFLOAT16


def test_a_catalog_and_a_settings_class_that_disagree_are_refused() -> None:
    ec = plan_file(str(S0)).cases[0]
    identity = plan_file(str(S0)).plan.identity
    catalog = {**KNOBS, EXTRA.knob.path: EXTRA}
    with pytest.raises(TypeError, match="speculative_tokens"):
        bind_case(ec, runtime_kind="cpu-smoke", identity=identity, device="cpu", catalog=catalog)


EXTRA = KnobSpec(
    knob=Knob(
        path="rollout.speculative_tokens",
        lifecycle=Lifecycle.ENGINE_CONSTRUCTION,
        meaning="Test-only: draft tokens a speculative rollout proposes per step.",
    ),
    normalize=KNOBS["rollout.tensor_parallel_size"].normalize,
    side=Side.ROLLOUT,
    default=1,
)
"""A knob no production module knows: one catalog entry..."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SpeculativeRolloutSettings(RolloutSettings):
    """... plus one field."""

    speculative_tokens: int


class SpeculativeRollout(SyntheticRollout):
    """The synthetic rollout, reading the new field back as its engine's word."""

    def __init__(self, binding: RuntimeBinding) -> None:
        super().__init__(binding)
        settings = binding.rollout_settings
        assert isinstance(settings, SpeculativeRolloutSettings)
        self.speculative_tokens = settings.speculative_tokens

    def read_back(self) -> Mapping[str, JSONScalar]:
        return {**super().read_back(), EXTRA.knob.path: self.speculative_tokens}


class SpeculativeSmokeAdapter(CpuSmokeAdapter):
    """The synthetic runtime, applying the new knob."""

    def __init__(self) -> None:
        self.built: list[Any] = []

    def materialize(self, requested: Mapping[str, KnobValue]) -> Mapping[str, Materialized]:
        result = dict(super().materialize(requested))
        if EXTRA.knob.path in requested:
            result[EXTRA.knob.path] = Materialized(
                value=requested[EXTRA.knob.path],
                status=ApplicationStatus.APPLIED,
                evidence="test-only: read from the rollout settings",
            )
        return result

    def build_rollout(self, binding: RuntimeBinding, identity: ScoringIdentity) -> SyntheticRollout:
        self.built.append(binding.rollout_settings)
        self._check_identity(identity)
        return SpeculativeRollout(binding)


def test_a_knob_added_in_a_test_reaches_the_engine_as_a_typed_attribute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test-only catalog entry and a settings subclass, both defined here: planned from a
    config, bound once, handed to ``RuntimeAdapter.build_rollout`` as an attribute of the
    settings object, applied and read back, with no edit to a production module."""
    monkeypatch.setitem(KNOBS, EXTRA.knob.path, EXTRA)  # the catalog entry, for this test
    document: dict[str, Any] = json.loads(S0.read_text())
    document["baseline"]["rollout"]["speculative_tokens"] = 1
    document["interventions"] = [{"path": "rollout.speculative_tokens", "values": [3]}]
    config = tmp_path / "speculative.json"
    config.write_text(json.dumps(document))
    execution_plan = plan_file(str(config))
    assert not execution_plan.has_errors, execution_plan.issues
    catalogs = assemble()
    adapter = SpeculativeSmokeAdapter()
    with Runner(
        execution_plan,
        runtime="cpu-smoke",
        runtimes=catalogs.runtimes,
        catalog=catalogs.operators,
        artifacts=tmp_path / "artifacts",
        allow_test_only=True,
        adapter=adapter,
        settings=SettingsTypes(rollout=SpeculativeRolloutSettings),
    ) as runner:
        results = {r.label: r for r in runner.run()}
    assert [s.speculative_tokens for s in adapter.built] == [1, 3]
    assert all(isinstance(s, SpeculativeRolloutSettings) for s in adapter.built)
    assert adapter.built[1].dtype is DType.FLOAT32  # the other fields as ever
    assert results["baseline"].outcome is Outcome.PASS
    assert results["rollout.speculative_tokens=3"].outcome is Outcome.PASS
    attempt = results["rollout.speculative_tokens=3"].attempt_dir
    assert attempt is not None
    requested = json.loads((attempt / "requested.json").read_text())
    assert requested["binding"]["rollout"]["speculative_tokens"] == 3  # named, so sealed
