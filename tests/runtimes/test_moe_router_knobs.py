"""The training router knobs (``training.moe_routing``, ``training.router_dtype``) on the tiny
MoE builds, against plain transformers written here: with replay the routers take the given
expert ids (their own top-k only where none was given) and weight them from their own
float32 softmax, and the scores equal a forward whose routers are replaced by a float64
function written here; the float32 router chooses what a float64 gate GEMM chooses while the
weights stay in bfloat16; the planted flip changes layer 1 only and the routing view finds
it there. Planning and the runner: the knobs are off unless named, a planted routing needs
the test-only authorization, FSDP refuses them, the error paths name what is wrong."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from pytest_logprob_drift.execute.readonly import state_digest
from pytest_logprob_drift.numerics.routing import figures
from pytest_logprob_drift.records import MaskPolicy
from pytest_logprob_drift.runtimes.batch import canonical_batch
from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint
from pytest_logprob_drift.runtimes.transformers import engine as hf_engine
from pytest_logprob_drift.runtimes.transformers import moe

PROMPTS = [[300, 417, 529, 640], [301, 700, 7], [455, 556, 657, 758, 859, 960], [333, 444]]
RESPONSES = [[12, 99, 1], [5, 6, 7, 8, 9, 10], [44], [800, 801, 802, 803]]
BATCH_SIZE = 3  # two chunks of unequal length


def _batch() -> dict[str, torch.Tensor]:
    return canonical_batch(
        PROMPTS,
        [(r, [0.0] * len(r)) for r in RESPONSES],
        0,
        eos_token_id=1,
        mask_policy=MaskPolicy.RESPONSE_THROUGH_EOS,
    )


def _model(name: str, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    path = resolve_checkpoint(f"tiny://{name}", expected_digest=None).path
    return AutoModelForCausalLM.from_pretrained(Path(path), dtype=dtype).eval()


def _rollout_ids(batch: dict[str, torch.Tensor], layers: int, experts: int) -> torch.Tensor:
    """Expert ids a rollout could have chosen: two distinct ones per token and layer, sorted,
    -1 at padding, at each row's last token and at two prompt positions (as a prefix cache
    leaves them)."""
    generator = torch.Generator().manual_seed(55)
    rows, width = batch["token_ids"].shape
    scores = torch.rand((rows, width, layers, experts), generator=generator)
    ids = scores.topk(2, dim=-1).indices.sort(-1).values
    attention = batch["attention_mask"].bool()
    lengths = attention.sum(-1)
    unrouted = ~attention
    unrouted[torch.arange(rows), lengths - 1] = True
    unrouted[0, 1] = unrouted[2, 0] = True
    ids[unrouted] = -1
    return ids


def _by_hand(
    model: Any,
    batch: dict[str, torch.Tensor],
    choose: Callable[[int, torch.Tensor, tuple[int, int, int]], torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each MoE block's router replaced by a float64 function written here: its logits from
    the block input and the gate weight, its experts ``choose(layer, probs, chunk)`` (int64
    ``[tokens, k]``), their weights the float64 softmax gathered there (renormalized when the
    model normalizes its top-k). Returns the teacher-forced logprobs (float64, 0 outside the
    active mask) and the ids each router used on the batch's grid (-1 at padding)."""
    config = model.config
    routers = moe.moe_routers(model)
    rows, width = batch["token_ids"].shape
    used = torch.full((rows, width, len(routers), config.num_experts_per_tok), -1)
    chunk: list[tuple[int, int, int]] = []
    originals = [r.forward for r in routers]

    def router(layer: int, module: Any) -> Callable[[torch.Tensor], Any]:
        def forward(hidden: torch.Tensor) -> Any:
            start, stop, length = chunk[0]
            hidden = hidden.reshape(-1, module.weight.shape[1])
            logits = hidden.double() @ module.weight.double().T
            probs = torch.softmax(logits, dim=-1)
            ids = choose(layer, probs, chunk[0])
            weights = probs.gather(-1, ids)
            if config.norm_topk_prob:
                weights = weights / weights.sum(-1, keepdim=True)
            used[start:stop, :length, layer] = ids.sort(-1).values.reshape(stop - start, length, -1)
            return logits.to(hidden.dtype), weights.to(hidden.dtype), ids

        return forward

    logprobs = torch.zeros((rows, width), dtype=torch.float64)
    try:
        for i, r in enumerate(routers):
            r.forward = router(i, r)
        with torch.no_grad():
            for start in range(0, rows, BATCH_SIZE):
                stop = min(start + BATCH_SIZE, rows)
                length = int(batch["attention_mask"][start:stop].sum(-1).max())
                chunk[:] = [(start, stop, length)]
                out = model(
                    input_ids=batch["token_ids"][start:stop, :length],
                    attention_mask=batch["attention_mask"][start:stop, :length].long(),
                    position_ids=batch["position_ids"][start:stop, :length],
                    use_cache=False,
                )
                logp = torch.log_softmax(out.logits[:, :-1].double(), dim=-1)
                picked = logp.gather(-1, batch["token_ids"][start:stop, 1:length, None])[..., 0]
                active = batch["active_mask"][start:stop, 1:length]
                logprobs[start:stop, 1:length] = torch.where(active, picked, 0.0)
    finally:
        for r, forward in zip(routers, originals, strict=True):
            r.forward = forward
    used[~batch["attention_mask"].bool()] = -1
    return logprobs, used


