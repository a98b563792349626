"""Layer diagnostics on the ``vllm-hf`` runtime (issue 23): fp32 cases on the deep tiny Qwen3,
one run of three cases (baseline, ``rollout.tensor_parallel_size=2``,
``rollout.enforce_eager=false``). vLLM's residual stream (``hidden_states + residual``, the add
fused into the next norm) against transformers' (the add inside the layer): in fp32 the two
must agree closely at every layer; the embeddings are a row lookup of the same fp32 weights,
so bitwise equal. With TP=2 the rollout side reads rank 0 after checking every rank's
reduction hashes the same; under compiled graphs it is ``layers_unavailable`` for that case
only and the verdict is the one the sealed scores give. Checked against states captured by
hooks written here on plain transformers.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import EXPERIMENTS, cli, skip_unless_installed
from layer_hooks import hooked_states, plain_model, scoring_rows

from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint

skip_unless_installed("vllm")

pytestmark = pytest.mark.slow

DEEP = "tiny://qwen3-deep-l8-h64-v1"
FP32_NOISE = 1e-4
"""A relative error fp32 arithmetic stays far below over 8 layers (a tolerance, not a rounding
of this CPU: bf16 rounding alone is ~4e-3)."""


def _load(path: Path) -> dict[str, torch.Tensor]:
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded


BASELINE, TP2, COMPILED = (
    "baseline",
    "rollout.tensor_parallel_size=2",
    "rollout.enforce_eager=false",
)


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
    # TP=2 (construction_env binds one CPU per rank, VLLM_CPU_OMP_THREADS_BIND) and compiled
    # graphs: two more engines in the same run.
    config["interventions"] = [
        {"path": "rollout.tensor_parallel_size", "values": [2]},
        {"path": "rollout.enforce_eager", "values": [False]},
    ]
    config["diagnostics"] = {"layers": True}
    path = directory / "config.json"
    path.write_text(json.dumps(config))
    code, out, err = cli("run", path, "--runtime", "vllm-hf", "--artifacts", directory / "runs")
    assert code == 0, out[-2000:] + err[-3000:]
    run_dir = directory / "runs" / "vllm-layers-fp32"
    cases = {}
    for comparison in run_dir.glob("cases/*/*/comparison.json"):
        document = json.loads(comparison.read_text())
        cases[document["label"]] = {"attempt": comparison.parent, "comparison": document}
    assert set(cases) == {BASELINE, TP2, COMPILED}
    return {
        "run_dir": run_dir,
        "cases": cases,
        "attempt": cases[BASELINE]["attempt"],
        "comparison": cases[BASELINE]["comparison"],
        "text": out,
    }


def _hf_states(batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    states = hooked_states(plain_model(torch.float32), batch)
    return scoring_rows(states, batch["active_mask"])


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
    report = json.loads(out)
    assert report["invalid"] == 0
    assert {(a["case_id"], a["status"], a["outcome"]) for a in report["attempts"]} == {
        (c["comparison"]["case_id"], "ok", c["comparison"]["outcome"])
        for c in run["cases"].values()
    }


# ------------------------------------------------ TP=2: rank 0 read, ranks checked equal


def _projection(width: int, reduction: dict[str, Any]) -> torch.Tensor:
    """The projection drawn here from the sealed reduction parameters (seed + width,
    N(0, 1/dim) entries, float64)."""
    dim = int(reduction["projection_dim"])
    generator = torch.Generator().manual_seed(int(reduction["projection_seed"]) + width)
    return torch.randn((width, dim), generator=generator, dtype=torch.float64) / dim**0.5


def test_tp2_reads_rank_zero_after_the_ranks_agree(run: dict[str, Any]) -> None:
    case = run["cases"][TP2]
    layers = case["comparison"]["diagnostics"]["layers"]
    evidence = layers["rollout"]["evidence"]
    assert layers["rollout"]["status"] == "layers_captured"
    assert (evidence["tensor_parallel_size"], evidence["read_rank"], evidence["ranks_agree"]) == (
        2,
        0,
        True,
    )
    assert evidence["decoder_layers"] == 8
    actual = json.loads((case["attempt"] / "actual.json").read_text())
    assert actual["read_back"]["vllm.num_worker_processes"] == 2
    assert actual["knobs"]["rollout.tensor_parallel_size"]["actual"] == 2
    base = run["cases"][BASELINE]["comparison"]["diagnostics"]["layers"]["rollout"]["evidence"]
    assert (base["tensor_parallel_size"], base["read_rank"], base["ranks_agree"]) == (1, 0, True)
    assert layers["training"]["status"] == "layers_captured"
    assert "tensor_parallel_size" not in layers["training"]["evidence"]
    for row in layers["figures"]["states"]:
        assert row["max_rel_error"] < FP32_NOISE, row


def test_tp2_states_agree_with_plain_transformers_in_fp32(run: dict[str, Any]) -> None:
    """vLLM with TP=2 (row-parallel matmuls summed by the all-reduce) against fp32
    transformers with hooks written here: exact norms within fp32 noise, and the projected
    difference (projection drawn here) within fp32 noise of the state, at every layer."""
    case = run["cases"][TP2]
    batch = _load(case["attempt"] / "score_rollout.pt")
    rollout = _load(case["attempt"] / "layers_rollout.pt")
    reduction = case["comparison"]["diagnostics"]["layers"]["reduction"]
    mine = _hf_states(batch)
    assert torch.equal(rollout["positions"], batch["active_mask"][:, 1:].nonzero())
    assert len(mine) == int(rollout["digests"].shape[0]) == 11
    for s, state in enumerate(mine):
        exact = state.double()
        norms = torch.linalg.vector_norm(exact, dim=-1)
        assert torch.allclose(rollout["norms"][s], norms, rtol=FP32_NOISE, atol=0), s
        projected = exact @ _projection(int(exact.shape[1]), reduction)
        diff = torch.linalg.vector_norm(rollout["projections"][s] - projected, dim=-1)
        assert bool((diff[norms == 0] == 0).all()), s  # an all-zero state (a zero embedding row)
        moved = diff[norms > 0] / norms[norms > 0]
        assert float(moved.max()) < FP32_NOISE, (s, float(moved.max()))


def _embedding_digests(attempt: Path) -> dict[int, bytes]:
    """Token id -> the rollout side's sealed embedding digest (state 0) at the positions
    that read it."""
    batch = _load(attempt / "score_rollout.pt")
    rollout = _load(attempt / "layers_rollout.pt")
    out: dict[int, bytes] = {}
    for (row, t), digest in zip(rollout["positions"].tolist(), rollout["digests"][0], strict=True):
        token, value = int(batch["token_ids"][row, t]), bytes(digest.tolist())
        assert out.setdefault(token, value) == value, token  # one token, one embedding
    return out


def test_tp2_embeddings_are_bitwise_the_tp1_embeddings(run: dict[str, Any]) -> None:
    """vLLM's VocabParallelEmbedding with TP=2: each rank looks up the rows it owns and
    writes +0.0 elsewhere, and the all-reduce adds the two ranks' rows: x + 0.0 == x exactly
    in fp32 (for every x but -0.0), so every embedding is bitwise the fp32 weight row, as
    with TP=1. Checked against SHA-256 of the checkpoint's rows computed here."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        resolve_checkpoint(DEEP, expected_digest=None).path, dtype=torch.float32
    )
    weight = model.model.embed_tokens.weight.detach()
    tp1 = _embedding_digests(run["cases"][BASELINE]["attempt"])
    tp2 = _embedding_digests(run["cases"][TP2]["attempt"])
    shared = set(tp1) & set(tp2)
    assert len(shared) >= 4  # at least the prompts' last tokens
    assert {t: tp2[t] for t in shared} == {t: tp1[t] for t in shared}
    for token, digest in tp2.items():
        row = weight[token].contiguous()
        assert hashlib.sha256(b"torch.float32\0" + row.numpy().tobytes()).digest()[:16] == digest


