"""The training side's routing capture on the tiny MoE builds, against plain transformers
written here: each MoE block's router is recomputed from the block's input (a forward
pre-hook on ``mlp``) as a float32 softmax over the router logits, then top-k, in the same
teacher-forced chunks, masks and dtype as the scorer; and the in-process scorer's
``capture_routing`` (what ``diagnostics.routing`` seals) equals it, refusing a dense model."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from drift_testing import skip_unless_installed

pytest.importorskip("transformers")

from pytest_logprob_drift.execute.protocol import RoutingUnavailable
from pytest_logprob_drift.records import MaskPolicy
from pytest_logprob_drift.runtimes.batch import canonical_batch
from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint
from pytest_logprob_drift.runtimes.transformers import moe

PROMPTS = [[300, 417, 529, 640], [301, 700, 7], [455, 556, 657, 758, 859, 960], [333, 444]]
RESPONSES = [[12, 99, 1], [5, 6, 7, 8, 9, 10], [44], [800, 801, 802, 803]]


def _batch() -> dict[str, torch.Tensor]:
    return canonical_batch(
        PROMPTS,
        [(r, [0.0] * len(r)) for r in RESPONSES],
        0,
        eos_token_id=1,
        mask_policy=MaskPolicy.RESPONSE_THROUGH_EOS,
    )


def _by_hand(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], batch_size: int
) -> torch.Tensor:
    """Each token's top-k experts from the router's own weight applied to the MoE block's
    input: float32 softmax over all experts, then top-k, sorted ascending; -1 at padding."""
    config = model.config
    blocks = [layer.mlp for layer in model.model.layers]
    rows, width = batch["token_ids"].shape
    ids = torch.full((rows, width, len(blocks), config.num_experts_per_tok), -1, dtype=torch.long)
    where: list[tuple[int, int, int]] = []

    def pre(index: int):
        def read(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            start, stop, length = where[0]
            hidden = args[0].reshape(-1, config.hidden_size)
            logits = torch.nn.functional.linear(hidden, blocks[index].gate.weight)
            probs = torch.softmax(logits.float(), dim=-1)
            chosen = probs.topk(config.num_experts_per_tok, dim=-1).indices.sort(-1).values
            ids[start:stop, :length, index] = chosen.reshape(stop - start, length, -1)

        return read

    handles = [b.register_forward_pre_hook(pre(i)) for i, b in enumerate(blocks)]
    try:
        with torch.no_grad():
            for start in range(0, rows, batch_size):
                stop = min(start + batch_size, rows)
                length = int(batch["attention_mask"][start:stop].sum(-1).max())
                where[:] = [(start, stop, length)]
                model(
                    input_ids=batch["token_ids"][start:stop, :length],
                    attention_mask=batch["attention_mask"][start:stop, :length].long(),
                    position_ids=batch["position_ids"][start:stop, :length],
                    use_cache=False,
                )
    finally:
        for handle in handles:
            handle.remove()
    ids[~batch["attention_mask"].bool()] = -1
    return ids


@pytest.mark.parametrize("name", ["qwen3-moe-h128-v1", "olmoe-h128-v1"])
@pytest.mark.parametrize(("dtype", "batch_size"), [(torch.bfloat16, 4), (torch.float32, 3)])
def test_training_routing_equals_plain_transformers(
    name: str, dtype: torch.dtype, batch_size: int
) -> None:
    from transformers import AutoModelForCausalLM

    path = resolve_checkpoint(f"tiny://{name}", expected_digest=None).path
    model = AutoModelForCausalLM.from_pretrained(Path(path), dtype=dtype).eval()
    batch = _batch()
    captured = moe.capture_routing(model, batch, batch_size=batch_size)
    expected = _by_hand(model, batch, batch_size)
    assert captured.expert_ids.dtype == torch.int64
    assert captured.gate_weights.dtype == torch.float32
    assert captured.expert_ids.shape == (4, batch["token_ids"].shape[1], 2, 2)
    assert torch.equal(captured.expert_ids, expected)
    routed = captured.expert_ids[..., 0, 0] >= 0
    assert torch.equal(routed, batch["attention_mask"].bool())
    assert bool((captured.gate_weights[~routed] == 0).all())
    assert bool((captured.gate_weights[routed] > 0).all())
    if model.config.norm_topk_prob:  # Qwen3-MoE renormalizes the top-k weights
        sums = captured.gate_weights[routed].sum(-1).double()
        assert torch.allclose(sums, torch.ones_like(sums), atol=1e-2)


def test_the_scorer_seals_the_capture_and_refuses_a_dense_model() -> None:
    from pytest_logprob_drift.execute.side_settings import MoeRouting
    from pytest_logprob_drift.runtimes.transformers.adapter import HfTrainingScorer

    class _Scorer:
        group = None
        moe_routing = MoeRouting()
        router_float32 = False
        capture_routing = HfTrainingScorer.capture_routing
        _router_override = HfTrainingScorer._router_override

        def __init__(self, model: torch.nn.Module) -> None:
            self.model = model

    from transformers import AutoModelForCausalLM

    batch = _batch()
    path = resolve_checkpoint("tiny://qwen3-moe-h128-v1", expected_digest=None).path
    model = AutoModelForCausalLM.from_pretrained(Path(path), dtype=torch.bfloat16).eval()
    sealed = _Scorer(model).capture_routing(batch, batch_size=2)
    assert set(sealed) == {"expert_ids", "gate_weights"}
    assert torch.equal(sealed["expert_ids"], _by_hand(model, batch, 2))
    dense = AutoModelForCausalLM.from_pretrained(
        resolve_checkpoint("tiny://qwen3-h64-v1", expected_digest=None).path
    )
    with pytest.raises(RoutingUnavailable, match="no mixture-of-experts layer"):
        _Scorer(dense).capture_routing(batch, batch_size=2)
    with pytest.raises(ValueError, match="no mixture-of-experts layer"):
        moe.capture_routing(dense, batch, batch_size=2)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        moe.capture_routing(model, batch, batch_size=0)


def test_generation_routing_is_what_the_routers_chose_on_the_decode_path() -> None:
    """The transformers rollout's capture while it generates (left-padded prefill, then one
    token per step through the KV cache, chunks of 2 rows): -1 exactly at padding and at each
    row's last token; elsewhere the experts a teacher-forced float32 recompute written here
    chooses (the decode path's numerics may flip a near tie, so most, not all)."""
    from transformers import AutoModelForCausalLM

    from pytest_logprob_drift.runtimes.transformers import engine as hf_engine

    path = resolve_checkpoint("tiny://qwen3-moe-h128-v1", expected_digest=None).path
    model = AutoModelForCausalLM.from_pretrained(Path(path), dtype=torch.float32).eval()
    recorder = moe.GenerationRouting(model)
    batch = hf_engine.hf_rollout(
        model,
        PROMPTS,
        seed=7,
        max_new_tokens=6,
        temperature=1.0,
        eos_token_id=1,
        pad_token_id=0,
        batch_size=2,
        logp_fn=hf_engine.native_selected_logprob,
    )
    captured = recorder.on_grid(batch["token_ids"], batch["attention_mask"])
    attention = batch["attention_mask"].bool()
    lengths = attention.sum(-1)
    last = torch.zeros_like(attention)
    last[torch.arange(len(lengths)), lengths - 1] = True
    routed = captured.expert_ids[..., 0, 0] >= 0
    assert torch.equal(routed, attention & ~last)
    expected = _by_hand(model, batch, 4)
    same = (captured.expert_ids == expected).all(-1).all(-1)[routed]
    assert float(same.double().mean()) >= 0.95
    assert model._forward_pre_hooks == {}  # on_grid removed the hooks
    other = moe.GenerationRouting(model)
    hf_engine.hf_rollout(
        model,
        PROMPTS,
        seed=7,
        max_new_tokens=6,
        temperature=1.0,
        eos_token_id=1,
        pad_token_id=0,
        batch_size=2,
        logp_fn=hf_engine.native_selected_logprob,
    )
    changed = batch["token_ids"].clone()
    changed[0, 0] += 1
    with pytest.raises(ValueError, match="row 0 position 0: the rollout fed token"):
        other.on_grid(changed, batch["attention_mask"])


@pytest.mark.slow
def test_an_hf_run_seals_both_sides_routing_and_verify_recomputes_it(tmp_path: Path) -> None:
    """The ``hf`` runtime captures routing on both sides (the rollout while it generates, the
    trainer teacher-forced): both files sealed, figures recorded, verify accepts them."""
    import json

    from drift_testing import cli, experiment_config
    from resealing import reseal

    config = experiment_config(
        tmp_path,
        "cross_config_s1_vllm_cpu_moe_bf16.json",
        {
            "experiment_id": "hf-moe-routing",
            "identity.prompts.token_ids": [[455, 556, 657], [333, 444, 101]],
            "identity.sampling.max_new_tokens": 4,
            "interventions": [],
            "scenario.level": "S0",
        },
    )
    code, out, err = cli("run", config, "--runtime", "hf", "--artifacts", tmp_path / "runs")
    run_dir = tmp_path / "runs" / "hf-moe-routing"
    (comparison,) = run_dir.glob("cases/*/*/comparison.json")
    document = json.loads(comparison.read_text())
    assert document["outcome"] in ("PASS", "MISMATCH"), out + err
    routing = document["diagnostics"]["routing"]
    for side in ("training", "rollout"):
        assert routing[side]["status"] == "routing_captured", routing[side]
        assert routing[side]["evidence"]["moe_layers"] == 2
    assert routing["figures"]["positions_compared"] == routing["rollout"]["evidence"]["positions"]
    assert (comparison.parent / "routing_training.pt").is_file()
    assert (comparison.parent / "routing_rollout.pt").is_file()
    assert "routing: " in out
    header = next(line for line in out.splitlines() if line.startswith("case_id"))
    assert "routing agree (min layer)" in header and "tokens flipped" in header, out
    code, verified, err = cli("verify", run_dir)
    assert code == 0, verified + err
    # The report's run-scope part (``report_run_lines`` / ``report_run_section``): every
    # routed case's lines in the text, the section with its lines on the page.
    label = document["label"]
    page = tmp_path / "report.html"
    code, text, err = cli("report", run_dir, "--html", page)
    assert code == 0, text + err
    assert f"{label}: routing: {routing['figures']['positions_compared']} tokens routed" in text
    html = page.read_text()
    assert "<section id='routing'>" in html, html[:2000]
    assert "routing agreement by layer, every case" in html
    # The diagnostic's offline check, through the protocol: figures that differ from the
    # sealed tensors' recomputation, and a file sealed beside a status that says none was.
    for tamper, fault in (
        (
            lambda r: r["figures"].update(flip_share=0.5 + r["figures"]["flip_share"] / 4),
            r"routing_rollout\.pt +the routing figures recomputed offline differ",
        ),
        (
            lambda r: r.update(
                training={"status": "routing_unavailable", "reason": "planted"}, figures=None
            ),
            r"routing_training\.pt +sealed, but comparison\.json records routing_unavailable",
        ),
    ):
        copy = tmp_path / f"tampered-{len(fault)}" / "hf-moe-routing"
        shutil.copytree(run_dir, copy)
        changed = copy / comparison.relative_to(run_dir)
        tampered = json.loads(changed.read_text())
        tamper(tampered["diagnostics"]["routing"])
        for path in (changed, changed.parent / "COMPLETE", *copy.glob("attributions/*/*")):
            os.chmod(path, 0o644)
        changed.write_text(json.dumps(tampered, indent=2, sort_keys=True) + "\n")
        reseal(copy, changed)
        code, out, err = cli("verify", copy)
        assert code == 1, out + err
        assert re.search(fault, out), out


def test_compiled_graphs_refuse_the_rollout_capture_before_the_engine_is_touched(
    tmp_path: Path,
) -> None:
    skip_unless_installed("vllm")
    from pytest_logprob_drift.execute.rollout_experts import arm_rollout
    from pytest_logprob_drift.runtimes.vllm.engine import VllmEngineSpec, VllmRolloutEngine

    spec = VllmEngineSpec(
        model_dir=str(resolve_checkpoint("tiny://qwen3-moe-h128-v1", expected_digest=None).path),
        dtype="bfloat16",
        tensor_parallel_size=1,
        enable_prefix_caching=False,
        enforce_eager=False,
        max_model_len=64,
        seed=1,
    )
    engine = object.__new__(VllmRolloutEngine)  # never built: the refusal comes first
    engine.spec = spec
    with pytest.raises(ValueError, match=r"enforce_eager=false.*no routing was captured"):
        engine.routing_arm()
    status = arm_rollout(object())
    assert status is not None and status.status == "routing_unavailable"
    assert status.reason == "the rollout engine (object) has no routing capture"