def _natural(k: int) -> Callable[[int, torch.Tensor, tuple[int, int, int]], torch.Tensor]:
    return lambda _layer, probs, _chunk: probs.topk(k, dim=-1).indices


def _project(model: Any, batch: dict[str, torch.Tensor], **knobs: Any) -> tuple[Any, Any]:
    """The project's scores and sealed routing under ``moe.RouterOverride(**knobs)``; the
    override counts what its hooks did (2 chunks x 2 MoE layers router calls)."""
    mask = batch["attention_mask"]
    override = moe.RouterOverride(model, mask, batch_size=BATCH_SIZE, **knobs)
    with override:
        scores = hf_engine.hf_teacher_forced_score(
            model, batch, batch_size=BATCH_SIZE, logp_fn=hf_engine.native_selected_logprob
        )
    assert override.float32_calls == (4 if knobs.get("float32") else 0)
    assert override.flipped_calls == (2 if knobs.get("flip_layer") is not None else 0)
    replay = knobs.get("replay")
    if replay is not None:  # every token the rollout routed, in each chunk's trimmed width
        spans = moe.chunk_spans(mask, batch_size=BATCH_SIZE)
        given = sum(int((replay[a:b, :n, ..., 0] >= 0).sum()) for a, b, n in spans)
        assert override.replayed_tokens == given > 0
    with moe.RouterOverride(model, mask, batch_size=BATCH_SIZE, **knobs):
        captured = moe.capture_routing(model, batch, batch_size=BATCH_SIZE)
    return scores, captured


@pytest.mark.parametrize("name", ["qwen3-moe-h128-v1", "olmoe-h128-v1"])
def test_replay_routes_the_rollouts_experts_weighted_by_the_own_router(name: str) -> None:
    model = _model(name, torch.float32)
    batch = _batch()
    config = model.config
    replay = _rollout_ids(batch, len(moe.moe_routers(model)), config.num_experts)
    scores, captured = _project(model, batch, replay=replay)
    routed = replay[..., 0] >= 0  # [rows, positions, layers]
    assert routed.any() and (~routed & batch["attention_mask"].bool()[..., None]).any()

    def replayed(layer: int, probs: torch.Tensor, chunk: tuple[int, int, int]) -> torch.Tensor:
        start, stop, length = chunk
        given = replay[start:stop, :length, layer].reshape(-1, config.num_experts_per_tok)
        natural = probs.topk(config.num_experts_per_tok, dim=-1).indices
        return torch.where((given >= 0).all(-1, keepdim=True), given, natural)

    expected_logprobs, expected_ids = _by_hand(model, batch, replayed)
    # The sealed ids are the rollout's wherever it routed, the model's own elsewhere.
    assert torch.equal(captured.expert_ids[routed], replay[routed])
    assert torch.equal(captured.expert_ids, expected_ids)
    active = batch["active_mask"]
    assert torch.allclose(scores[active].double(), expected_logprobs[active], atol=1e-4)
    # Replay moved the scores: the natural routing (written here) gives other logprobs.
    natural_logprobs, _ = _by_hand(model, batch, _natural(config.num_experts_per_tok))
    assert not torch.allclose(scores[active].double(), natural_logprobs[active], atol=1e-3)


def test_the_float32_router_is_a_float64_gate_while_the_weights_stay_bfloat16() -> None:
    model = _model("qwen3-moe-h128-v1", torch.bfloat16)
    batch = _batch()
    before = state_digest(model)
    k = model.config.num_experts_per_tok
    _scores, captured = _project(model, batch, float32=True)
    assert state_digest(model) == before
    assert all(r.weight.dtype == torch.bfloat16 for r in moe.moe_routers(model))
    margins = torch.full(captured.expert_ids.shape[:3], float("inf"), dtype=torch.float64)

    def choose(layer: int, probs: torch.Tensor, chunk: tuple[int, int, int]) -> torch.Tensor:
        start, stop, length = chunk
        top = probs.topk(k + 1, dim=-1).values
        margins[start:stop, :length, layer] = (top[:, k - 1] - top[:, k]).reshape(
            stop - start, length
        )
        return probs.topk(k, dim=-1).indices

    _, expected = _by_hand(model, batch, choose)
    attention = batch["attention_mask"].bool()
    clear = (margins > 1e-5) & attention[..., None]  # float32 and float64 agree off near-ties
    assert clear[..., 0].sum() > attention.sum() // 2
    assert torch.equal(captured.expert_ids[clear], expected[clear])