# ------------------------------------------------ compiled graphs: unavailable, verdict kept


def test_compiled_graphs_are_layers_unavailable_for_that_case_only(run: dict[str, Any]) -> None:
    case = run["cases"][COMPILED]
    layers = case["comparison"]["diagnostics"]["layers"]
    assert layers["rollout"]["status"] == "layers_unavailable"
    reason = layers["rollout"]["reason"]
    assert "compiled graphs" in reason and "enforce_eager=false" in reason, reason
    assert "mode is left as it is" in reason
    assert layers["training"]["status"] == "layers_captured"
    assert layers["figures"] is None
    assert (case["attempt"] / "layers_training.pt").is_file()
    assert not (case["attempt"] / "layers_rollout.pt").exists()
    # the engine's mode was not switched: vLLM's own config still says compiled graphs
    requested = json.loads((case["attempt"] / "requested.json").read_text())
    actual = json.loads((case["attempt"] / "actual.json").read_text())
    assert requested["knobs"]["rollout.enforce_eager"] is False
    assert requested["binding"]["rollout"]["enforce_eager"] is False
    knob = actual["knobs"]["rollout.enforce_eager"]
    assert (knob["actual"], knob["status"]) == (False, "applied")
    assert actual["read_back"]["vllm.enforce_eager"] is False
    assert f"layers (rollout): layers_unavailable ({reason})" in run["text"]
    assert run["text"].count("layers (rollout): layers_unavailable") == 1  # that case only
    for label in (BASELINE, TP2):
        other = run["cases"][label]["comparison"]["diagnostics"]["layers"]
        assert other["rollout"]["status"] == other["training"]["status"] == "layers_captured"


def test_the_compiled_case_keeps_the_verdict_its_scores_give(run: dict[str, Any]) -> None:
    """A diagnostic never changes a verdict: the compiled-graph case's outcome and mismatch
    count are the contract's rule (strict ``>``, float64) applied here to its sealed scores,
    every knob it records is applied (none STRICT_REJECTED), and its reason says nothing of
    layers."""
    for label in (COMPILED, TP2, BASELINE):
        case = run["cases"][label]
        comparison = case["comparison"]
        rollout = _load(case["attempt"] / "score_rollout.pt")
        training = _load(case["attempt"] / "score_training.pt")
        active = rollout["active_mask"]
        diff = (training["logprobs"].double() - rollout["logprobs"].double()).abs()
        mismatches = int((active & (diff > comparison["threshold"])).sum())
        assert comparison["mismatches"] == comparison["numerical"]["mismatches"] == mismatches
        assert comparison["active_tokens"] == int(active.sum())
        assert comparison["outcome"] == ("MISMATCH" if mismatches else "PASS"), label
        assert comparison["numerical"]["outcome"] == comparison["outcome"]
        knobs = json.loads((case["attempt"] / "actual.json").read_text())["knobs"]
        assert {k["status"] for k in knobs.values()} == {"applied"}, label
        assert "layer" not in comparison["reason"]
