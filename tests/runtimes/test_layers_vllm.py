"""Layer diagnostics on the ``vllm-hf`` runtime (issue 23): one fp32 case on the deep tiny
Qwen3, one vLLM engine. vLLM's residual stream (``hidden_states + residual``, the add fused
into the next norm) against transformers' (the add inside the layer): in fp32 the two must
agree closely at every layer; the embeddings are a row lookup of the same fp32 weights, so
bitwise equal. Checked against states captured by hooks written here on plain transformers.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import EXPERIMENTS, cli

from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint

pytestmark = pytest.mark.slow
pytest.importorskip("vllm")

DEEP = "tiny://qwen3-deep-l8-h64-v1"
FP32_NOISE = 1e-4
"""A relative error fp32 arithmetic stays far below over 8 layers (a tolerance, not a rounding
of this CPU: bf16 rounding alone is ~4e-3)."""


def _load(path: Path) -> dict[str, torch.Tensor]:
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("layers-vllm")
    config = json.loads((EXPERIMENTS / "cross_config_s1_vllm_cpu_tiny_bf16.json").read_text())
    config["experiment_id"] = "vllm-layers-fp32"
    config["identity"]["checkpoint"] = {"uri": DEEP, "model_version": "tiny-qwen3-deep-l8-h64-v1"}
    config["identity"]["prompts"]["token_ids"] = config["identity"]["prompts"]["token_ids"][:4]
    config["identity"]["sampling"]["max_new_tokens"] = 8
    config["baseline"]["batch"]["size"] = 4
    config["baseline"]["rollout"]["dtype"] = "float32"
    config["baseline"]["training"]["compute_dtype"] = "float32"
    config["interventions"] = []
    config["diagnostics"] = {"layers": True}
    path = directory / "config.json"
    path.write_text(json.dumps(config))
    code, out, err = cli("run", path, "--runtime", "vllm-hf", "--artifacts", directory / "runs")
    assert code == 0, out[-2000:] + err[-3000:]
    run_dir = directory / "runs" / "vllm-layers-fp32"
    (comparison,) = run_dir.glob("cases/*/*/comparison.json")
    return {
        "run_dir": run_dir,
        "attempt": comparison.parent,
        "comparison": json.loads(comparison.read_text()),
        "text": out,
    }


def _hf_states(batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        resolve_checkpoint(DEEP, expected_digest=None).path,
        dtype=torch.float32,
        attn_implementation="sdpa",
    ).eval()
    seen: list[torch.Tensor] = []
    parts = [model.model.embed_tokens, *model.model.layers, model.model.norm, model.lm_head]
    handles = [
        p.register_forward_hook(
            lambda _m, _a, out: seen.append((out[0] if isinstance(out, tuple) else out).clone())
        )
        for p in parts
    ]
    length = int(batch["attention_mask"].sum(-1).max())
    with torch.no_grad():
        model(
            input_ids=batch["token_ids"][:, :length],
            attention_mask=batch["attention_mask"][:, :length].long(),
            position_ids=batch["position_ids"][:, :length],
            use_cache=False,
        )
    for h in handles:
        h.remove()
    select = batch["active_mask"][:, 1:length]
    return [s[:, :-1][select] for s in seen]


def test_vllm_and_transformers_agree_at_every_layer_in_fp32(run: dict[str, Any]) -> None:
    layers = run["comparison"]["diagnostics"]["layers"]
    assert layers["rollout"]["status"] == "layers_captured"
    assert layers["rollout"]["evidence"]["decoder_layers"] == 8
    states = layers["figures"]["states"]
    assert states[0]["state"] == "0" and states[0]["bitwise_equal_share"] == 1.0
    for row in states:
        assert row["max_rel_error"] < FP32_NOISE, row
        assert row["median_cosine"] > 1 - FP32_NOISE, row
    assert "layers: rollout vs training states first differ at" in run["text"]


def test_the_sealed_reductions_against_plain_transformers(run: dict[str, Any]) -> None:
    batch = _load(run["attempt"] / "score_rollout.pt")
    mine = _hf_states(batch)
    training = _load(run["attempt"] / "layers_training.pt")
    rollout = _load(run["attempt"] / "layers_rollout.pt")
    assert torch.equal(rollout["positions"], batch["active_mask"][:, 1:].nonzero())
    for s, state in enumerate(mine):
        tag = str(state.dtype).encode() + b"\0"
        digests = [
            hashlib.sha256(tag + row.numpy().tobytes()).digest()[:16] for row in state.contiguous()
        ]
        assert [bytes(d.tolist()) for d in training["digests"][s]] == digests, s
        exact = torch.linalg.vector_norm(state.double(), dim=-1)
        # vLLM's own states: exact norms, within fp32 noise of transformers'
        assert torch.allclose(rollout["norms"][s], exact, rtol=FP32_NOISE, atol=0), s
    assert [bytes(d.tolist()) for d in rollout["digests"][0]] == [
        bytes(d.tolist()) for d in training["digests"][0]
    ]


def test_verify_recomputes_the_vllm_layers(run: dict[str, Any]) -> None:
    code, out, err = cli("verify", run["run_dir"], "--json")
    assert code == 0, out[-2000:] + err[-2000:]
