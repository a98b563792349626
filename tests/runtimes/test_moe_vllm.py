"""MoE on the ``vllm-hf`` runtime (issue 54), one sealed run shared by every test here: the tiny
Qwen3-MoE in bfloat16 on both sides at TP 1 with ``diagnostics.routing`` on (one vLLM engine).
The rollout's routing is what vLLM's routers chose while it generated (never a replay): -1
exactly at padding and at each row's last sampled token; the trainer's is -1 exactly at
padding. The recorded figures equal a numpy recompute from the sealed tensors written here;
the rollout's experts agree with the trainer's on most tokens (bf16 rounding flips a few); the
weight check covers every expert, gate and up apart, and the router (each digest recomputed
here from the safetensors file); verify recomputes the figures and names a tampered one;
``report --json`` and the run table carry the routing view.
The same engine run serves two training-side cases (issue 55): with routing replay the
trainer's sealed experts are the rollout's at every position the rollout routed (prompt and
response), and the planted flip is found at layer 1 by the routing view.
Five more rollout engines (the MoE expert weights): a TP 2 engine (per-rank expert digests),
the trainer's push at TP 1 and at TP 2 (its rollout scores bitwise the checkpoint-loaded
baseline's at the same TP) and the planted ``[up; gate]`` push at TP 1 and 2 (INVALID_IDENTITY
naming both halves of the expert, per rank). Every load and push also reads the CPU build's
prepacked expert buffers back against vLLM's own prepack of what each layer loaded; a second,
one-engine run keeps vLLM's stale MoE kernel through a push (the test-only switch) and the
after-reload check names every prepacked buffer.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from drift_testing import EXPERIMENTS, cli, experiment_config, skip_unless_installed
from resealing import reseal
from safetensors.torch import load_file

from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint
from pytest_logprob_drift.runtimes.weights.moe_experts import EXPERTS_NOT_CHECKED, FUSED_ON_BOTH

skip_unless_installed("vllm")

pytestmark = pytest.mark.slow

ID = "vllm-moe-routing"
REPLAY = "training.moe_routing=replay"
PLANTED = "flip-layer-1"
SWAP = "swap_expert_gate_up"
PUSH = "rollout.weight_sync=trainer"
TP2 = "rollout.tensor_parallel_size=2"
TP2_PUSH = f"{TP2},{PUSH}"
TP2_SWAP = f"{TP2},rollout.weight_sync=planted:{SWAP}"


def _load(path: Path) -> dict[str, torch.Tensor]:
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("moe-vllm")
    shipped = json.loads((EXPERIMENTS / "cross_config_s1_vllm_cpu_moe_bf16.json").read_text())
    config = experiment_config(
        directory,
        "cross_config_s1_vllm_cpu_moe_bf16.json",
        {
            "experiment_id": ID,
            "identity.prompts.token_ids": shipped["identity"]["prompts"]["token_ids"][1:],
            "identity.sampling.max_new_tokens": 8,
            # Training-side knobs reuse the one checkpoint-loaded rollout engine; the pushes
            # (the trainer's per-expert tensors, and the planted [up; gate] swap) one more.
            "baseline.rollout.weight_sync": "checkpoint",
            "interventions": [
                {"path": "training.moe_routing", "values": ["replay", f"planted:{PLANTED}"]},
                {"path": "rollout.weight_sync", "values": ["trainer", f"planted:{SWAP}"]},
                {"path": "rollout.tensor_parallel_size", "values": [2]},
            ],
            # The pushes at TP 2 (each a push into a TP 2 engine).
            "pairs": [["rollout.tensor_parallel_size", "rollout.weight_sync"]],
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
        "--pairwise",
    )
    run_dir = directory / "runs" / ID
    cases = {}
    for comparison in run_dir.glob("cases/*/*/comparison.json"):
        document = json.loads(comparison.read_text())
        planted_push = document["label"].endswith(f"rollout.weight_sync=planted:{SWAP}")
        expected = ("INVALID_IDENTITY",) if planted_push else ("PASS", "MISMATCH")
        assert document["outcome"] in expected, out[-2000:] + err[-3000:]
        cases[document["label"]] = {"attempt": comparison.parent, "comparison": document}
    assert set(cases) == {
        "baseline",
        REPLAY,
        f"training.moe_routing=planted:{PLANTED}",
        PUSH,
        f"rollout.weight_sync=planted:{SWAP}",
        TP2,
        TP2_PUSH,
        TP2_SWAP,
    }
    assert code in (0, 1), err[-3000:]
    base = cases["baseline"]
    return {"run_dir": run_dir, **base, "cases": cases, "text": out}


def test_each_side_routes_exactly_the_tokens_it_computed(run: dict[str, Any]) -> None:
    attempt = run["attempt"]
    scores = _load(attempt / "score_rollout.pt")
    attention = scores["attention_mask"].bool()
    lengths = attention.sum(-1)
    training = _load(attempt / "routing_training.pt")
    rollout = _load(attempt / "routing_rollout.pt")
    for tensors in (training, rollout):
        assert tensors["expert_ids"].dtype == torch.int64
        assert tensors["gate_weights"].dtype == torch.float32
        assert tensors["expert_ids"].shape == (*attention.shape, 2, 2)
    assert torch.equal(training["expert_ids"][..., 0, 0] >= 0, attention)
    last = torch.zeros_like(attention)
    last[torch.arange(len(lengths)), lengths - 1] = True
    assert torch.equal(rollout["expert_ids"][..., 0, 0] >= 0, attention & ~last)
    ids = rollout["expert_ids"][attention & ~last]
    assert bool(((ids >= 0) & (ids < 4)).all())
    assert bool((ids[..., 1] > ids[..., 0]).all())  # two distinct experts, ascending
    weights = rollout["gate_weights"][attention & ~last].double()
    # norm_topk_prob: the weights sum to 1 up to their bfloat16 rounding (2 ulps of 1: 2^-7)
    assert torch.allclose(weights.sum(-1), torch.ones_like(weights.sum(-1)), atol=2**-7)


def test_the_recorded_figures_equal_a_numpy_recompute(run: dict[str, Any]) -> None:
    attempt = run["attempt"]
    a = _load(attempt / "routing_training.pt")["expert_ids"].numpy()
    b = _load(attempt / "routing_rollout.pt")["expert_ids"].numpy()
    diffs = _load(attempt / "token_diffs.pt")
    attention = _load(attempt / "score_rollout.pt")["attention_mask"].bool().numpy()
    both = (a[..., 0, 0] >= 0) & (b[..., 0, 0] >= 0) & attention
    same = (a == b).all(-1)  # [rows, positions, layers]
    agreement = [float(same[..., k][both].mean()) for k in range(a.shape[2])]
    flipped = ~same.all(-1) & both
    figures = run["comparison"]["diagnostics"]["routing"]["figures"]
    assert figures["agreement_by_layer"] == pytest.approx(agreement, abs=1e-12)
    assert figures["flip_share"] == pytest.approx(float(flipped[both].mean()), abs=1e-12)
    assert figures["positions_compared"] == int(both.sum())
    assert min(agreement) >= 0.9  # bf16 rounding flips a few tokens, not most
    active = diffs["active_mask"].numpy()
    diff = np.abs(
        diffs["training_logprobs"].double().numpy() - diffs["rollout_logprobs"].double().numpy()
    )
    unrouted = attention & ~both
    counts = {"flip": [], "no_flip": [], "unknown": []}
    for r, t in zip(*np.nonzero(active), strict=True):
        if unrouted[r, :t].any():
            counts["unknown"].append(diff[r, t])
        elif flipped[r, :t].any():
            counts["flip"].append(diff[r, t])
        else:
            counts["no_flip"].append(diff[r, t])
    for name, values in counts.items():
        assert figures["drift"][name]["tokens"] == len(values), name
        if values:
            assert figures["drift"][name]["max_abs_diff"] == pytest.approx(max(values))
    assert counts["unknown"] == []  # no prefix cache: every position before t is routed


def _sha(tensor: torch.Tensor) -> str:
    data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


def test_the_weight_check_covers_every_expert_half_and_the_router(run: dict[str, Any]) -> None:
    """Every per-expert checkpoint tensor is checked on both sides (vLLM's fused w13/w2 read
    per expert, gate and up apart, before the CPU prepack; transformers' fused gate_up_proj
    reverted to per-expert names), each digest recomputed here from the safetensors file
    with hashlib and a plain torch cast, whole and per rank (TP 1 and TP 2: rank r holds rows
    [r*I/2, (r+1)*I/2) of gate and of up, the same columns of down)."""
    model_dir = resolve_checkpoint("tiny://qwen3-moe-h128-v1", expected_digest=None).path
    (checkpoint,) = Path(model_dir).glob("*.safetensors")
    stored = {n: t.to(torch.bfloat16) for n, t in load_file(str(checkpoint)).items()}
    experts = {n for n in stored if ".mlp.experts." in n}
    assert len(experts) == 2 * 4 * 3  # layers x experts x (gate, up, down)
    runs = [(1, run["attempt"], side) for side in ("weights_rollout.json", "weights_training.json")]
    runs.append((2, run["cases"][TP2]["attempt"], "weights_rollout.json"))
    for tp, attempt, side in runs:
        document = json.loads((attempt / side).read_text())
        assert document["refused"] is None, side
        assert document["differences"] == [], side
        tensors = {t["name"]: t for t in document["tensors"]}
        assert set(tensors) == set(stored), side
        for name, tensor in tensors.items():
            assert tensor["checkpoint"] == tensor["side"] == _sha(stored[name]), (side, name)
            for part in tensor["slices"]:  # one rank's rows (gate, up) or columns (down)
                piece = stored[name].narrow(
                    part["dim"], part["start"], part["stop"] - part["start"]
                )
                assert part["checkpoint"] == part["side"] == _sha(piece), (side, name, part)
        skipped = {s["name"]: s["reason"] for s in document["skipped"]}
        assert not any(r == EXPERTS_NOT_CHECKED for r in skipped.values()), side
        fused = {n for n, r in skipped.items() if r == FUSED_ON_BOTH}
        prefix = "model.layers.1.mlp.experts."
        if side == "weights_rollout.json":
            assert {
                prefix + "routed_experts.w13_weight",
                prefix + "routed_experts.w2_weight",
            } <= fused
            assert document["tensor_parallel_size"] == tp
            for name in experts:
                rows = stored[name].shape[1 if name.endswith("down_proj.weight") else 0] // tp
                spans = [
                    (p["rank"], p["dim"], p["start"], p["stop"]) for p in tensors[name]["slices"]
                ]
                dim = 1 if name.endswith("down_proj.weight") else 0
                assert spans == [(r, dim, r * rows, (r + 1) * rows) for r in range(tp)], name
        else:
            assert {prefix + "gate_up_proj", prefix + "down_proj"} <= fused, side


def test_verify_recomputes_the_routing_figures_and_names_a_tampered_one(
    run: dict[str, Any], tmp_path: Path
) -> None:
    code, out, err = cli("verify", run["run_dir"])
    assert code == 0, out + err
    import shutil

    copy = tmp_path / ID
    shutil.copytree(run["run_dir"], copy)
    comparison = copy / run["attempt"].relative_to(run["run_dir"]) / "comparison.json"
    document = json.loads(comparison.read_text())
    figures = document["diagnostics"]["routing"]["figures"]
    figures["agreement_by_layer"][0] = 0.5
    comparison.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    reseal(copy, comparison)
    code, out, err = cli("verify", copy)
    assert code == 1
    assert "routing_rollout.pt" in out + err
    assert "recomputed offline differ" in out + err


def test_report_and_run_table_carry_the_routing_view(run: dict[str, Any]) -> None:
    assert "routing agree (min layer)" in run["text"]
    assert "routing: " in run["text"] and "with a flip" in run["text"]
    code, out, _err = cli("report", run["run_dir"], "--json")
    assert code == 0
    (case,) = [c for c in json.loads(out)["cases"] if c["label"] == "baseline"]
    assert case["diagnostics"]["routing"] == run["comparison"]["diagnostics"]["routing"]
    assert case["diagnostics"]["routing"]["rollout"]["status"] == "routing_captured"


def test_a_routing_finding_shows_the_case_beside_its_baseline(run: dict[str, Any]) -> None:
    """What a routing knob bought, in its finding: the case's agreement by layer and flip share
    beside the baseline's, as sealed in each case's comparison.json."""
    code, out, _err = cli("report", run["run_dir"], "--json")
    assert code == 0
    planted = f"training.moe_routing=planted:{PLANTED}"
    (finding,) = [f for f in json.loads(out)["findings"]["moved"] if f["label"] == planted]

    def shares(label: str) -> tuple[str, str]:
        figures = run["cases"][label]["comparison"]["diagnostics"]["routing"]["figures"]
        by_layer = ", ".join(f"{a:.1%}" for a in figures["agreement_by_layer"])
        return by_layer, f"{figures['flip_share']:.1%}"

    (case_layers, case_flips), (base_layers, base_flips) = shares(planted), shares("baseline")
    assert finding["facts"]["routing:"] == (
        f"same experts by layer {case_layers} (baseline {base_layers}); "
        f"{case_flips} with a flip (baseline {base_flips})"
    )
    assert "routing: same experts by layer" in finding["words"]


def test_with_replay_the_trainer_routes_every_token_as_the_rollout_did(
    run: dict[str, Any],
) -> None:
    """The sealed training experts equal the rollout's (vLLM's own capture) at every position
    the rollout routed, prompt and response; elsewhere (the last sampled token) the trainer's
    own choice; the routing view agrees at every layer."""
    attempt = run["cases"][REPLAY]["attempt"]
    training = _load(attempt / "routing_training.pt")["expert_ids"]
    rollout = _load(attempt / "routing_rollout.pt")["expert_ids"]
    scores = _load(attempt / "score_rollout.pt")
    routed = rollout[..., 0, 0] >= 0
    response = scores["active_mask"].bool()
    assert (routed & response).any() and (routed & ~response).any()  # both kinds covered
    assert torch.equal(training[routed], rollout[routed])
    attention = scores["attention_mask"].bool()
    assert torch.equal(training[..., 0, 0] >= 0, attention)
    figures = run["cases"][REPLAY]["comparison"]["diagnostics"]["routing"]["figures"]
    assert figures["agreement_by_layer"] == [1.0, 1.0]
    assert figures["flip_share"] == 0.0
    assert figures["positions_compared"] == int(routed.sum())


def test_the_planted_flip_is_found_at_layer_1(run: dict[str, Any]) -> None:
    routing = run["cases"][f"training.moe_routing=planted:{PLANTED}"]["comparison"]
    figures = routing["diagnostics"]["routing"]["figures"]
    baseline = run["comparison"]["diagnostics"]["routing"]["figures"]
    compared = figures["positions_compared"]
    # Layer 0 is untouched (as close to the rollout as the baseline's); at layer 1 every
    # token's second expert was swapped, so the sets differ unless bf16 flipped the rollout
    # the same way.
    assert figures["agreement_by_layer"][0] == baseline["agreement_by_layer"][0]
    assert figures["agreement_by_layer"][1] <= 0.1
    counts = figures["first_differing_layer_counts"]
    assert counts[1] >= 0.9 * compared - counts[0]


def _packed_read_back(document: dict[str, Any], tp: int) -> dict[tuple[str, str, int], Any]:
    """The document's prepacked buffers by (layer, tensor, rank); every MoE layer's w13 and
    w2 on every rank must be there (the CPU build prepacks them all)."""
    packed = {(p["layer"], p["tensor"], p["rank"]): p for p in document["packed"]}
    layers = [f"model.layers.{i}.mlp.experts.routed_experts" for i in range(2)]
    assert set(packed) == {
        (layer, tensor, rank)
        for layer in layers
        for tensor in ("w13_weight", "w2_weight")
        for rank in range(tp)
    }
    return packed


@pytest.mark.parametrize(("tp", "push", "loaded"), [(1, PUSH, "baseline"), (2, TP2_PUSH, TP2)])
def test_the_push_reproduces_the_checkpoint_loaded_scores_bitwise(
    run: dict[str, Any], tp: int, push: str, loaded: str
) -> None:
    """The trainer's per-expert tensors pushed into a dummy-loaded engine at TP 1 and 2: the
    rollout scores are the checkpoint-loaded engine's at the same TP, bitwise (vLLM 0.32's
    reload skipped the CPU experts' prepack and ran on scrambled experts until the worker
    extension re-ran it), the digests taken after the push equal the checkpoint's for every
    expert half, and every prepacked buffer read back after the reload is vLLM's prepack of
    what the layer loaded, the same bytes the checkpoint-loaded engine holds."""
    pushed, reference_case = run["cases"][push], run["cases"][loaded]
    assert pushed["comparison"]["outcome"] == reference_case["comparison"]["outcome"]
    reference = _load(reference_case["attempt"] / "score_rollout.pt")
    scores = _load(pushed["attempt"] / "score_rollout.pt")
    assert set(scores) == set(reference)
    for name, tensor in reference.items():
        assert torch.equal(scores[name], tensor), name
    document = json.loads((pushed["attempt"] / "weights_rollout.json").read_text())
    assert "push" in document["point"]
    assert document["tensor_parallel_size"] == tp
    assert document["refused"] is None and document["differences"] == []
    experts = {t["name"] for t in document["tensors"] if ".mlp.experts." in t["name"]}
    assert len(experts) == 2 * 4 * 3
    base = json.loads((reference_case["attempt"] / "weights_rollout.json").read_text())
    after_push, after_load = _packed_read_back(document, tp), _packed_read_back(base, tp)
    for key, entry in after_push.items():
        assert entry["held"] == entry["expected"] == after_load[key]["held"], key
        assert after_load[key]["held"] == after_load[key]["expected"], key


def test_the_prepacked_buffers_are_not_the_loaded_bytes(run: dict[str, Any]) -> None:
    """The read-back compares packed bytes (not a copy of the loaded tensor): recomputed here
    from the safetensors file, w13 of layer 0 at TP 1 in the checkpoint's layout (each
    expert's gate rows then up rows, bf16) has another digest than the buffer vLLM holds,
    and the held buffer's digest is the one vLLM's prepack op gives for those bytes."""
    from vllm import _custom_ops

    model_dir = resolve_checkpoint("tiny://qwen3-moe-h128-v1", expected_digest=None).path
    (checkpoint,) = Path(model_dir).glob("*.safetensors")
    stored = load_file(str(checkpoint))
    prefix = "model.layers.0.mlp.experts"
    w13 = torch.stack(
        [
            torch.cat([stored[f"{prefix}.{e}.{half}_proj.weight"] for half in ("gate", "up")])
            for e in range(4)
        ]
    ).to(torch.bfloat16)
    document = json.loads((run["attempt"] / "weights_rollout.json").read_text())
    packed = _packed_read_back(document, 1)[(f"{prefix}.routed_experts", "w13_weight", 0)]
    assert packed["held"] != _sha(w13)
    isas = ("amx", "vec") if torch.cpu._is_amx_tile_supported() else ("vec",)
    prepacks = {_sha(_custom_ops.cpu_prepack_moe_weight(w13, isa)) for isa in isas}
    assert packed["held"] in prepacks


@pytest.fixture(scope="module")
def stale_kernel_push(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One push case (the baseline itself, TP 1) whose engine keeps vLLM 0.32's built MoE
    kernel through the reload (the test-only switch the workers read from the environment
    they inherit): the CPU experts' prepack is skipped, as without the worker extension."""
    import os

    from pytest_logprob_drift.runtimes.vllm.worker_ext import KEEP_MOE_KERNEL_FOR_TESTS

    directory = tmp_path_factory.mktemp("moe-stale-kernel")
    shipped = json.loads((EXPERIMENTS / "cross_config_s1_vllm_cpu_moe_bf16.json").read_text())
    config = experiment_config(
        directory,
        "cross_config_s1_vllm_cpu_moe_bf16.json",
        {
            "experiment_id": "vllm-moe-stale-kernel",
            "identity.prompts.token_ids": shipped["identity"]["prompts"]["token_ids"][1:],
            "identity.sampling.max_new_tokens": 8,
            "baseline.rollout.weight_sync": "trainer",
            "interventions": [],
        },
    )
    os.environ[KEEP_MOE_KERNEL_FOR_TESTS] = "1"
    try:
        code, out, err = cli(
            "run", config, "--runtime", "vllm-hf", "--artifacts", directory / "runs"
        )
    finally:
        del os.environ[KEEP_MOE_KERNEL_FOR_TESTS]
    (comparison,) = (directory / "runs" / "vllm-moe-stale-kernel").glob("cases/*/*/comparison.json")
    return {"code": code, "text": out + err, "attempt": comparison.parent}


