"""The trainer-to-rollout push into a live vLLM CPU engine changes what the engine computes.

One engine started with vLLM's dummy weights (``load_format="dummy"``) receives pushes from a
transformers model of the tiny Qwen2 (LM head tied to the input embedding): correct ones and
the planted sync bugs. After each push the engine scores the same token sequences on its
prefill path (``prompt_logprobs``); the reference is a plain ``vllm.LLM`` built here, which
loads the checkpoint from disk. A correct push is bitwise the reference; the dummy weights and
every planted bug are not. Also shown: the plain ``model.load_weights`` into the live CPU
engine, which is what the push path must not be, leaves the engine computing what it did
(vLLM's CPU linear layers compute with the oneDNN-packed copy made after loading).
Two engine starts for the module.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
import torch
from drift_testing import skip_unless_installed

from pytest_logprob_drift.plan.planted_sync import SYNC_VARIANTS
from pytest_logprob_drift.runtimes import weight_push
from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint

skip_unless_installed("vllm")

pytestmark = pytest.mark.slow

CHECKPOINT = "tiny://qwen2-h64-v1"
SEQUENCES = [
    [300, 417, 529, 640, 12, 77, 901, 33, 5, 250, 251, 252],
    [301, 700, 7, 8, 9, 10, 400, 401, 402, 403],
    [455, 556, 657, 758, 859, 960, 61, 62, 63, 64, 65, 66, 67, 68],
]


def _prompt_logprobs(outputs: Sequence[Any]) -> torch.Tensor:
    rows = []
    for sequence, out in zip(SEQUENCES, outputs, strict=True):
        rows.append(
            [float(out.prompt_logprobs[k][sequence[k]].logprob) for k in range(1, len(sequence))]
        )
    return torch.tensor([v for row in rows for v in row], dtype=torch.float64)


def _plain_reference(path: str) -> torch.Tensor:
    """What a plain vLLM engine that loaded the checkpoint from disk computes."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=path,
        tokenizer=path,
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=True,
        enable_prefix_caching=False,
        max_model_len=64,
        seed=1,
        kv_cache_memory_bytes=64 * 1024 * 1024,
    )
    try:
        outputs = llm.generate(
            [TokensPrompt(prompt_token_ids=s) for s in SEQUENCES],
            SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0),
            use_tqdm=False,
        )
        return _prompt_logprobs(outputs)
    finally:
        llm.llm_engine.engine_core.shutdown()


