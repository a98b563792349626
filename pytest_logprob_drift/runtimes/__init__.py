"""Runtime back ends: transformers (and FSDP), vLLM, and a synthetic CPU runtime for tests.

Owns the code that touches torch, transformers and vLLM: the canonical batch both scorers
exchange (``batch``), building and resolving checkpoints (``tiny_model``), the transformers
rollout and teacher-forced scorer with its FSDP rank group (``transformers/``), the vLLM
rollout engine (``vllm/``) and, in its own subpackage published to the frontends through its
own entry-point group, a synthetic CPU runtime with temporary test-only operators. This file
holds the torch-free descriptions of the production runtimes, with the built-in checkpoints
each serves; every submodule is imported lazily, only when a case executes.

Must not know about planning, cases, artifacts, verdicts or pytest.
"""

from __future__ import annotations

from pytest_logprob_drift.records import BuiltinCheckpoint, RuntimeInfo, ScenarioLevel

TINY_QWEN3 = BuiltinCheckpoint(uri="tiny://qwen3-h64-v1", vocab_size=1024, max_positions=512)
"""The tiny Qwen3 checkpoint ``tiny_model`` builds from code (its ``TINY_SCHEME`` +
``TINY_QWEN3_NAME``, ``VOCAB_SIZE`` and ``MAX_POSITIONS``; a test keeps them equal). Both
runtimes load it through transformers; vLLM's ``seed + index`` request seeds need no rule of
their own (any accepted seed plus a sample index fits torch's generators)."""

TINY_ARCHITECTURES = tuple(
    BuiltinCheckpoint(uri=f"tiny://{name}", vocab_size=1024, max_positions=512)
    for name in ("llama-h64-v1", "qwen2-h64-v1", "mistral-h64-v1")
)
"""The tiny Llama, Qwen2 and Mistral builds of ``tiny_model.TINY_ARCHITECTURES`` (same
vocabulary and context as the tiny Qwen3; a test keeps them equal)."""
TINY_CHECKPOINTS = (TINY_QWEN3, *TINY_ARCHITECTURES)

HF = RuntimeInfo(
    name="hf",
    levels=(ScenarioLevel.S0,),
    devices=("cpu", "cuda"),  # cuda: one GPU, both models on it (FSDP there needs two)
    adapter="pytest_logprob_drift.runtimes.transformers.adapter:HfAdapter",
    extra="hf",
    summary="transformers KV-cache generation vs transformers teacher-forced (FSDP opt.)",
    checkpoints=TINY_CHECKPOINTS,
)
VLLM_HF = RuntimeInfo(
    name="vllm-hf",
    levels=(ScenarioLevel.S0, ScenarioLevel.S1),
    devices=("cpu",),
    adapter="pytest_logprob_drift.runtimes.vllm.adapter:VllmHfAdapter",
    extra="vllm",
    summary="vLLM rollout engine vs transformers teacher-forced (FSDP opt.)",
    checkpoints=TINY_CHECKPOINTS,
)

PRODUCTION_RUNTIMES: tuple[RuntimeInfo, ...] = (HF, VLLM_HF)