def test_the_after_reload_check_names_the_skipped_prepack(
    stale_kernel_push: dict[str, Any], run: dict[str, Any]
) -> None:
    """With the kernel kept, every digest taken before processing still equals the
    checkpoint's, but each prepacked buffer holds the loaded bytes unpacked: the check after
    the reload names every MoE layer's w13 and w2, and the case is INVALID_IDENTITY."""
    attempt = stale_kernel_push["attempt"]
    comparison = json.loads((attempt / "comparison.json").read_text())
    assert comparison["outcome"] == "INVALID_IDENTITY", stale_kernel_push["text"][-3000:]
    document = json.loads((attempt / "weights_rollout.json").read_text())
    packed = _packed_read_back(document, 1)
    base = _packed_read_back(json.loads((run["attempt"] / "weights_rollout.json").read_text()), 1)
    for key, entry in packed.items():
        assert entry["expected"] == base[key]["held"], key  # what the loaded engine holds
        assert entry["held"] != entry["expected"], key
    assert {(d["name"], d["rank"], d["kind"]) for d in document["differences"]} == {
        (f"{layer}.{tensor}", 0, "packed") for layer, tensor, _rank in packed
    }
    layer0 = "model.layers.0.mlp.experts.routed_experts.w13_weight"
    assert layer0 in stale_kernel_push["text"]
    code, out, err = cli("verify", attempt.parent.parent.parent)
    assert code == 0, out + err


