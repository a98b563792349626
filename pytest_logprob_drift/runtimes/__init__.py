"""Runtime back ends: transformers (and FSDP), vLLM, and a synthetic CPU runtime for tests.

Owns the code that touches torch, transformers and vLLM: the canonical batch both scorers
exchange (``batch``), building and resolving checkpoints (``tiny_model``), the transformers
rollout and teacher-forced scorer with its FSDP rank group (``transformers/``), the vLLM
rollout engine (``vllm/``) and, in its own subpackage published to the frontends through its
own entry-point group, a synthetic CPU runtime with temporary test-only operators. This file
holds the torch-free descriptions of the production runtimes, with the built-in checkpoints
each serves and the starter baseline and standard interventions each executes (what
``logprob-drift init`` writes); every submodule is imported lazily, only when a case executes.

Must not know about planning, cases, artifacts, verdicts or pytest.
"""

from __future__ import annotations

from pytest_logprob_drift.records import (
    BuiltinCheckpoint,
    ContextParallelRule,
    KnobTrial,
    KnobValue,
    RuntimeInfo,
    ScenarioLevel,
)

TINY_SCHEME = "tiny://"
"""The URI scheme of the checkpoints ``tiny_model`` builds from code (torch-free here, so a
reader can tell a tiny URI without importing the builder)."""
_TINY_ATTENTION = {"attention_heads": 2, "kv_heads": 1}
"""The attention heads and KV heads every tiny build has (``tiny_model``; a test keeps them
equal): planning restates them when it refuses context parallelism for a tiny checkpoint."""
TINY_QWEN3 = BuiltinCheckpoint(
    uri="tiny://qwen3-h64-v1",
    vocab_size=1024,
    max_positions=512,
    model_type="qwen3",
    **_TINY_ATTENTION,
)
"""The tiny Qwen3 checkpoint ``tiny_model`` builds from code (its ``TINY_SCHEME`` +
``TINY_QWEN3_NAME``, ``VOCAB_SIZE`` and ``MAX_POSITIONS``; a test keeps them equal). Both
runtimes load it through transformers; vLLM's ``seed + index`` request seeds need no rule of
their own (any accepted seed plus a sample index fits torch's generators)."""

_DTYPE_VALUES = ("bfloat16", "float32")
"""The precisions a dtype trial runs (the baseline's own is left out)."""

BASELINE: tuple[tuple[str, KnobValue], ...] = (
    ("rollout.tensor_parallel_size", 1),
    ("rollout.enable_prefix_caching", False),
    ("rollout.enforce_eager", True),
    ("training.attention_backend", "sdpa"),
    ("training.sharding", "none"),
    ("logp.backend", "native"),
)
"""A starter baseline on both production runtimes (rollout and training dtype: the
checkpoint's own; ``batch.size``: the prompts, up to a few)."""

ROLLOUT_DTYPE = KnobTrial(
    path="rollout.dtype",
    values=_DTYPE_VALUES,
    description="The rollout engine in another precision (training unchanged): how far the "
    "rollout's logprobs move from the trainer's when only the sampler's dtype changes.",
)
TRAINING_DTYPE = KnobTrial(
    path="training.compute_dtype",
    values=_DTYPE_VALUES,
    description="The trainer's forward pass in another precision (rollout unchanged).",
)
TRAINING_ATTENTION = KnobTrial(
    path="training.attention_backend",
    values=("eager",),
    description="The trainer's attention kernel: eager instead of SDPA.",
)
BATCH_ONE = KnobTrial(
    path="batch.size",
    values=(1,),
    description="One prompt at a time on both sides instead of a padded batch: does padding "
    "or batch composition move a logprob?",
)
FSDP = KnobTrial(
    path="training.sharding",
    values=("fsdp",),
    description="The trainer sharded with FSDP2 over two ranks instead of one unsharded model.",
)
HF_TRIALS = (ROLLOUT_DTYPE, TRAINING_DTYPE, TRAINING_ATTENTION, BATCH_ONE, FSDP)
VLLM_TRIALS = (
    ROLLOUT_DTYPE,
    TRAINING_DTYPE,
    KnobTrial(
        path="rollout.tensor_parallel_size",
        values=(2,),
        description="The rollout engine with tensor parallelism over two ranks.",
    ),
    KnobTrial(
        path="rollout.enforce_eager",
        values=(False,),
        description="vLLM's compiled/graph path instead of eager execution.",
    ),
    KnobTrial(
        path="rollout.enable_prefix_caching",
        values=(True,),
        description="vLLM's prefix cache on: shared prompt prefixes served from cached KV.",
    ),
    FSDP,
    BATCH_ONE,
)

