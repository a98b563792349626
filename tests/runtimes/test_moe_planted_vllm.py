"""The planted MoE weight-sync bugs on a real vLLM engine (issue 59), one sealed run shared by
every test here: the tiny Qwen3-MoE in bfloat16 on both sides at TP 1, the checkpoint-loaded
baseline beside two planted pushes (test-only, ``--allow-smoke-operators``): expert 2 of layer 1
pushed as ``[up; gate]`` and, in a refit, expert 1 of layer 0 pushed from the previous policy.
Each is INVALID_IDENTITY naming the tensor, the expert and the side; the identity check refuses
the verdict but not the scores, so each case still seals both sides' scores (token_diffs.pt)
and the numerical re-check (comparison.json's ``numerical``): the drift each bug causes is
measured from them here (max and mean |diff|, mismatches / active, token ESS, each recomputed in
float64 in this file) and is larger than the baseline's. Three engine starts (the baseline and
one per push). A second run (three more engine starts) on a tiny GLM4-MoE built here: vLLM's
CPU build runs it, the router bias pushed with its initial value (zeros) moves the scores
further than the checkpoint-loaded baseline, and the digests after a push (a correct trainer
push and the planted one) are of the router bias the engine computes with.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import EXPERIMENTS, cli, experiment_config, skip_unless_installed
from tiny_glm4_moe import save_tiny_glm4_moe

from pytest_logprob_drift.plan.planted_sync import STALE_EXPERT, SWAPPED_EXPERT
from pytest_logprob_drift.runtimes import weight_push
from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint

pytestmark = pytest.mark.slow
skip_unless_installed("vllm")

ID = "vllm-moe-planted"
SWAP = "rollout.weight_sync=planted:swap_expert_gate_up"
STALE = "rollout.weight_sync=planted:refit_stale_expert"
PLANTED = (SWAP, STALE)


def _load(path: Path) -> dict[str, torch.Tensor]:
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded


def _sha(tensor: torch.Tensor) -> str:
    data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("moe-planted")
    cases, text = _sealed_cases(
        directory,
        {
            "experiment_id": ID,
            "interventions": [
                {"path": "rollout.weight_sync", "values": [p.split("=")[1] for p in PLANTED]}
            ],
        },
        {"baseline", *PLANTED},
    )
    return {"run_dir": directory / "runs" / ID, "cases": cases, "text": text}


def _sealed_cases(
    directory: Path, changes: dict[str, Any], labels: set[str]
) -> tuple[dict[str, dict[str, Any]], str]:
    """Run the shipped MoE experiment with ``changes`` (its later prompts, 8 new tokens, a
    checkpoint-loaded baseline, no diagnostics) on vllm-hf with the test-only operators, and
    return each case's attempt and comparison by label (exactly ``labels``) and the output."""
    shipped = json.loads((EXPERIMENTS / "cross_config_s1_vllm_cpu_moe_bf16.json").read_text())
    config = experiment_config(
        directory,
        "cross_config_s1_vllm_cpu_moe_bf16.json",
        {
            "identity.prompts.token_ids": shipped["identity"]["prompts"]["token_ids"][1:],
            "identity.sampling.max_new_tokens": 8,
            "baseline.rollout.weight_sync": "checkpoint",
            "diagnostics": {},
            **changes,
        },
    )
    code, out, err = cli(
        "run",
        config,
        "--runtime",
        "vllm-hf",
        "--artifacts",
        directory / "runs",
        "--allow-smoke-operators",
    )
    cases = {}
    for comparison in (directory / "runs").glob("*/cases/*/*/comparison.json"):
        document = json.loads(comparison.read_text())
        cases[document["label"]] = {"attempt": comparison.parent, "comparison": document}
    assert set(cases) == labels, out[-2000:] + err[-3000:]
    assert code in (0, 1), err[-3000:]
    return cases, out + err


def _drift(attempt: Path) -> dict[str, float]:
    """max |diff|, mismatches / active and the normalized token ESS of a case's sealed
    scores, in float64 here (ESS = (sum w)^2 / (n sum w^2), w = exp(training - rollout))."""
    diffs = _load(attempt / "token_diffs.pt")
    active = diffs["active_mask"]
    t = diffs["training_logprobs"].double()[active]
    r = diffs["rollout_logprobs"].double()[active]
    diff = (t - r).abs()
    threshold = float(diffs["threshold"])
    w = torch.exp((t - r) - (t - r).max())
    return {
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "mismatch_share": float((diff > threshold).sum()) / int(active.sum()),
        "active": int(active.sum()),
        "ess": float(w.sum() ** 2 / (w.numel() * (w * w).sum())),
    }