def test_the_planted_flip_changes_layer_1_and_the_routing_view_finds_it_there() -> None:
    model = _model("qwen3-moe-h128-v1", torch.float32)
    batch = _batch()
    k = model.config.num_experts_per_tok
    _, natural = _project(model, batch)
    _, flipped = _project(model, batch, flip_layer=1)

    def planted(layer: int, probs: torch.Tensor, _chunk: tuple[int, int, int]) -> torch.Tensor:
        order = probs.argsort(dim=-1, descending=True)
        if layer != 1:
            return order[:, :k]
        return torch.cat([order[:, : k - 1], order[:, k : k + 1]], dim=-1)

    _, expected = _by_hand(model, batch, planted)
    assert torch.equal(flipped.expert_ids, expected)
    view = figures(
        {"expert_ids": flipped.expert_ids, "gate_weights": flipped.gate_weights},
        {"expert_ids": natural.expert_ids, "gate_weights": natural.gate_weights},
        attention_mask=batch["attention_mask"],
        active_mask=batch["active_mask"],
        training_logprobs=torch.zeros(batch["token_ids"].shape),
        rollout_logprobs=torch.zeros(batch["token_ids"].shape),
        threshold=1e-3,
    )
    assert view["agreement_by_layer"] == [1.0, 0.0]
    assert view["flip_share"] == 1.0
    assert view["first_differing_layer_counts"] == [0, view["positions_compared"]]


def test_the_override_names_what_does_not_fit() -> None:
    model = _model("qwen3-moe-h128-v1", torch.float32)
    batch = _batch()
    mask = batch["attention_mask"]
    with pytest.raises(ValueError, match=r"MoE layers of top-2"):
        moe.RouterOverride(model, mask, batch_size=2, replay=torch.zeros((4, 9, 3, 2)))
    with pytest.raises(ValueError, match="the planted flip names MoE layer 2, the model has 2"):
        moe.RouterOverride(model, mask, batch_size=2, flip_layer=2)
    dense = _model("qwen3-h64-v1", torch.float32)
    with pytest.raises(ValueError, match="no mixture-of-experts layer"):
        moe.RouterOverride(dense, mask, batch_size=2, float32=True)
    with moe.RouterOverride(model, mask, batch_size=4, float32=True):  # one chunk planned
        ids = batch["token_ids"][:2, :5]
        with pytest.raises(RuntimeError, match=r"forward 0 fed \(2, 5\), its chunk is \(4, "):
            model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    assert model._forward_pre_hooks == {}  # the hooks are gone after the block
    assert all(r._forward_hooks == {} for r in moe.moe_routers(model))


def test_the_scorer_applies_the_knobs_and_reads_back_what_its_hooks_did() -> None:
    """The in-process scorer's router knobs: replay without the rollout's ids is a runtime
    failure naming the knob; a dense model names the knob and the missing MoE layer; the
    read-back says a non-default value only where its hook changed a router call."""
    from pytest_logprob_drift.errors import RuntimeFailure
    from pytest_logprob_drift.execute.side_settings import MoeRouting
    from pytest_logprob_drift.runtimes.transformers.adapter import HfTrainingScorer

    class _Scorer:
        group = None
        _router_override = HfTrainingScorer._router_override
        _routers_observed = HfTrainingScorer._routers_observed
        capture_routing = HfTrainingScorer.capture_routing

        def __init__(self, model: Any, routing: str, float32: bool) -> None:
            self.model = model
            self.moe_routing = MoeRouting.from_knob(routing)
            self.router_float32 = float32

    model = _model("qwen3-moe-h128-v1", torch.float32)
    batch = _batch()
    natural = _Scorer(model, "natural", False)
    assert natural._router_override(batch, 2, None) is None
    assert natural._routers_observed(None) == {
        "training.moe_routing": "natural",
        "training.router_dtype": "model",
    }
    replay = _Scorer(model, "replay", True)
    with pytest.raises(RuntimeFailure, match="replay: the scorer's call carries no rollout"):
        replay._router_override(batch, 2, None)
    ids = _rollout_ids(batch, 2, model.config.num_experts)
    override = replay._router_override(batch, 2, ids)
    assert override is not None
    assert replay._routers_observed(override)["training.moe_routing"] == "natural"  # not run
    with override:
        hf_engine.hf_teacher_forced_score(
            model, batch, batch_size=2, logp_fn=hf_engine.native_selected_logprob
        )
    assert replay._routers_observed(override) == {
        "training.moe_routing": "replay",
        "training.router_dtype": "float32",
    }
    sealed = replay.capture_routing(batch, batch_size=2, rollout_routing=ids)
    routed = ids[..., 0] >= 0
    assert torch.equal(sealed["expert_ids"][routed], ids[routed])
    planted = _Scorer(model, "planted:flip-layer-1", False)
    override = planted._router_override(batch, 2, None)
    with override:
        moe.capture_routing(model, batch, batch_size=2)
    assert planted._routers_observed(override)["training.moe_routing"] == "planted:flip-layer-1"
    dense = _Scorer(_model("qwen3-h64-v1", torch.float32), "natural", True)
    with pytest.raises(RuntimeFailure, match=r"router_dtype=float32: .*no mixture-of-experts"):
        dense._router_override(batch, 2, None)