def test_a_planted_gate_up_swap_is_named_by_tensor_expert_and_side(run: dict[str, Any]) -> None:
    from pytest_logprob_drift.plan.planted_sync import SWAPPED_EXPERT

    gate, up = SWAPPED_EXPERT
    for tp, label in ((2, TP2_SWAP), (1, f"rollout.weight_sync=planted:{SWAP}")):
        case = run["cases"][label]
        assert case["comparison"]["outcome"] == "INVALID_IDENTITY"
        rollout = json.loads((case["attempt"] / "weights_rollout.json").read_text())
        training = json.loads((case["attempt"] / "weights_training.json").read_text())
        assert training["differences"] == []
        # each half, whole and as each TP rank's slice of it; the prepacked buffers hold
        # vLLM's prepack of what was pushed (the swap is in the weights, not the packing)
        found = [(d["name"], d["rank"], d["kind"]) for d in rollout["differences"]]
        assert len(found) == 2 * (tp + 1), label
        assert set(found) == {
            *((name, r, "slice") for name in (gate, up) for r in range(tp)),
            (gate, None, "values"),
            (up, None, "values"),
        }, label
        assert all(p["held"] == p["expected"] for p in _packed_read_back(rollout, tp).values())
    assert rollout["side"] == "rollout"
    # what the engine holds as expert 2's gate is the checkpoint's up projection, and back
    model_dir = resolve_checkpoint("tiny://qwen3-moe-h128-v1", expected_digest=None).path
    (checkpoint,) = Path(model_dir).glob("*.safetensors")
    stored = load_file(str(checkpoint))
    held = {t["name"]: t["side"] for t in rollout["tensors"]}
    assert held[gate] == _sha(stored[up].to(torch.bfloat16))
    assert held[up] == _sha(stored[gate].to(torch.bfloat16))
    code, out, err = cli("report", run["run_dir"], "--json")
    assert code == 0, err
    assert gate in out