TINY_ARCHITECTURES = tuple(
    BuiltinCheckpoint(
        uri=f"tiny://{name}-h64-v1",
        vocab_size=1024,
        max_positions=512,
        model_type=name,
        **_TINY_ATTENTION,
    )
    for name in ("llama", "qwen2", "mistral")
)
"""The tiny Llama, Qwen2 and Mistral builds of ``tiny_model.TINY_ARCHITECTURES`` (same
vocabulary and context as the tiny Qwen3; a test keeps them equal)."""
TINY_QWEN3_DEEP = BuiltinCheckpoint(
    uri="tiny://qwen3-deep-l8-h64-v1",
    vocab_size=1024,
    max_positions=512,
    model_type="qwen3",
    **_TINY_ATTENTION,
)
"""The deep tiny Qwen3 (``tiny_model.TINY_QWEN3_DEEP_NAME``: 8 decoder layers, otherwise the
tiny one's tokenizer and widths), for the layer diagnostics."""
TINY_MOE_ARCHITECTURES = tuple(
    BuiltinCheckpoint(
        uri=f"tiny://{name}-h128-v1",
        vocab_size=1024,
        max_positions=512,
        model_type=model_type,
        **_TINY_ATTENTION,
    )
    for name, model_type in (("qwen3-moe", "qwen3_moe"), ("olmoe", "olmoe"))
)
"""The tiny mixture-of-experts builds of ``tiny_model.TINY_MOE_ARCHITECTURES`` (4 experts,
top-2, every layer MoE; same vocabulary and context as the tiny Qwen3)."""
TINY_CHECKPOINTS = (TINY_QWEN3, *TINY_ARCHITECTURES, TINY_QWEN3_DEEP, *TINY_MOE_ARCHITECTURES)

VOCAB_PARALLEL = "vocab_parallel_collectives"
"""The alignment property of a backend that combines vocabulary shards with collectives
(``rlkernel.vocab_parallel_logp``)."""

HF_LOGP_REFUSALS = (
    (
        "rollout",
        VOCAB_PARALLEL,
        "the transformers rollout is one unsharded model in this process: there is no "
        "process group to combine vocabulary shards over",
    ),
)
VLLM_LOGP_REFUSALS = (
    (
        "rollout",
        VOCAB_PARALLEL,
        "vLLM's LogitsProcessor all-gathers the logits over the TP ranks before its sampler, "
        "so every rank's sampler (where the backend is injected) already holds the full "
        "vocabulary; a vocabulary-parallel backend would issue its collectives inside vLLM's "
        "sampler step, on a process group vLLM does not hand out, to re-combine logits that "
        "are already whole",
    ),
)

VLLM_EXECUTES_ON = (
    ("cpu", (ScenarioLevel.S0, ScenarioLevel.S1)),
    ("cuda", (ScenarioLevel.S0, ScenarioLevel.S1, ScenarioLevel.S2, ScenarioLevel.S3)),
)
"""Where the ``vllm-hf`` runtime executes. On cpu: S0 and S1 (tensor parallelism over CPU
ranks and FSDP over gloo, which run here). S2 and S3 name accelerator milestones (vLLM TP
against FSDP on GPUs; Qwen3-8B TP=4 CP=4) and are not meant to execute on cpu: the same
comparisons at CPU scale are S1. On cuda every level is declared executable; what a case
needs beyond its level (GPUs for its TP and FSDP sizes, vLLM's CUDA build, a checkpoint vLLM
can run context parallelism for) is checked per case, at planning where it can be and before
any engine starts otherwise. None of it has run on a GPU here (docs/GPU.md)."""

VLLM_CONTEXT_PARALLEL = ContextParallelRule(
    devices=("cuda",),
    needs_mla=True,
    setting="vLLM's prefill_context_parallel_size",
    rule="it becomes vLLM's prefill_context_parallel_size, which vLLM 0.32 runs only on CUDA, "
    "on model runner V2 ('Model Runner V1 does not support: prefill context parallel') and "
    "only for MLA models (PCPManager.validate_config: 'MRV2 PCP currently supports MLA "
    "models only')",
    not_substituted="vLLM's decode_context_parallel_size is a different setting (it reuses the "
    "TP ranks, shards only the decode KV cache, and for a GQA model needs TP > KV heads) and "
    "is not put in its place",
)
"""How ``vllm-hf`` runs ``rollout.context_parallel_size`` (read from vLLM 0.32's source and its
config validation on CPU; never run on a GPU here)."""

HF = RuntimeInfo(
    name="hf",
    # cuda: one GPU, both models on it (FSDP there needs two)
    executes_on=(("cpu", (ScenarioLevel.S0,)), ("cuda", (ScenarioLevel.S0,))),
    adapter="pytest_logprob_drift.runtimes.transformers.adapter:HfAdapter",
    extra="hf",
    summary="transformers KV-cache generation vs transformers teacher-forced (FSDP opt.)",
    checkpoints=TINY_CHECKPOINTS,
    baseline=BASELINE,
    interventions=HF_TRIALS,
    logp_refusals=HF_LOGP_REFUSALS,
)
VLLM_HF = RuntimeInfo(
    name="vllm-hf",
    executes_on=VLLM_EXECUTES_ON,
    context_parallel=VLLM_CONTEXT_PARALLEL,
    rollout_spreads=True,
    cuda_build="vllm",
    adapter="pytest_logprob_drift.runtimes.vllm.adapter:VllmHfAdapter",
    extra="vllm",
    summary="vLLM rollout engine vs transformers teacher-forced (FSDP opt.)",
    checkpoints=TINY_CHECKPOINTS,
    baseline=BASELINE,
    interventions=VLLM_TRIALS,
    logp_refusals=VLLM_LOGP_REFUSALS,
)

PRODUCTION_RUNTIMES: tuple[RuntimeInfo, ...] = (HF, VLLM_HF)