def _plain_load_weights(worker: Any, payload: bytes) -> dict[str, Any]:
    """In the worker: vLLM's ``model.load_weights`` alone, as a naive push would call it, and
    what the linear layers then hold as ``weight`` (their element counts)."""
    from pytest_logprob_drift.tensorio import tensors_from_bytes

    model = worker.get_model()
    try:
        loaded = model.load_weights(iter(tensors_from_bytes(payload).items()))
        error = ""
    except Exception as exc:  # what vLLM says when the parameters are gone
        loaded, error = set(), f"{type(exc).__name__}: {exc}"
    linears = {
        n: int(m.weight.numel())
        for n, m in model.named_modules()
        if n.endswith(("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))
    }
    return {"loaded": len(loaded or ()), "error": error, "linear_weight_numel": linears}


@pytest.fixture(scope="module")
def pushes() -> Iterator[Mapping[str, Any]]:
    """Every step on one dummy-weight engine: the scores after it and the push's report. The
    test's own probes into the worker are functions sent through ``collective_rpc``, which
    vLLM serializes only with ``VLLM_ALLOW_INSECURE_SERIALIZATION`` (set for this module's
    engine only; the project's own calls are by method name)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        yield _pushes()


def _pushes() -> Mapping[str, Any]:
    from transformers import AutoModelForCausalLM

    from pytest_logprob_drift.runtimes.vllm.engine import VllmEngineSpec, VllmRolloutEngine

    path = str(resolve_checkpoint(CHECKPOINT, expected_digest=None).path)
    reference = _plain_reference(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    state = weight_push.gathered_state(model)
    spec = VllmEngineSpec(
        model_dir=path,
        dtype="float32",
        tensor_parallel_size=1,
        enable_prefix_caching=False,
        enforce_eager=True,
        seed=1,
        max_model_len=64,
        load_format="dummy",
    )
    steps: dict[str, Any] = {"reference": reference, "state": state}
    with VllmRolloutEngine(spec) as engine:

        def score() -> torch.Tensor:
            values, _scored, _evidence = engine.replay_prefill(SEQUENCES, batch_size=3)
            return torch.tensor([v for row in values for v in row[1:]], dtype=torch.float64)

        def push(name: str | None) -> dict[str, Any]:
            variant = None if name is None else SYNC_VARIANTS[name]
            pushed_state, skipped = weight_push.planted_state(state, variant)
            chunks = list(weight_push.chunks(pushed_state, "float32", skip=skipped))
            report = engine.push_weights([c.payload for c in chunks])
            report["names"] = weight_push.names_of(chunks)
            return report

        steps["dummy"] = score()
        whole = list(weight_push.chunks(state, "float32", limit=1 << 40))
        steps["plain_loaded"] = engine._live().collective_rpc(
            _plain_load_weights, args=(whole[0].payload,)
        )
        steps["plain"] = score()
        steps["drop_tied_embedding_report"] = push("drop_tied_embedding")
        steps["drop_tied_embedding"] = score()
        steps["push_report"] = push(None)
        steps["push"] = score()
        steps["push_held"] = engine._live().collective_rpc("weights_pushed")[0]
        for name in ("through_float16", "stale_tensor"):
            steps[f"{name}_report"] = push(name)
            steps[name] = score()
            steps[f"{name}_held"] = engine._live().collective_rpc("weights_pushed")[0]
        steps["again_report"] = push(None)
        steps["again"] = score()
        steps["vllm_params"] = engine._live().collective_rpc(
            lambda worker: sorted(n for n, _ in worker.get_model().named_parameters())
        )[0]
    return steps


def test_the_dummy_engine_computes_something_else(pushes: Mapping[str, Any]) -> None:
    assert not torch.equal(pushes["dummy"], pushes["reference"])


def test_a_plain_load_weights_into_the_live_cpu_engine_changes_nothing(
    pushes: Mapping[str, Any],
) -> None:
    """The naive push: the linear layers' ``weight`` parameters are empty (vLLM's CPU build
    packed them for oneDNN after the first load and dropped the originals), so the plain
    ``load_weights`` either fails on them or writes where nothing computes; either way the
    engine does not compute the checkpoint's numbers."""
    report = pushes["plain_loaded"][0]
    assert report["linear_weight_numel"], report
    assert set(report["linear_weight_numel"].values()) == {0}, report
    assert report["error"] or report["loaded"] > 0
    assert not torch.equal(pushes["plain"], pushes["reference"])


def test_the_push_makes_the_engine_compute_bitwise_what_the_checkpoint_engine_does(
    pushes: Mapping[str, Any],
) -> None:
    torch.testing.assert_close(pushes["push"], pushes["reference"], rtol=0, atol=0)
    torch.testing.assert_close(pushes["again"], pushes["reference"], rtol=0, atol=0)
    report = pushes["push_report"]
    state = pushes["state"]
    assert report["chunks"] > 1  # the tiny checkpoint crosses in several chunks
    assert report["payload_bytes"] >= sum(t.numel() * 4 for t in state.values())
    assert report["seconds"] > 0
    assert set(report["names"]) == set(state)
    # vLLM's own names after its fusions: every parameter it holds was loaded (it also names
    # the tied lm_head.weight, which it holds as the embedding).
    assert set(pushes["vllm_params"]) <= set(report["loaded_per_worker"][0])
    assert report["not_loaded_per_worker"] == [[]]


def test_every_planted_push_changes_what_the_engine_computes(pushes: Mapping[str, Any]) -> None:
    reference = pushes["reference"]
    for name in ("drop_tied_embedding", "through_float16", "stale_tensor"):
        assert not torch.equal(pushes[name], reference), name
    dropped = pushes["drop_tied_embedding_report"]
    assert "model.embed_tokens.weight" not in dropped["names"]
    assert "lm_head.weight" not in dropped["names"]
    assert "model.embed_tokens.weight" not in dropped["loaded_per_worker"][0]
    # The push's own record names what it left in the engine unchanged.
    assert dropped["not_loaded_per_worker"] == [["model.embed_tokens.weight"]]
    # After the dropped push the embedding still holds the dummy weights, so the engine
    # computes neither the dummy model nor the checkpoint's.
    assert not torch.equal(pushes["drop_tied_embedding"], pushes["dummy"])


def _sha(tensor: torch.Tensor) -> str:
    data = tensor.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


def test_what_each_linear_held_before_packing_is_what_was_pushed(
    pushes: Mapping[str, Any],
) -> None:
    """The worker keeps, per processed layer, its parameters at the one point where the CPU
    build still has them as plain tensors (before ``process_weights_after_loading`` packs
    them); their SHA-256, recomputed here with hashlib from the transformers state in vLLM's
    fused layout (``qkv_proj`` = q, k, v rows; ``gate_up_proj`` = gate, up rows)."""
    state = pushes["state"]
    held = pushes["push_held"]
    for layer in (0, 1):
        prefix = f"model.layers.{layer}"
        attention, mlp = f"{prefix}.self_attn", f"{prefix}.mlp"
        qkv = torch.cat([state[f"{attention}.{p}_proj.weight"] for p in "qkv"])
        assert held[f"{attention}.qkv_proj"]["weight"]["sha256"] == _sha(qkv)
        bias = torch.cat([state[f"{attention}.{p}_proj.bias"] for p in "qkv"])
        assert held[f"{attention}.qkv_proj"]["bias"]["sha256"] == _sha(bias)
        assert held[f"{attention}.o_proj"]["weight"]["sha256"] == _sha(
            state[f"{attention}.o_proj.weight"]
        )
        gate_up = torch.cat([state[f"{mlp}.gate_proj.weight"], state[f"{mlp}.up_proj.weight"]])
        assert held[f"{mlp}.gate_up_proj"]["weight"]["sha256"] == _sha(gate_up)
        down = state[f"{mlp}.down_proj.weight"]
        assert held[f"{mlp}.down_proj"]["weight"]["sha256"] == _sha(down)
    # The planted bugs are visible at that point: the stale tensor is the previous policy's,
    # every other one the trainer's; pushed through float16 the tensor is its float16 rounding.
    stale = SYNC_VARIANTS["stale_tensor"].stale[0]
    module = stale.removesuffix(".weight")
    before = weight_push.previous_policy(state)[stale]
    assert pushes["stale_tensor_held"][module]["weight"]["sha256"] == _sha(before)
    assert (
        pushes["stale_tensor_held"]["model.layers.1.mlp.down_proj"]
        == held["model.layers.1.mlp.down_proj"]
    )
    half = pushes["through_float16_held"]
    assert half[module]["weight"]["sha256"] == _sha(
        state[stale].to(torch.float16).to(torch.float32)
    )
    assert half[module]["weight"]["sha256"] != held[module]["weight"]["sha256"]
