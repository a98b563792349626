"""One real CPU vLLM engine: the read-backs the CUDA path added, as the CPU build answers them.

vLLM's CPU build runs model runner V1, so every V2 branch must stay out of its way and every
new read-back must say what the CPU engine really runs: the runner (``v1``), no context
parallelism (prefill and decode sizes 1), ``enforce_eager`` from the resolved compilation
mode, one attention implementation per attention layer, trace replay asked for but refused in
vLLM's own words (the CPU platform has no V2), the logits probe on V1's Module sampler.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

pytest.importorskip("vllm")

from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint
from pytest_logprob_drift.runtimes.vllm.engine import (
    VllmEngineSpec,
    VllmRolloutEngine,
)
from pytest_logprob_drift.runtimes.vllm.read_back import eager_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine() -> Iterator[VllmRolloutEngine]:
    model_dir = resolve_checkpoint("tiny://qwen3-h64-v1", expected_digest=None).path
    spec = VllmEngineSpec(
        model_dir=str(model_dir),
        dtype="float32",
        tensor_parallel_size=1,
        enable_prefix_caching=False,
        enforce_eager=True,
        seed=0,
        max_model_len=64,
        trace_replay=True,  # asked for: the CPU build cannot, and says why
    )
    with VllmRolloutEngine(spec) as eng:
        yield eng


def test_the_cpu_engine_reads_back_runner_v1_and_no_context_parallelism(
    engine: VllmRolloutEngine,
) -> None:
    engine.generate(
        [[300, 417, 529, 640]],
        max_new_tokens=3,
        temperature=1.0,
        seed=0,
        batch_size=1,
        eos_token_id=1,
        pad_token_id=0,
    )
    live = engine.read_back()
    assert live["model_runner"] == "v1"
    assert (live["prefill_context_parallel_size"], live["decode_context_parallel_size"]) == (1, 1)
    assert engine.context_parallel_size() == 1
    assert live["enable_trace_replay"] is False
    assert (live["compilation_mode"], live["cudagraph_mode"]) == ("NONE", "NONE")
    assert (
        eager_of(
            enforce_eager=bool(live["enforce_eager"]),
            compilation_mode=str(live["compilation_mode"]),
            cudagraph_mode=str(live["cudagraph_mode"]),
        )
        is True
    )
    per_layer = live["attention_layers"]
    assert isinstance(per_layer, dict)
    assert sum(per_layer.values()) == 2  # the tiny Qwen3's two decoder layers
    assert set(per_layer) == set(str(live["attention_backend"]).split(","))
    assert live["attention_backend_requested"] == "None"  # vLLM chose per layer
    assert live["sampler_logits_dtype"] == "float32"  # the V1 probe still sees the logits
    (worker,) = live["logp_injection"]  # type: ignore[misc]
    assert worker["runner"] == "v1" and worker["untouched"] is True
    assert worker["installed"] is False


def test_trace_replay_is_refused_in_vllms_words(engine: VllmRolloutEngine) -> None:
    assert engine.trace_replay is False
    assert engine.trace_replay_reason == (
        "vLLM's CPU platform runs model runner V1, which has no trace replay"
    )
    reason = engine.trace_replay_refusal()
    assert "trace replay requires Model Runner V2" in reason, reason
    with pytest.raises(ValueError, match="trace replay requires Model Runner V2"):
        engine.replay_decode([[3, 4]], [[5]], batch_size=1, temperature=1.0, seed=0)
    json.dumps(reason)  # a plain sentence, sealed as evidence