ROUTER_BIAS = "model.layers.1.mlp.gate.bias"


@pytest.fixture(scope="module")
def router_bias_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """verl#5801's class: the tiny Qwen3-MoE checkpoint with one extra router bias tensor
    written into its safetensors file (float values, so not the zeros a bias starts at),
    loaded by vLLM (checkpoint-loaded, TP 1) and by transformers."""
    import shutil

    from safetensors.torch import save_file

    directory = tmp_path_factory.mktemp("moe-router-bias")
    source = resolve_checkpoint("tiny://qwen3-moe-h128-v1", expected_digest=None).path
    checkpoint = directory / "ckpt"
    shutil.copytree(source, checkpoint)
    tensors = load_file(str(checkpoint / "model.safetensors"))
    tensors[ROUTER_BIAS] = torch.tensor([-0.5, 0.25, 0.75, -1.0], dtype=torch.bfloat16)
    save_file(tensors, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
    shipped = json.loads((EXPERIMENTS / "cross_config_s1_vllm_cpu_moe_bf16.json").read_text())
    config = experiment_config(
        directory,
        "cross_config_s1_vllm_cpu_moe_bf16.json",
        {
            "experiment_id": "vllm-moe-router-bias",
            "identity.checkpoint": {"uri": str(checkpoint), "model_version": "router-bias"},
            "identity.tokenizer": {"id": "router-bias", "add_special_tokens": False},
            "identity.prompts.token_ids": shipped["identity"]["prompts"]["token_ids"][1:],
            "identity.sampling.max_new_tokens": 4,
            "baseline.rollout.weight_sync": "checkpoint",
            "interventions": [],
        },
    )
    code, out, err = cli("run", config, "--runtime", "vllm-hf", "--artifacts", directory / "runs")
    run_dir = directory / "runs" / "vllm-moe-router-bias"
    (comparison,) = run_dir.glob("cases/*/*/comparison.json")
    return {"code": code, "text": out + err, "attempt": comparison.parent, "run_dir": run_dir}


def test_a_router_bias_the_loaders_drop_is_named_on_both_sides(
    router_bias_run: dict[str, Any],
) -> None:
    """vLLM's Qwen3-MoE ``load_weights`` ignores unexpected ``.bias`` names
    (``AutoWeightsLoader(ignore_unexpected_suffixes=[".bias", ...])``) and transformers'
    ``Qwen3MoeTopKRouter`` has no bias either (an unexpected key, a warning): the checkpoint's
    router bias is applied by neither engine, silently. The weight check names exactly that
    tensor as not held, on each side, and the case is INVALID_IDENTITY; every other tensor,
    the experts and their prepacked buffers included, is equal."""
    attempt = router_bias_run["attempt"]
    comparison = json.loads((attempt / "comparison.json").read_text())
    assert comparison["outcome"] == "INVALID_IDENTITY", router_bias_run["text"][-3000:]
    for side in ("rollout", "training"):
        document = json.loads((attempt / f"weights_{side}.json").read_text())
        assert document["refused"] is None, side
        found = [(d["name"], d["rank"], d["kind"]) for d in document["differences"]]
        assert found == [(ROUTER_BIAS, None, "missing")], side
        (bias,) = [t for t in document["tensors"] if t["name"] == ROUTER_BIAS]
        assert bias["side"] is None and bias["shape"] == [4], side
        assert len(document["tensors"]) > 2 * 4 * 3
    rollout = json.loads((attempt / "weights_rollout.json").read_text())
    assert all(p["held"] == p["expected"] for p in _packed_read_back(rollout, 1).values())
    assert ROUTER_BIAS in router_bias_run["text"]
    code, out, err = cli("verify", router_bias_run["run_dir"])
    assert code == 0, out + err
