"""The weight check of a mixture-of-experts model on the transformers side: transformers 5's
fused ``experts.gate_up_proj [E, 2I, H]`` / ``experts.down_proj`` are checked as the
checkpoint's per-expert tensors (through transformers' own reverse conversion), every tensor,
the router ``mlp.gate.weight`` included, against ``hashlib`` over the safetensors file's
tensors cast with plain torch (written here); a gate/up swap in one expert and a changed
router are named exactly."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_glm4_moe import save_tiny_glm4_moe

pytest.importorskip("transformers")

from pytest_logprob_drift.check.weights_check import differences
from pytest_logprob_drift.runtimes.tiny_model import TINY_MOE_ARCHITECTURES, resolve_checkpoint
from pytest_logprob_drift.runtimes.transformers.adapter import module_weights
from pytest_logprob_drift.runtimes.weights.module_digests import module_report
from pytest_logprob_drift.runtimes.weights.moe_experts import (
    FUSED_ON_BOTH,
    expert_index,
    expert_span,
)

PER_EXPERT = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")


def _sha(tensor: torch.Tensor) -> str:
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("name", [a.name for a in TINY_MOE_ARCHITECTURES])
def test_every_expert_half_and_the_router_is_checked(name: str) -> None:
    from transformers import AutoModelForCausalLM

    path = resolve_checkpoint(f"tiny://{name}", expected_digest=None).path
    stored: dict[str, torch.Tensor] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        stored.update(load_file(str(file)))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    report = module_report(model, set(stored))
    experts = {n for n in stored if PER_EXPERT.match(n)}
    assert len(experts) == 2 * 4 * 3  # layers x experts x projections
    assert {"model.layers.0.mlp.gate.weight", "model.layers.1.mlp.gate.weight"} <= set(stored)
    assert set(report["tensors"]) == set(stored)
    for tensor_name, tensor in stored.items():
        assert report["tensors"][tensor_name]["sha256"] == _sha(tensor.to(torch.bfloat16)), (
            tensor_name
        )
    fused = {
        f"model.layers.{i}.mlp.experts.{p}" for i in range(2) for p in ("gate_up_proj", "down_proj")
    }
    assert {n for n, r in report["skipped"].items() if r == FUSED_ON_BOTH} == fused
    assert report["extra"] == {}
    document = module_weights(
        model, path, side="training", dtype="bfloat16", lm_head_dtype="bfloat16"
    )
    assert document.refused is None
    assert differences(document) == []
    assert {t.name for t in document.tensors} == set(stored)
    # expert 2 of layer 1 holding [up; gate] (NeMo-RL#2586's class): both halves named
    experts_module = model.model.layers[1].mlp.experts
    with torch.no_grad():
        half = experts_module.gate_up_proj.shape[1] // 2
        gate_up = experts_module.gate_up_proj[2].clone()
        experts_module.gate_up_proj[2] = torch.cat([gate_up[half:], gate_up[:half]])
        model.model.layers[0].mlp.gate.weight[0, 0] += 1.0
    changed = module_weights(
        model, path, side="training", dtype="bfloat16", lm_head_dtype="bfloat16"
    )
    assert sorted((d.name, d.kind) for d in differences(changed)) == [
        ("model.layers.0.mlp.gate.weight", "values"),
        ("model.layers.1.mlp.experts.2.gate_proj.weight", "values"),
        ("model.layers.1.mlp.experts.2.up_proj.weight", "values"),
    ]


def test_expert_spans_per_rank_gate_then_up() -> None:
    """The arithmetic of vLLM's w13/w2 per rank, against the loader's own rule written here:
    rank r holds gate rows [r*I/TP, (r+1)*I/TP) first, then the same up rows; w2 columns."""
    for tp in (1, 2, 4):
        local = 64 // tp
        for rank in range(tp):
            gate = expert_span("w1", expert=3, local=local, checkpoint=64, tp_size=tp, tp_rank=rank)
            up = expert_span("w3", expert=3, local=local, checkpoint=64, tp_size=tp, tp_rank=rank)
            down = expert_span("w2", expert=3, local=local, checkpoint=64, tp_size=tp, tp_rank=rank)
            assert (gate.local_dim, gate.local_start, gate.local_stop) == (0, 0, local)
            assert (up.local_dim, up.local_start, up.local_stop) == (0, local, 2 * local)
            assert (down.local_dim, down.local_start, down.local_stop) == (1, 0, local)
            for span in (gate, up, down):
                assert (span.start, span.stop, span.expert) == (rank * local, (rank + 1) * local, 3)
            assert (gate.dim, up.dim, down.dim) == (0, 0, 1)
    with pytest.raises(ValueError, match="not an even split"):
        expert_span("w1", expert=0, local=32, checkpoint=48, tp_size=2, tp_rank=0)
    with pytest.raises(ValueError, match="no expert shard 'w4'"):
        expert_span("w4", expert=0, local=32, checkpoint=64, tp_size=2, tp_rank=0)
    assert expert_index("model.layers.1.mlp.experts.13.up_proj.weight") == 13
    assert expert_index("model.layers.1.mlp.experts.gate_up_proj") is None


def test_a_refit_pushing_one_expert_from_the_previous_policy_is_named_exactly(
    tmp_path: Path,
) -> None:
    """The planted ``refit_stale_expert`` (checked offline: a pushed case needs its own vLLM
    engine, and the module-scoped engine run of ``test_moe_vllm.py`` has none to spare): the
    trainer's state with expert 1 of layer 0 replaced by the previous policy's (what the
    refit's first push left in the engine, recomputed here with the seeded perturbation); the
    pushed tensors, loaded as a checkpoint into a fresh module, are named by the digest
    differences exactly: that expert's gate, up and down, as the rollout side, nothing else."""
    from transformers import AutoModelForCausalLM

    from pytest_logprob_drift.execute.side_settings import SyncPush, WeightSync
    from pytest_logprob_drift.plan.planted_sync import STALE_EXPERT
    from pytest_logprob_drift.runtimes import weight_push

    setting = WeightSync.from_knob("planted:refit_stale_expert")
    assert setting.push is SyncPush.TRAINER_REFIT and setting.planted is not None
    assert set(STALE_EXPERT) == {
        f"model.layers.0.mlp.experts.1.{p}_proj.weight" for p in ("gate", "up", "down")
    }
    path = resolve_checkpoint("tiny://qwen3-moe-h128-v1", expected_digest=None).path
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    state = weight_push.gathered_state(model)
    pushed, skipped = weight_push.planted_state(state, setting.planted)
    assert skipped == ()
    assert set(pushed) == set(state)
    changed = {n for n in state if not torch.equal(pushed[n], state[n])}
    assert changed == set(STALE_EXPERT)
    # the previous policy written here: t + 0.05 * std(t) * n, n drawn in float32 in state
    # order from the seeded generator, one draw per tensor group (no ties in this build)
    generator = torch.Generator().manual_seed(20261202)
    for name, tensor in state.items():
        wide = tensor.to(torch.float32)
        noise = torch.randn(wide.shape, generator=generator, dtype=torch.float32)
        if name in STALE_EXPERT:
            previous = (wide + 0.05 * float(wide.std()) * noise).to(tensor.dtype)
            assert torch.equal(pushed[name], previous), name
    # what the engine holds after the push, as a checkpoint a fresh module loads
    held = tmp_path / "held"
    held.mkdir()
    for file in Path(path).iterdir():
        if file.is_file() and file.suffix != ".safetensors":
            (held / file.name).write_bytes(file.read_bytes())
    copies = {n: t.clone().contiguous() for n, t in pushed.items()}
    save_file(copies, str(held / "model.safetensors"))
    engine = AutoModelForCausalLM.from_pretrained(held, dtype=torch.bfloat16)
    document = module_weights(
        engine, path, side="rollout", dtype="bfloat16", lm_head_dtype="bfloat16"
    )
    assert document.side == "rollout"
    assert sorted((d.name, d.kind) for d in differences(document)) == sorted(
        (n, "values") for n in STALE_EXPERT
    )
    for name in STALE_EXPERT:
        (tensor,) = [t for t in document.tensors if t.name == name]
        assert tensor.side == _sha(pushed[name]) != _sha(state[name])


def test_a_glm4_moe_router_bias_is_checked_in_its_own_float32(tmp_path: Path) -> None:
    """transformers 5's ``Glm4MoeForCausalLM`` keeps ``mlp.gate.e_score_correction_bias`` as a
    float32 buffer in a bfloat16 model (its class declares it ``_keep_in_fp32_modules_strict``):
    it is digested and declared float32 (a bfloat16 declaration would flag every GLM4-MoE run),
    each digest recomputed here from the safetensors file; the bias pushed with its initial
    value (zeros: verl#5801's class) is named on each layer, nothing else. A tiny GLM4-MoE is
    built here with transformers alone (seeded, not a catalog build: no vLLM engine runs it)."""
    from transformers import Glm4MoeForCausalLM

    save_tiny_glm4_moe(tmp_path, vocab_size=256, bias_scale=0.1)
    stored = load_file(str(tmp_path / "model.safetensors"))
    biases = {n for n in stored if n.endswith("mlp.gate.e_score_correction_bias")}
    assert biases == {f"model.layers.{i}.mlp.gate.e_score_correction_bias" for i in range(2)}
    model = Glm4MoeForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    document = module_weights(
        model, tmp_path, side="training", dtype="bfloat16", lm_head_dtype="bfloat16"
    )
    assert document.refused is None
    assert differences(document) == []
    tensors = {t.name: t for t in document.tensors}
    assert set(tensors) == set(stored)
    for name, tensor in stored.items():
        own = torch.float32 if name in biases else torch.bfloat16
        assert tensors[name].side == tensors[name].checkpoint == _sha(tensor.to(own)), name
    assert {n for n, t in tensors.items() if t.dtype == "float32"} == biases
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.e_score_correction_bias.zero_()
    pushed = module_weights(
        model, tmp_path, side="rollout", dtype="bfloat16", lm_head_dtype="bfloat16"
    )
    assert sorted((d.name, d.kind) for d in differences(pushed)) == sorted(
        (n, "values") for n in biases
    )
