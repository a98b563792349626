"""``training.moe_routing`` and ``training.router_dtype`` in planning and the runner: their
values and aliases, off unless named (the MoE experiment's other cases keep their ids), the
replay and float32 cases share the baseline's rollout engine, a planted routing needs the
test-only authorization and an unknown one is refused at planning, and FSDP refuses them.

No engine starts here; the routers' side is in ``tests/runtimes/test_moe_router_knobs.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from drift_testing import EXPERIMENTS, cli, experiment_config

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.execute.protocol import bind_case
from pytest_logprob_drift.execute.side_settings import MoeRouting, RouterDtype
from pytest_logprob_drift.plan.binding import router_knobs_refusal
from pytest_logprob_drift.plan.knobs import KNOBS, InvalidKnobValue, Side, canonical_path
from pytest_logprob_drift.plan.planted_routing import ROUTING_VARIANTS, routing_variant
from pytest_logprob_drift.records import Lifecycle

MOE = "cross_config_s1_vllm_cpu_moe_bf16.json"


def test_the_knobs_their_values_and_aliases() -> None:
    routing, dtype = KNOBS["training.moe_routing"], KNOBS["training.router_dtype"]
    for spec in (routing, dtype):
        assert spec.knob.lifecycle is Lifecycle.REQUEST
        assert spec.side is Side.TRAINING
    assert (routing.default, dtype.default) == ("natural", "model")
    assert routing.normalize(" Replay ") == "replay"
    assert routing.normalize("r3") == "replay"
    assert routing.normalize("planted:flip-layer-1") == "planted:flip-layer-1"
    assert dtype.normalize("fp32") == "float32"
    assert dtype.normalize("compute") == "model"
    assert canonical_path("training.routing_replay") == "training.moe_routing"
    assert canonical_path("training.moe_router_dtype") == "training.router_dtype"
    with pytest.raises(InvalidKnobValue, match="natural, replay"):
        routing.normalize("sticky")
    with pytest.raises(InvalidKnobValue, match=r"no planted routing variant 'nope'.*flip-layer-1"):
        routing.normalize("planted:nope")
    with pytest.raises(InvalidKnobValue, match="model, float32"):
        dtype.normalize("bfloat16")
    with pytest.raises(ValueError, match=r"no planted routing variant 'nope'"):
        routing_variant("nope")
    assert MoeRouting.from_knob("natural").natural
    assert MoeRouting.from_knob("replay").replay
    planted = MoeRouting.from_knob("planted:flip-layer-1")
    assert planted.planted is ROUTING_VARIANTS["flip-layer-1"]
    assert planted.planted.flip_layer == 1 and planted.knob_value == "planted:flip-layer-1"


def test_off_unless_named_and_the_rollout_engine_is_shared(tmp_path: Path) -> None:
    """A config that does not name the knobs plans what it did (the other shipped
    experiments' plans are pinned byte for byte: ``test_sealed_bytes_across_issue49``); the
    shipped MoE experiment names both in its baseline and as interventions, and both
    training-side cases reuse the baseline's rollout engine."""
    shipped = json.loads((EXPERIMENTS / MOE).read_text())
    knobs = {"training.moe_routing", "training.router_dtype"}
    assert {i["path"] for i in shipped["interventions"]} >= knobs
    assert shipped["baseline"]["training"]["moe_routing"] == "natural"
    assert shipped["baseline"]["training"]["router_dtype"] == "model"
    training = {
        k: v for k, v in shipped["baseline"]["training"].items() if f"training.{k}" not in knobs
    }
    interventions = [i for i in shipped["interventions"] if i["path"] not in knobs]
    without = experiment_config(
        tmp_path,
        MOE,
        {"baseline.training": training, "interventions": interventions},
    )
    unnamed = plan_file(str(without))
    for ec in unnamed.cases:
        assert not knobs & set(ec.case.requested), ec.case.label
    # Naming the defaults in the baseline is hashed (like any named field), nothing else is.
    named_defaults = experiment_config(
        tmp_path, MOE, {"interventions": interventions}, file_name="named.json"
    )
    assert {ec.case.label for ec in plan_file(str(named_defaults)).cases} == {
        ec.case.label for ec in unnamed.cases
    }
    execution_plan = plan_file(str(EXPERIMENTS / MOE))
    now = {ec.case.label: ec for ec in execution_plan.cases}
    assert set(now) == {ec.case.label for ec in unnamed.cases} | {
        "training.moe_routing=replay",
        "training.router_dtype=float32",
    }
    identity = execution_plan.plan.identity
    bound = {
        label: bind_case(ec, runtime_kind="vllm-hf", identity=identity, device="cpu")
        for label, ec in now.items()
    }
    base = bound["baseline"]
    assert base.training_settings.moe_routing == MoeRouting()
    assert base.training_settings.router_dtype is RouterDtype.MODEL
    for label in ("training.moe_routing=replay", "training.router_dtype=float32"):
        assert bound[label].rollout_construction_fingerprint == (
            base.rollout_construction_fingerprint
        )
    assert bound["training.moe_routing=replay"].training_settings.moe_routing.replay
    assert bound["training.router_dtype=float32"].training_settings.router_dtype is (
        RouterDtype.FLOAT32
    )


def test_fsdp_refuses_the_router_knobs_at_planning() -> None:
    assert router_knobs_refusal({"training.moe_routing": "replay"}) is None
    assert router_knobs_refusal({"training.sharding": "fsdp"}) is None
    assert (
        router_knobs_refusal({"training.sharding": "fsdp", "training.router_dtype": "model"})
        is None
    )
    why = router_knobs_refusal(
        {
            "training.sharding": "fsdp",
            "training.moe_routing": "replay",
            "training.router_dtype": "float32",
        }
    )
    assert why is not None
    assert "training.moe_routing=replay, training.router_dtype=float32" in why
    assert "FSDP ranks" in why


def test_the_fsdp_pair_is_not_executable_in_the_plan(tmp_path: Path) -> None:
    config = experiment_config(
        tmp_path,
        MOE,
        {
            "experiment_id": "moe-fsdp-pair",
            "strategy": "pairwise",
            "interventions": [
                {"path": "training.sharding", "values": ["fsdp"]},
                {"path": "training.moe_routing", "values": ["replay"]},
            ],
            "pairs": [["training.sharding", "training.moe_routing"]],
        },
    )
    code, out, err = cli("plan", config, "--json")
    assert code == 0, err
    rows = {row["label"]: row for row in json.loads(out)["cases"]}
    pair = "training.sharding=fsdp,training.moe_routing=replay"
    assert rows[pair]["executable_by"] == []
    for label in ("baseline", "training.sharding=fsdp", "training.moe_routing=replay"):
        assert rows[label]["executable_by"] == ["vllm-hf"], label
    code, out, err = cli("plan", config)
    assert code == 0, err
    assert f"note: not executable by vllm-hf ({pair}): " in out
    assert "the rollout's expert ids do not reach the FSDP ranks" in out


def test_a_planted_routing_needs_the_test_only_authorization(tmp_path: Path) -> None:
    config = experiment_config(
        tmp_path,
        MOE,
        {
            "experiment_id": "moe-planted",
            "interventions": [{"path": "training.moe_routing", "values": ["planted:flip-layer-1"]}],
        },
    )
    code, _out, err = cli("run", config, "--runtime", "vllm-hf", "--artifacts", tmp_path / "a")
    assert code == 2
    assert "training.moe_routing=planted:flip-layer-1" in err
    assert "--allow-smoke-operators" in err
    assert "Traceback" not in err
    assert not any((tmp_path / "a").rglob("score_*.pt"))


def test_plan_refuses_an_unknown_planted_routing(tmp_path: Path) -> None:
    config = experiment_config(
        tmp_path,
        MOE,
        {"interventions": [{"path": "training.moe_routing", "values": ["planted:nope"]}]},
    )
    code, out, err = cli("plan", config)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "no planted routing variant 'nope'" in lines[0] and "$.interventions" in lines[0]
    assert "Traceback" not in err


@pytest.mark.slow
def test_each_runtime_states_the_router_knobs() -> None:
    pytest.importorskip("vllm")
    from pytest_logprob_drift.records import ApplicationStatus
    from pytest_logprob_drift.runtimes.smoke.runtime import CpuSmokeAdapter
    from pytest_logprob_drift.runtimes.transformers.adapter import HfAdapter
    from pytest_logprob_drift.runtimes.vllm.adapter import VllmHfAdapter

    for adapter in (HfAdapter(), VllmHfAdapter()):
        states = adapter.materialize(
            {"training.moe_routing": "replay", "training.router_dtype": "float32"}
        )
        assert states["training.moe_routing"].status is ApplicationStatus.APPLIED
        assert "rollout's expert ids" in states["training.moe_routing"].evidence
        assert "float32" in states["training.router_dtype"].evidence
        planted = adapter.materialize({"training.moe_routing": "planted:flip-layer-1"})
        assert "planted" in planted["training.moe_routing"].evidence
    smoke = CpuSmokeAdapter().materialize({"training.moe_routing": "replay"})
    assert smoke["training.moe_routing"].status is not ApplicationStatus.APPLIED


@pytest.mark.slow
def test_expert_parallel_is_planned_not_executable_on_cpu_with_the_reason(tmp_path: Path) -> None:
    """``rollout.expert_parallel`` (process lifecycle): a case that names it true on cpu is
    plan-only with the probe's reason; not named, it is in no process fingerprint (every
    other case keeps its own); the vLLM and transformers runtimes state it."""
    pytest.importorskip("vllm")
    from pytest_logprob_drift.plan.binding import EXPERT_PARALLEL_ON_CPU
    from pytest_logprob_drift.records import ApplicationStatus
    from pytest_logprob_drift.runtimes.transformers.adapter import HfAdapter
    from pytest_logprob_drift.runtimes.vllm.adapter import VllmHfAdapter

    spec = KNOBS["rollout.expert_parallel"]
    assert spec.knob.lifecycle is Lifecycle.PROCESS and spec.default is False
    assert canonical_path("rollout.ep") == "rollout.expert_parallel"
    config = experiment_config(
        tmp_path,
        MOE,
        {
            "experiment_id": "moe-ep",
            "baseline.rollout.tensor_parallel_size": 2,
            "baseline.rollout.expert_parallel": False,
            "interventions": [{"path": "rollout.expert_parallel", "values": [True]}],
        },
    )
    code, out, err = cli("plan", config, "--json")
    assert code == 0, err
    rows = {row["label"]: row for row in json.loads(out)["cases"]}
    assert rows["rollout.expert_parallel=true"]["executable_by"] == []
    assert rows["baseline"]["executable_by"] == ["vllm-hf"]
    code, out, err = cli("plan", config)
    assert EXPERT_PARALLEL_ON_CPU in out and "cpu_fused_moe" in out
    # Not named: no process fingerprint holds it (the MoE baseline's fingerprints are those
    # of the same case planned with the knob removed from the catalog's process knobs).
    execution_plan = plan_file(str(EXPERIMENTS / MOE))
    base = next(ec for ec in execution_plan.cases if ec.case.label == "baseline")
    identity = execution_plan.plan.identity
    bound = bind_case(base, runtime_kind="vllm-hf", identity=identity, device="cpu")
    without = {k: v for k, v in KNOBS.items() if k != "rollout.expert_parallel"}
    from dataclasses import make_dataclass, replace
    from typing import get_type_hints

    from pytest_logprob_drift.execute.side_settings import SETTINGS_TYPES, RolloutSettings

    hints = get_type_hints(RolloutSettings)
    assert "expert_parallel" in hints
    before = make_dataclass(  # the rollout settings as they were before the knob
        "_Rollout",
        [(name, hint) for name, hint in hints.items() if name != "expert_parallel"],
        frozen=True,
        kw_only=True,
    )
    old = bind_case(
        base,
        runtime_kind="vllm-hf",
        identity=identity,
        device="cpu",
        catalog=without,
        settings=replace(SETTINGS_TYPES, rollout=before),
    )
    assert bound.process_fingerprint == old.process_fingerprint
    assert bound.rollout_construction_fingerprint == old.rollout_construction_fingerprint
    vllm = VllmHfAdapter().materialize({"rollout.expert_parallel": True})
    assert vllm["rollout.expert_parallel"].status is not ApplicationStatus.APPLIED
    hf = HfAdapter().materialize({"rollout.expert_parallel": False})
    assert hf["rollout.expert_parallel"].status is ApplicationStatus.APPLIED