def test_the_stale_expert_refit_is_named_by_its_three_tensors_on_the_rollout_side(
    run: dict[str, Any],
) -> None:
    """The refit's second push sent expert 1 of layer 0 from the previous policy: exactly
    its gate, up and down (whole and TP rank 0's slice) differ on the rollout side, and what
    the engine holds for each is the previous policy's tensor (recomputed here from the
    checkpoint with ``previous_policy``'s seeded perturbation, cast to bfloat16)."""
    case = run["cases"][STALE]
    comparison = case["comparison"]
    assert comparison["outcome"] == "INVALID_IDENTITY"
    # "weights (rollout[, TP rank 0]): NAME: kind: detail", each tensor whole and as a slice
    violations = comparison["identity_violations"]
    assert all(v.startswith("weights (rollout") for v in violations)
    assert sorted(v.split(": ")[1] for v in violations) == sorted(STALE_EXPERT * 2)
    assert comparison["reason"] == violations[0]
    rollout = json.loads((case["attempt"] / "weights_rollout.json").read_text())
    training = json.loads((case["attempt"] / "weights_training.json").read_text())
    assert rollout["side"] == "rollout" and "push" in rollout["point"]
    assert training["differences"] == []
    assert sorted((d["name"], d["kind"]) for d in rollout["differences"]) == sorted(
        (name, kind) for name in STALE_EXPERT for kind in ("slice", "values")
    )
    from transformers import AutoModelForCausalLM

    path = resolve_checkpoint("tiny://qwen3-moe-h128-v1", expected_digest=None).path
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    state = weight_push.gathered_state(model)  # the trainer's state, in its order
    # the previous policy written here: t + 0.05 * std(t) * n, n drawn in float32 in state
    # order from the seeded generator, one draw per tensor (no ties in this build)
    generator = torch.Generator().manual_seed(20261202)
    held = {t["name"]: t["side"] for t in rollout["tensors"]}
    for name, tensor in state.items():
        wide = tensor.to(torch.float32)
        noise = torch.randn(wide.shape, generator=generator, dtype=torch.float32)
        if name in STALE_EXPERT:
            previous = (wide + 0.05 * float(wide.std()) * noise).to(torch.bfloat16)
            assert held[name] == _sha(previous) != _sha(tensor), name
    others = [n for n in state if n not in STALE_EXPERT]
    assert others and all(held[n] == _sha(state[n]) for n in others)
    code, out, err = cli("report", run["run_dir"], "--json")
    assert code == 0, err
    (reported,) = [c for c in json.loads(out)["cases"] if c["label"] == STALE]
    assert reported["outcome"] == "INVALID_IDENTITY"
    assert violations[0].split(": ")[1] in json.dumps(reported)


def test_the_swap_is_still_named_by_both_halves(run: dict[str, Any]) -> None:
    case = run["cases"][SWAP]
    assert case["comparison"]["outcome"] == "INVALID_IDENTITY"
    rollout = json.loads((case["attempt"] / "weights_rollout.json").read_text())
    assert sorted({d["name"] for d in rollout["differences"]}) == sorted(SWAPPED_EXPERT)


