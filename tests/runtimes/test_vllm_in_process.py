"""vLLM engines built one after another in one process, its engine core run there.

With ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` vLLM runs the engine core in the process that builds
the engine, and at TP 1 its worker too (the ``uni`` executor): the suite builds its engines
that way (``tests/conftest.py``), and so does a trainer that hosts its rollout engine in its
own process. One process then holds engine after engine, so nothing of an earlier engine may
show in a later one's read-back (the logits dtype its sampler received, the sampling it took
in), and closing an engine gives the process back what vLLM changed in it
(``torch.set_num_threads``, vLLM's environment cache). A bfloat16 engine, then a float32 one
(its logprobs against plain transformers float32 here), then a TP 2 one, whose two workers are
children of this process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from drift_testing import skip_unless_installed

skip_unless_installed("vllm")

import torch  # noqa: E402
import transformers  # noqa: E402

from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint  # noqa: E402
from pytest_logprob_drift.runtimes.vllm.engine import (  # noqa: E402
    VllmEngineSpec,
    VllmRolloutEngine,
)
from pytest_logprob_drift.runtimes.vllm.processes import list_child_processes  # noqa: E402

pytestmark = pytest.mark.slow

EOS, PAD = 1, 0  # the tiny checkpoint's special ids (runtimes/tiny_model.py)
PROMPTS = [[300, 417, 529, 640], [301, 700, 7], [455, 556, 657]]
FP32_TOLERANCE = 1e-4  # vLLM fp32 against transformers fp32 on CPU: a few 1e-6 measured


@pytest.fixture(scope="module")
def model_dir() -> str:
    return str(resolve_checkpoint("tiny://qwen3-h64-v1", expected_digest=None).path)


@pytest.fixture(autouse=True)
def engine_core_here(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The engine core in this process, whatever the suite's default."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    yield


def _spec(model_dir: str, dtype: str, tp: int = 1) -> VllmEngineSpec:
    return VllmEngineSpec(
        model_dir=model_dir,
        dtype=dtype,
        tensor_parallel_size=tp,
        enable_prefix_caching=False,
        enforce_eager=True,
        seed=0,
        max_model_len=64,
    )


def _generate(engine: VllmRolloutEngine, temperature: float) -> dict[str, torch.Tensor]:
    return engine.generate(
        PROMPTS,
        max_new_tokens=6,
        temperature=temperature,
        seed=11,
        batch_size=len(PROMPTS),
        eos_token_id=EOS,
        pad_token_id=PAD,
    )


def _teacher_forced(model_dir: str, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Plain transformers float32: one forward of the right-padded batch, the selected
    token's log-softmax at every position after the first."""
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, local_files_only=True
    )
    model.eval()
    with torch.no_grad():
        logits = model(
            input_ids=batch["token_ids"],
            attention_mask=batch["attention_mask"].long(),
            position_ids=batch["position_ids"],
            use_cache=False,
        ).logits
    logp = torch.log_softmax(logits[:, :-1].double(), dim=-1)
    selected = logp.gather(-1, batch["token_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
    out = torch.zeros(batch["logprobs"].shape, dtype=torch.float64)
    out[:, 1:] = selected
    return out


def test_engines_in_one_process_each_read_back_only_their_own(model_dir: str) -> None:
    from vllm import envs

    own_set_num_threads = torch.set_num_threads
    with VllmRolloutEngine(_spec(model_dir, "bfloat16")) as first:
        _generate(first, temperature=0.5)
        read = first.read_back()
        assert read["num_engine_core_processes"] == 0  # the engine core runs here
        assert read["distributed_executor_backend"] == "uni"  # and so does the worker
        assert read["sampler_logits_dtype"] == "bfloat16"
        assert [e["temperature"] for e in read["sampling_seen"]] == [0.5]  # type: ignore[index,union-attr]
        assert torch.set_num_threads is not own_set_num_threads  # vLLM's CPU worker's no-op
    # Closed: torch's own set_num_threads is back, and vLLM reads the environment again.
    assert torch.set_num_threads is own_set_num_threads
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    try:
        assert envs.VLLM_CPU_OMP_THREADS_BIND == "nobind"
    finally:
        del os.environ["VLLM_CPU_OMP_THREADS_BIND"]

    with VllmRolloutEngine(_spec(model_dir, "float32")) as second:
        batch = _generate(second, temperature=1.0)
        read = second.read_back()
    # Only this engine's logits and requests: none of the bfloat16 engine's.
    assert read["sampler_logits_dtype"] == "float32"
    assert read["lm_head_dtype"] == "float32"
    assert [e["temperature"] for e in read["sampling_seen"]] == [1.0]  # type: ignore[index,union-attr]
    active = batch["active_mask"]
    assert int(active.sum()) > 0
    diff = (_teacher_forced(model_dir, batch) - batch["logprobs"].double()).abs()[active]
    assert float(diff.max()) <= FP32_TOLERANCE


def test_a_tp2_engine_core_here_counts_and_ends_its_two_workers(model_dir: str) -> None:
    before = set(list_child_processes())
    with VllmRolloutEngine(_spec(model_dir, "float32", tp=2)) as engine:
        procs = engine.engine_process_ids()
        read = engine.read_back()
        batch = _generate(engine, temperature=1.0)
        assert procs["engine_core"] == []
        assert len(procs["workers"]) == 2
        assert set(procs["workers"]) <= set(list_child_processes()) - before
        assert read["num_worker_processes"] == 2
        assert read["distributed_executor_backend"] == "mp"
    assert int(batch["active_mask"].sum()) > 0
    left = set(list_child_processes(include_zombies=True)) - before
    assert not left & set(procs["workers"])
