"""``rollout.weight_sync``: the knob, its planted (test-only) values, how each runtime declares
it, the push's chunks, and that naming it changes no existing case id.

No engine starts here; the engines' side is in ``tests/runtimes/test_weight_sync_vllm.py``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import S0_HF, S1, cli
from tiny_glm4_moe import tiny_glm4_moe

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.execute.protocol import bind_case
from pytest_logprob_drift.execute.side_settings import SyncPush, WeightSync
from pytest_logprob_drift.plan.knobs import KNOBS, InvalidKnobValue, Side, canonical_path
from pytest_logprob_drift.plan.planted_sync import SYNC_VARIANTS, sync_variant
from pytest_logprob_drift.records import ApplicationStatus, Lifecycle
from pytest_logprob_drift.runtimes import weight_push
from pytest_logprob_drift.tensorio import tensors_from_bytes

WEIGHT_SYNC = Path(__file__).resolve().parents[1] / "experiments"
SHIPPED = WEIGHT_SYNC / "cross_config_s1_vllm_cpu_weight_sync.json"


def test_the_knob_its_values_and_aliases() -> None:
    spec = KNOBS["rollout.weight_sync"]
    assert spec.knob.lifecycle is Lifecycle.ENGINE_CONSTRUCTION
    assert canonical_path("rollout.weights") == "rollout.weight_sync"
    assert spec.normalize("Checkpoint") == "checkpoint"
    assert spec.normalize("push") == "trainer"
    assert spec.normalize("refit") == "trainer_refit"
    assert spec.normalize("planted:stale_tensor") == "planted:stale_tensor"
    with pytest.raises(InvalidKnobValue, match="checkpoint, trainer, trainer_refit"):
        spec.normalize("nccl")
    with pytest.raises(InvalidKnobValue, match="planted:NAME"):
        spec.normalize("planted:not a name")
    with pytest.raises(InvalidKnobValue):
        spec.normalize(True)
    assert spec.side is Side.ROLLOUT


def _s1(tmp_path: Path, edit: Any) -> Path:
    document: dict[str, Any] = copy.deepcopy(json.loads(S1.read_text()))
    edit(document)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(document))
    return path


def test_a_config_that_names_it_plans_it_and_push_cases_depend_on_the_trainer(
    tmp_path: Path,
) -> None:
    """Configs without the field keep their case ids (``test_sampling_semantics`` pins the
    shipped ones); one that names it plans it, and only its push cases' rollout engines are
    built from the training side too."""
    shipped = {ec.case.label: ec.case.case_id for ec in plan_file(str(S1)).cases}

    def add(document: dict[str, Any]) -> None:
        document["baseline"]["rollout"]["weight_sync"] = "checkpoint"
        document["interventions"].append(
            {"path": "rollout.weight_sync", "values": ["trainer", "trainer_refit"]}
        )

    execution_plan = plan_file(str(_s1(tmp_path, add)))
    assert not execution_plan.has_errors
    by_label = {ec.case.label: ec for ec in execution_plan.cases}
    assert set(by_label) == set(shipped) | {
        "rollout.weight_sync=trainer",
        "rollout.weight_sync=trainer_refit",
    }
    assert by_label["baseline"].case.case_id != shipped["baseline"]  # a named field is hashed
    identity = execution_plan.plan.identity
    bindings = {
        label: bind_case(ec, runtime_kind="vllm-hf", identity=identity, device="cpu")
        for label, ec in by_label.items()
    }
    base, push = bindings["baseline"], bindings["rollout.weight_sync=trainer"]
    assert base.rollout["weight_sync"] == "checkpoint"
    assert push.rollout["weight_sync"] == "trainer"
    assert push.rollout_construction_fingerprint != base.rollout_construction_fingerprint
    assert push.training_construction_fingerprint == base.training_construction_fingerprint
    # The checkpoint rollout serves an FSDP trainer too; a pushed one is built per trainer.
    fsdp = bindings["training.sharding=fsdp"]
    assert fsdp.rollout_construction_fingerprint == base.rollout_construction_fingerprint


def test_the_shipped_experiment_plans_every_push_pair() -> None:
    code, out, err = cli("plan", SHIPPED, "--pairwise")
    assert code == 0, err
    labels = {ec.case.label for ec in plan_file(str(SHIPPED), pairwise=True).cases}
    for sync in ("trainer", "trainer_refit"):
        assert f"rollout.weight_sync={sync}" in labels
        assert f"rollout.tensor_parallel_size=2,rollout.weight_sync={sync}" in labels
        assert f"training.sharding=fsdp,rollout.weight_sync={sync}" in labels
        assert f"rollout.dtype=bfloat16,rollout.weight_sync={sync}" in labels
    assert "12 case(s)" in out


def test_a_planted_variant_needs_the_test_only_authorization(tmp_path: Path) -> None:
    def planted(document: dict[str, Any]) -> None:
        document["baseline"]["rollout"]["weight_sync"] = "checkpoint"
        document["interventions"] = [
            {"path": "rollout.weight_sync", "values": ["planted:stale_tensor"]}
        ]

    config = _s1(tmp_path, planted)
    code, _out, err = cli("run", config, "--runtime", "vllm-hf", "--artifacts", tmp_path / "a")
    assert code == 2
    assert "rollout.weight_sync=planted:stale_tensor" in err
    assert "--allow-smoke-operators" in err
    assert "Traceback" not in err
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").rglob("score_*.pt"))


def test_an_unknown_planted_variant_is_named() -> None:
    with pytest.raises(ValueError, match=r"no planted weight-sync variant 'nope'.*stale_tensor"):
        sync_variant("nope")
    spec = KNOBS["rollout.weight_sync"]
    with pytest.raises(InvalidKnobValue, match=r"no planted weight-sync variant 'nope'"):
        spec.normalize("planted:nope")


@pytest.mark.parametrize("where", ["baseline", "intervention"])
def test_plan_refuses_an_unknown_planted_variant(tmp_path: Path, where: str) -> None:
    """Refused at planning, one line naming the JSON path and the known variants, exit 2;
    ``run`` the same, before it writes anything."""

    def nope(document: dict[str, Any]) -> None:
        if where == "baseline":
            document["baseline"]["rollout"]["weight_sync"] = "planted:nope"
        else:
            document["baseline"]["rollout"]["weight_sync"] = "checkpoint"
            document["interventions"].append(
                {"path": "rollout.weight_sync", "values": ["trainer", "planted:nope"]}
            )

    config = _s1(tmp_path, nope)
    code, out, err = cli("plan", config)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "no planted weight-sync variant 'nope'" in lines[0]
    assert "stale_tensor" in lines[0]
    assert ("$.baseline.rollout.weight_sync" if where == "baseline" else "$.interventions") in (
        lines[0]
    )
    assert "Traceback" not in err
    code, _out, err = cli(
        "run",
        config,
        "--runtime",
        "vllm-hf",
        "--artifacts",
        tmp_path / "a",
        "--allow-smoke-operators",
    )
    assert code == 2
    assert "no planted weight-sync variant 'nope'" in err
    assert not (tmp_path / "a").exists()


def test_the_typed_setting_of_each_value() -> None:
    """``WeightSync`` from each value planning accepts: the push and the resolved variant,
    and the value it reads back as."""
    checkpoint = WeightSync.from_knob("checkpoint")
    assert checkpoint == WeightSync(push=SyncPush.CHECKPOINT)
    assert checkpoint.from_checkpoint and checkpoint.knob_value == "checkpoint"
    refit = WeightSync.from_knob("trainer_refit")
    assert refit.push is SyncPush.TRAINER_REFIT and refit.planted is None
    for name, variant in SYNC_VARIANTS.items():
        planted = WeightSync.from_knob(f"planted:{name}")
        assert planted.planted is variant
        assert planted.push is SyncPush(variant.push)
        assert not planted.from_checkpoint
        assert planted.knob_value == f"planted:{name}"


def test_runtimes_declare_it() -> None:
    pytest.importorskip("transformers")
    from pytest_logprob_drift.runtimes.transformers.adapter import HF_INHERENT, HfAdapter
    from pytest_logprob_drift.runtimes.vllm.adapter import VllmHfAdapter

    hf = HfAdapter()
    assert hf.materialize_rollout("rollout.weight_sync", "checkpoint").status is (
        ApplicationStatus.APPLIED
    )
    assert HF_INHERENT["rollout.weight_sync"] == "checkpoint"  # what its read-back reports
    for value in ("trainer", "trainer_refit"):
        refused = hf.materialize_rollout("rollout.weight_sync", value)
        assert refused.status is ApplicationStatus.UNSUPPORTED
        assert "no engine load path" in refused.evidence
    vllm = VllmHfAdapter()
    for value in ("checkpoint", "trainer", "trainer_refit", "planted:keep_prefix_cache"):
        m = vllm.materialize_rollout("rollout.weight_sync", value)
        assert m.status is ApplicationStatus.APPLIED, value
    trainer = vllm.materialize_rollout("rollout.weight_sync", "trainer")
    assert "load_format='dummy'" in trainer.evidence
    assert (
        "reset_prefix_cache"
        in vllm.materialize_rollout("rollout.weight_sync", "trainer_refit").evidence
    )


def test_the_hf_runtime_refuses_a_push_case_by_name(tmp_path: Path) -> None:
    def push(document: dict[str, Any]) -> None:
        document["baseline"]["rollout"]["weight_sync"] = "checkpoint"
        document["interventions"] = [{"path": "rollout.weight_sync", "values": ["trainer"]}]

    document: dict[str, Any] = copy.deepcopy(json.loads(S0_HF.read_text()))
    push(document)
    config = tmp_path / "hf.json"
    config.write_text(json.dumps(document))
    code, out, _err = cli("run", config, "--runtime", "hf", "--artifacts", tmp_path / "a", "--json")
    table = json.loads(out)
    rows = {row["label"]: row for row in table["results"]}
    assert rows["baseline"]["outcome"] == "PASS"
    refused = rows["rollout.weight_sync=trainer"]
    assert refused["outcome"] == "STRICT_REJECTED"
    assert "rollout.weight_sync='trainer': unsupported" in json.dumps(refused)
    assert code == 1


# --------------------------------------------------------------------------- the push's chunks


def _tied_state() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    embed = torch.randn(300, 64, generator=generator)
    return {
        "model.embed_tokens.weight": embed,
        "model.layers.0.mlp.down_proj.weight": torch.randn(64, 128, generator=generator),
        "model.layers.0.mlp.up_proj.weight": torch.randn(128, 64, generator=generator),
        "model.norm.weight": torch.ones(64),
        "lm_head.weight": embed,
    }


def test_chunks_keep_tied_tensors_together_cast_and_bounded() -> None:
    state = _tied_state()
    assert weight_push.tie_groups(state) == [
        ["model.embed_tokens.weight", "lm_head.weight"],
        ["model.layers.0.mlp.down_proj.weight"],
        ["model.layers.0.mlp.up_proj.weight"],
        ["model.norm.weight"],
    ]
    limit = 2 * 300 * 64 * 2  # the tied pair in bfloat16, nothing more
    chunks = list(weight_push.chunks(state, "bfloat16", limit=limit))
    assert chunks[0].names == ("model.embed_tokens.weight", "lm_head.weight")
    seen: dict[str, torch.Tensor] = {}
    for chunk in chunks:
        assert chunk.tensor_bytes <= limit
        tensors = tensors_from_bytes(chunk.payload)
        assert tuple(tensors) == chunk.names
        seen.update(tensors)
    assert sorted(seen) == sorted(state)
    for name, tensor in state.items():
        assert seen[name].dtype == torch.bfloat16
        assert torch.equal(seen[name], tensor.to(torch.bfloat16))
    assert weight_push.total_bytes(chunks) == sum(t.numel() * 2 for t in state.values())


def test_previous_policy_is_seeded_different_and_keeps_ties() -> None:
    state = _tied_state()
    one, two = weight_push.previous_policy(state), weight_push.previous_policy(state)
    for name in state:
        assert torch.equal(one[name], two[name])
        assert one[name].dtype == state[name].dtype
    assert one["lm_head.weight"] is one["model.embed_tokens.weight"]
    name = "model.layers.0.mlp.down_proj.weight"
    moved = one[name] - state[name]
    assert bool((moved != 0).all())
    spread = float(moved.std() / state[name].std())
    assert 0.5 * weight_push.PREVIOUS_POLICY_SCALE < spread < 2 * weight_push.PREVIOUS_POLICY_SCALE


def test_planted_states_get_exactly_their_bug() -> None:
    state = _tied_state()
    same, skipped = weight_push.planted_state(state, None)
    assert skipped == () and all(same[n] is state[n] for n in state)
    pushed, skipped = weight_push.planted_state(state, SYNC_VARIANTS["drop_tied_embedding"])
    assert skipped == ("model.embed_tokens.weight", "lm_head.weight")
    names = weight_push.names_of(list(weight_push.chunks(pushed, "float32", skip=skipped)))
    assert "model.embed_tokens.weight" not in names and "lm_head.weight" not in names
    pushed, _ = weight_push.planted_state(state, SYNC_VARIANTS["through_float16"])
    for name, tensor in state.items():
        assert torch.equal(pushed[name], tensor.to(torch.float16).to(torch.float32))
    assert not torch.equal(
        pushed["model.layers.0.mlp.up_proj.weight"], state["model.layers.0.mlp.up_proj.weight"]
    )
    pushed, _ = weight_push.planted_state(state, SYNC_VARIANTS["stale_tensor"])
    differs = [n for n in state if not torch.equal(pushed[n], state[n])]
    assert differs == ["model.layers.0.mlp.down_proj.weight"]
    before = weight_push.previous_policy(state)
    assert torch.equal(pushed[differs[0]], before[differs[0]])
    with pytest.raises(KeyError, match="not in the state"):
        weight_push.planted_state({"x": torch.ones(2)}, SYNC_VARIANTS["stale_tensor"])


def test_the_router_bias_is_pushed_with_its_initial_value_on_every_layer() -> None:
    """``router_bias_initial``: every layer's ``mlp.gate.e_score_correction_bias`` is pushed as
    zeros in its own dtype, which is what transformers' GLM4-MoE router holds before training
    (a fresh tiny one built here); nothing else changes; a state without one is refused."""
    pytest.importorskip("transformers")
    fresh = tiny_glm4_moe(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, head_dim=16
    )
    state = weight_push.gathered_state(fresh)
    biases = sorted(n for n in state if n.endswith("mlp.gate.e_score_correction_bias"))
    assert biases == [f"model.layers.{i}.mlp.gate.e_score_correction_bias" for i in range(2)]
    initial = {n: state[n].clone() for n in biases}  # before any training
    for i, name in enumerate(biases):  # "trained": any other value
        state[name] = torch.full_like(state[name], 0.25 * (i + 1))
    pushed, skipped = weight_push.planted_state(state, SYNC_VARIANTS["router_bias_initial"])
    assert skipped == ()
    assert sorted(n for n in state if not torch.equal(pushed[n], state[n])) == biases
    for name in biases:
        assert pushed[name].dtype == state[name].dtype == torch.float32
        assert torch.equal(pushed[name], initial[name])
        assert not bool(pushed[name].any())
    with pytest.raises(KeyError, match=r"\*\.mlp\.gate\.e_score_correction_bias"):
        weight_push.planted_state({"x": torch.ones(2)}, SYNC_VARIANTS["router_bias_initial"])


# --------------------------------------------------------------------------- the report's words


def test_the_report_says_how_pushed_weights_arrived() -> None:
    from pytest_logprob_drift.report.findings import weights_fact

    arrived = {"enable_prefix_caching": True, "prefix_cache_reset": False}
    stale = weights_fact(
        {
            "rollout.weight_sync": "trainer_refit",
            "vllm.weights_arrived": {"weight_sync": "trainer", **arrived},
            "vllm.prompt_tokens_cached": 256,
        }
    )
    assert stale == (
        "pushed from the trainer (trainer_refit); prefix cache NOT reset after the push; 256 "
        "prompt tokens of the scored rollout read from the prefix cache, blocks computed "
        "before the push: stale cached state, not the weights"
    )
    arrived["prefix_cache_reset"] = True
    fresh = weights_fact(
        {
            "rollout.weight_sync": "trainer",
            "vllm.weights_arrived": {"weight_sync": "trainer", **arrived},
            "vllm.prompt_tokens_cached": 0,
        }
    )
    assert fresh == "pushed from the trainer (trainer); prefix cache reset after the push"
    assert weights_fact({"rollout.weight_sync": "checkpoint"}) is None
    assert weights_fact({}) is None
    nothing = weights_fact({"rollout.weight_sync": "trainer", "vllm.weights_arrived": {}})
    assert nothing == "pushed from the trainer (trainer)"