def test_each_planted_bug_seals_its_scores_and_drifts_more_than_the_baseline(
    run: dict[str, Any],
) -> None:
    """Identity refuses the verdict, never the scores: each planted case seals both sides'
    scores and the numerical re-check (its mismatches and active tokens equal a recompute
    here), and each moves the rollout's scores away from the trainer's further than the
    checkpoint-loaded baseline does: a larger max and mean |diff|, a mismatch share at least
    the baseline's and a lower token ESS (the baseline's figures come from its own sealed
    scores, never typed here)."""
    baseline = _drift(run["cases"]["baseline"]["attempt"])
    assert run["cases"]["baseline"]["comparison"]["outcome"] in ("PASS", "MISMATCH")
    figures = {"baseline": baseline}
    for label in PLANTED:
        case = run["cases"][label]
        drift = _drift(case["attempt"])
        figures[label] = drift
        numerical = case["comparison"]["numerical"]
        assert numerical["active_tokens"] == drift["active"], label
        assert numerical["mismatches"] == round(drift["mismatch_share"] * drift["active"])
        assert numerical["outcome"] == ("MISMATCH" if numerical["mismatches"] else "PASS")
        # the refused verdict itself records no figures
        assert case["comparison"]["mismatches"] == 0, label
        assert drift["max_abs_diff"] > baseline["max_abs_diff"], (label, figures)
        assert drift["mean_abs_diff"] > baseline["mean_abs_diff"], (label, figures)
        # bf16 on both sides already puts most tokens over the contract's threshold: the share
        # can only saturate, never fall
        assert drift["mismatch_share"] >= baseline["mismatch_share"], (label, figures)
        assert drift["ess"] < baseline["ess"], (label, figures)
    print(json.dumps(figures, indent=1))  # the figures docs/MOE.md quotes (pytest -s)
    assert all(math.isfinite(v) for f in figures.values() for v in f.values())


# --------------------------------------------------------------------------- GLM4-MoE router bias

BIAS = "rollout.weight_sync=planted:router_bias_initial"
TRAINER = "rollout.weight_sync=trainer"


def _tiny_glm4_moe(target: Path) -> Path:
    """A tiny GLM4-MoE (transformers alone, seeded; the tiny Qwen3-MoE's tokenizer files, so its
    vocabulary of 1024 fits the shipped prompts), a trained-looking router bias N(0, 0.5) on
    each layer, saved in float32: no catalog build."""
    import shutil

    qwen = Path(resolve_checkpoint("tiny://qwen3-moe-h128-v1", expected_digest=None).path)
    save_tiny_glm4_moe(
        target, vocab_size=1024, bias_scale=0.5, bos_token_id=2, eos_token_id=1, pad_token_id=0
    )
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(qwen / name, target / name)
    return target


@pytest.fixture(scope="module")
def glm_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("glm-planted")
    checkpoint = _tiny_glm4_moe(directory / "tiny-glm4-moe")
    cases, _ = _sealed_cases(
        directory,
        {
            "experiment_id": "vllm-glm4-moe-planted",
            "identity.checkpoint": {"uri": str(checkpoint), "model_version": "tiny-glm4-moe"},
            "identity.tokenizer.id": "tiny-glm4-moe",
            "interventions": [
                {"path": "rollout.weight_sync", "values": ["trainer", BIAS.split("=")[1]]}
            ],
        },
        {"baseline", TRAINER, BIAS},
    )
    return {"cases": cases, "checkpoint": checkpoint}


def test_vllm_runs_a_glm4_moe_and_names_its_router_tensors_per_layer(
    glm_run: dict[str, Any],
) -> None:
    """vLLM 0.32's CPU build runs the tiny GLM4-MoE (every case seals both sides' scores). The
    vLLM side declares each layer's router weight and bias in float32, what vLLM constructed
    them in (read by the workers before any weight was loaded), so no dtype line is left: the
    checkpoint-loaded baseline and the trainer push are not INVALID_IDENTITY, and the planted
    push is, on exactly each layer's ``mlp.gate.e_score_correction_bias`` as a value
    difference on the rollout side (whole, and as TP rank 0's slice). The planted zeros move
    the scores further than the checkpoint-loaded baseline (from each case's sealed scores)."""
    router = [
        f"model.layers.{i}.mlp.gate.{t}"
        for i in range(2)
        for t in ("e_score_correction_bias", "weight")
    ]
    biases = [n for n in router if n.endswith("e_score_correction_bias")]
    for label in ("baseline", TRAINER, BIAS):
        case = glm_run["cases"][label]
        comparison = case["comparison"]
        assert comparison["numerical"]["active_tokens"] > 0, label
        assert not any("dtype" in v for v in comparison["identity_violations"]), label
        rollout = json.loads((case["attempt"] / "weights_rollout.json").read_text())
        assert rollout["dtype"] == "bfloat16", label
        declared = {t["name"]: t["dtype"] for t in rollout["tensors"] if t.get("dtype")}
        assert declared == dict.fromkeys(router, "float32"), label
        held = {t["name"]: t["side_dtype"] for t in rollout["tensors"]}
        assert all(held[n] == "float32" for n in router), label
    for label in ("baseline", TRAINER):
        comparison = glm_run["cases"][label]["comparison"]
        assert comparison["identity_violations"] == [], label
        assert comparison["outcome"] in ("PASS", "MISMATCH"), label
    planted = glm_run["cases"][BIAS]
    comparison = planted["comparison"]
    assert comparison["outcome"] == "INVALID_IDENTITY"
    violations = comparison["identity_violations"]
    assert all(v.startswith("weights (rollout") for v in violations), violations
    rollout = json.loads((planted["attempt"] / "weights_rollout.json").read_text())
    found = sorted((d["name"], d["kind"], d["rank"]) for d in rollout["differences"])
    assert found == sorted(
        [(n, "values", None) for n in biases] + [(n, "slice", 0) for n in biases]
    ), found
    assert sorted(v.split(": ")[1] for v in violations) == sorted(biases * 2)
    baseline = _drift(glm_run["cases"]["baseline"]["attempt"])
    trainer = _drift(glm_run["cases"][TRAINER]["attempt"])
    zeros = _drift(planted["attempt"])
    assert zeros["mean_abs_diff"] > baseline["mean_abs_diff"], (zeros, baseline)
    assert zeros["max_abs_diff"] > baseline["max_abs_diff"], (zeros, baseline)
    assert zeros["ess"] < baseline["ess"], (zeros, baseline)
    print(json.dumps({"baseline": baseline, TRAINER: trainer, BIAS: zeros}, indent=1))


def test_the_digests_after_a_push_are_of_the_router_bias_the_engine_runs_with(
    glm_run: dict[str, Any],
) -> None:
    """Each layer's ``e_score_correction_bias`` digest (float32 bytes, recomputed here from the
    safetensors file): the checkpoint's after a checkpoint load and after a correct trainer
    push (the trainer holds it in float32, and the push sends each tensor in the dtype the
    engine declares it in: float32 here, never rounded through bfloat16); after the planted
    push float32 zeros. That is the value the router computes with (the planted drift above),
    not the copy taken before the gate's processing (vLLM's dummy initialisation, before the
    fix). The router weight: the checkpoint's float32 after the load; after the push the
    trainer's bfloat16 (transformers holds the weight in the model dtype) widened to float32,
    which the rollout document declares (``via``). Between the two pushes only the biases
    differ."""
    from safetensors.torch import load_file

    (shard,) = sorted(Path(glm_run["checkpoint"]).glob("*.safetensors"))
    checkpoint = load_file(shard)
    names = [f"model.layers.{i}.mlp.gate.e_score_correction_bias" for i in range(2)]
    held = {}
    for label in ("baseline", TRAINER, BIAS):
        document = json.loads(
            (glm_run["cases"][label]["attempt"] / "weights_rollout.json").read_text()
        )
        assert ("push" in document["point"]) == (label != "baseline"), label
        held[label] = {t["name"]: t for t in document["tensors"]}
    for name in names:
        wanted = checkpoint[name]
        assert wanted.dtype == torch.float32 and bool(wanted.abs().sum() > 0), name
        assert held["baseline"][name]["side"] == _sha(wanted), name
        rounded = wanted.to(torch.bfloat16).to(torch.float32)
        assert _sha(rounded) != _sha(wanted), name
        assert held[TRAINER][name]["side"] == _sha(wanted), name
        assert held[TRAINER][name].get("via") is None, name
        zeros = torch.zeros_like(wanted)
        assert held[BIAS][name]["side"] == _sha(zeros) != _sha(wanted), name
    for i in range(2):
        name = f"model.layers.{i}.mlp.gate.weight"
        wanted = checkpoint[name]
        assert wanted.dtype == torch.float32, name
        assert held["baseline"][name]["side"] == _sha(wanted), name
        assert held["baseline"][name].get("via") is None, name
        through = wanted.to(torch.bfloat16).to(torch.float32)
        assert held[TRAINER][name]["side"] == _sha(through) != _sha(wanted), name
        assert held[TRAINER][name].get("via") == "bfloat16", name
    moved = sorted(n for n in held[TRAINER] if held[TRAINER][n]["side"] != held[BIAS][n]["side"])
    assert moved == names
