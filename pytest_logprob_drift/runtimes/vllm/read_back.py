"""Reading back what a live vLLM engine really runs, from vLLM's own objects.

Owns turning a live ``vllm.LLM`` into plain values: the settings vLLM resolved and holds in
``llm.llm_engine.vllm_config`` (its ``model_config``, ``cache_config``, ``parallel_config`` and
``compilation_config``), and what every worker reports about its loaded model through
``DriftWorkerExtension.model_report`` (``collective_rpc``): the attention implementation class
of each attention layer, the tensor-parallel vocabulary shards of the embedding and the LM
head, the LM head weight's dtype, and the sampling parameters of the requests the workers'
batches took in (what the running engine applied, e.g. ``min_p``). Nothing here parses a repr
or consults the spec the engine was built from.

Knows nothing about how the engine was built or shut down, about its processes or environment
(those values are passed in by the engine), or about knobs, cases, comparison or pytest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Final, TypeAlias

import msgspec

from pytest_logprob_drift.records import JsonObject, JsonValue

if TYPE_CHECKING:
    from vllm import LLM

__all__ = [
    "MODEL_REPORT",
    "ModelReport",
    "attention_backend",
    "attention_layers",
    "context_parallel_of",
    "context_parallel_size",
    "eager_of",
    "joined",
    "lm_head_dtype",
    "logp_injection",
    "model_runner",
    "read_back",
    "sampling_applied",
    "sampling_seen",
    "vocab_layout",
    "worker_reports",
]

MODEL_REPORT: Final = "model_report"
"""The ``DriftWorkerExtension`` method each worker answers through ``collective_rpc``."""

_VOCAB_LAYERS: Final = ("embed_tokens", "lm_head")


Count: TypeAlias = Annotated[int, msgspec.Meta(ge=0)]


class VocabShard(msgspec.Struct, frozen=True, kw_only=True):
    """One worker's ``VocabParallelEmbedding`` shard (its ``shard_indices``)."""

    tp_rank: Count
    tp_size: Count
    org_vocab_size: Count
    num_embeddings_padded: Count
    num_embeddings_per_partition: Count
    padded_org_vocab_start_index: Count
    padded_org_vocab_end_index: Count
    org_vocab_start_index: Count
    org_vocab_end_index: Count


class SamplingSeen(msgspec.Struct, frozen=True, kw_only=True):
    """Sampling parameters a worker's batch took in, and how many requests carried them."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    requests: Count


class ModelReport(msgspec.Struct, frozen=True, kw_only=True):
    """One worker's ``DriftWorkerExtension.model_report``, decoded where ``collective_rpc``
    returns it (vLLM sends utility results as plain msgpack). A member a worker did not send
    reads as unreported (its default); members beyond these are dropped."""

    extension_file: str | None = None
    logp: dict[str, Any] | None = None
    """``rollout_logp.report``: the installed kernel's self-description, sealed whole."""
    lm_head_compute_dtype: str | None = None
    sampler_logits_dtypes: tuple[str, ...] | None = None
    sampler_logits_width: int | None = None
    sampling_probe: bool = False
    model_runner: str | None = None
    sampling_probes: tuple[str, ...] = ()
    sampling_seen: tuple[SamplingSeen, ...] | None = None
    attention_backends: tuple[str, ...] = ()
    attention_layers: dict[str, str] = {}
    vocab: dict[str, VocabShard] = {}
    lm_head_dtype: str | None = None


def model_reports(plain: Sequence[object]) -> list[ModelReport]:
    """``collective_rpc``'s plain values as ``ModelReport`` (``msgspec.ValidationError`` naming
    the member of a report that has another shape)."""
    return [msgspec.convert(report, ModelReport) for report in plain]


def worker_reports(llm: LLM) -> list[ModelReport]:
    """Each worker's ``model_report``, in the order vLLM returns them (tensor-parallel rank)."""
    return model_reports(llm.collective_rpc(MODEL_REPORT))


def attention_backend(reports: Sequence[ModelReport]) -> str:
    """The attention implementation class names the workers run, joined; ``unknown`` if none."""
    backends = sorted({name for r in reports for name in r.attention_backends})
    return ",".join(backends) if backends else "unknown"


def vocab_layout(reports: Sequence[ModelReport]) -> dict[str, object]:
    """The TP vocabulary layout the workers' embedding and LM head really have.

    vLLM pads the vocabulary to a multiple of 64 (``DEFAULT_VOCAB_PADDING_SIZE``), then gives
    rank ``r`` the padded rows ``[r * per_rank, (r + 1) * per_rank)``; the real (unpadded)
    tokens it owns are that range clipped to the vocabulary size. Both ranges are the layer's
    own ``shard_indices``.
    """
    layout: dict[str, object] = {}
    for name in _VOCAB_LAYERS:
        shards = [r.vocab[name] for r in reports if name in r.vocab]
        if not shards:
            continue
        first = shards[0]
        layout[name] = {
            "vocab_size": first.org_vocab_size,
            "padded_vocab_size": first.num_embeddings_padded,
            "per_rank_size": first.num_embeddings_per_partition,
            "ranks": [
                {
                    "rank": s.tp_rank,
                    "padded_start": s.padded_org_vocab_start_index,
                    "padded_end": s.padded_org_vocab_end_index,
                    "vocab_start": s.org_vocab_start_index,
                    "vocab_end": s.org_vocab_end_index,
                }
                for s in shards
            ],
        }
    return layout


def lm_head_dtype(reports: Sequence[ModelReport]) -> str:
    """The dtype of the LM head weight the workers loaded, joined if they differ; ``unknown``
    when no worker reported one."""
    return joined(reports, "lm_head_dtype")


def joined(reports: Sequence[ModelReport], key: str) -> str:
    """The workers' values of the member ``key`` (a string, or strings), sorted and joined;
    ``unknown`` when no worker reported one."""
    values: set[str] = set()
    for report in reports:
        value = getattr(report, key)
        if isinstance(value, tuple):
            values.update(str(v) for v in value)
        elif value is not None:
            values.add(str(value))
    return ",".join(sorted(values)) if values else "unknown"


def logp_injection(reports: Sequence[ModelReport]) -> list[dict[str, Any]]:
    """Each worker's ``selected_logprob`` injection report (``rollout_logp.report``), in TP rank
    order: whether a backend is installed, which (id, version, build fingerprint, factory,
    the kernel and its source's SHA-256), the sites patched, the model runner and sampler
    classes, the rows scored per site and the violations counted."""
    return [dict(r.logp or {"installed": "unreported"}) for r in reports]


def model_runner(reports: Sequence[ModelReport]) -> str:
    """The model runner (``v1``, ``v2``) the workers drive, joined if they differ; ``unknown``
    when no worker reported one."""
    return joined(reports, "model_runner")


def sampling_seen(reports: Sequence[ModelReport]) -> list[JsonObject]:
    """The sampling parameters of the requests the workers' model runners took in so far,
    with their counts (``DriftWorkerExtension.model_report``; every tensor-parallel worker
    takes in every request, so the first worker's list is the engine's). Empty when no worker
    runs a probe on the model runner it drives (``sampling_probe``): the adapter then
    reports the call's sampling unobservable."""
    for report in reports:
        if report.sampling_probe and report.sampling_seen is not None:
            return [msgspec.to_builtins(entry) for entry in report.sampling_seen]
    return []


def sampling_applied(
    before: Sequence[Mapping[str, JsonValue]], after: Sequence[Mapping[str, JsonValue]]
) -> JsonObject:
    """What the requests between two ``sampling_seen`` snapshots really ran with.

    ``observed``: whether some request entered a worker's batch in between; ``values``: the
    distinct ``{temperature, top_p, top_k, min_p}`` of those requests (one entry when every
    request of the call ran with the same parameters)."""

    def seen(entries: Sequence[Mapping[str, JsonValue]]) -> list[SamplingSeen]:
        return [msgspec.convert(entry, SamplingSeen) for entry in entries]

    def key(entry: SamplingSeen) -> tuple[float, float, int, float]:
        return (entry.temperature, entry.top_p, entry.top_k, entry.min_p)

    counts = {key(e): e.requests for e in seen(before)}
    new = [e for e in seen(after) if e.requests > counts.get(key(e), 0)]
    return {
        "observed": bool(new),
        "values": [
            {"temperature": t, "top_p": p, "top_k": k, "min_p": m}
            for t, p, k, m in sorted(key(e) for e in new)
        ],
    }


def context_parallel_size(llm: LLM) -> int | str:
    """What ``rollout.context_parallel_size`` reads back as: vLLM 0.32's
    ``parallel_config.prefill_context_parallel_size`` (the setting the knob becomes), when its
    ``decode_context_parallel_size`` is 1. A decode size other than 1 is another setting (it
    shards only the decode KV cache over the TP ranks), never read as this knob: the value is
    then a string naming both sizes, which matches no requested size."""
    parallel: Any = llm.llm_engine.vllm_config.parallel_config
    return context_parallel_of(
        int(parallel.prefill_context_parallel_size), int(parallel.decode_context_parallel_size)
    )


def context_parallel_of(prefill: int, decode: int) -> int | str:
    """``context_parallel_size``'s rule on the two sizes (pure)."""
    if decode != 1:
        return (
            f"mismatch: decode_context_parallel_size={decode} "
            f"(prefill_context_parallel_size={prefill}); this knob is the prefill size"
        )
    return prefill


def eager_of(*, enforce_eager: bool, compilation_mode: str, cudagraph_mode: str) -> bool | str:
    """What ``rollout.enforce_eager`` reads back as, from what the engine resolved rather than
    the flag alone: eager when no compilation (``compilation_mode`` NONE) and no CUDA graphs
    (``cudagraph_mode`` NONE) run. vLLM 0.32 resolves ``enforce_eager=False`` to
    torch.compile (CPU: mode 2; CUDA: ``VLLM_COMPILE`` with CUDA graphs) and
    ``enforce_eager=True`` to neither; anything else (a flag that says eager over a compiled
    engine, or compiled over an eager one, e.g. under batch-invariant mode) is a string naming
    both, which matches no requested value."""
    compiled = compilation_mode not in ("NONE", "0") or cudagraph_mode not in ("NONE", "0")
    if enforce_eager == (not compiled):
        return enforce_eager
    return (
        f"mismatch: enforce_eager={enforce_eager} but compilation mode {compilation_mode}, "
        f"cudagraph_mode {cudagraph_mode}"
    )


def attention_layers(reports: Sequence[ModelReport]) -> dict[str, int]:
    """How many attention layers run each implementation class, on the first worker that
    reports it (every TP rank builds the same layers)."""
    for report in reports:
        if report.attention_layers:
            counts: dict[str, int] = {}
            for impl in report.attention_layers.values():
                counts[impl] = counts.get(impl, 0) + 1
            return dict(sorted(counts.items()))
    return {}


def _enum_name(value: object) -> str:
    name = getattr(value, "name", None)
    return str(name) if name is not None else str(value)


def read_back(
    llm: LLM,
    *,
    is_cpu: bool,
    platform: str,
    process_ids: Mapping[str, Sequence[int]],
    construction_env: Mapping[str, str | None],
    amx_enabled: Sequence[bool],
) -> dict[str, object]:
    """What the live engine really runs, read from vLLM's own objects (never the spec).

    ``platform`` (the platform's device type), ``process_ids`` (``engine_core`` and
    ``workers``), ``construction_env`` and ``amx_enabled`` are what the engine observed
    itself; they are recorded as given (``worker_amx_enabled`` on the CPU platform only: AMX
    is a CPU attention matter, and GPU workers never request it).
    """
    import vllm

    config = llm.llm_engine.vllm_config
    model, cache = config.model_config, config.cache_config
    parallel, compilation = config.parallel_config, config.compilation_config
    reports = worker_reports(llm)
    return {
        "vllm_version": str(vllm.__version__),
        "platform": platform,
        "model": str(model.model),
        "dtype": str(model.dtype).removeprefix("torch."),
        "max_model_len": int(model.max_model_len),
        "seed": model.seed,
        "logprobs_mode": str(model.logprobs_mode),
        "max_logprobs": int(model.max_logprobs),
        "enforce_eager": bool(model.enforce_eager),
        "tensor_parallel_size": int(parallel.tensor_parallel_size),
        "prefill_context_parallel_size": int(parallel.prefill_context_parallel_size),
        "decode_context_parallel_size": int(parallel.decode_context_parallel_size),
        "world_size": int(parallel.world_size),
        "distributed_executor_backend": str(parallel.distributed_executor_backend),
        "enable_prefix_caching": bool(cache.enable_prefix_caching),
        "kv_cache_memory_bytes": cache.kv_cache_memory_bytes,
        "kv_cache_block_size": int(cache.block_size),
        "kv_cache_num_blocks": cache.num_gpu_blocks,
        "compilation_mode": _enum_name(compilation.mode),
        "compilation_backend": str(compilation.backend),
        "cudagraph_mode": _enum_name(compilation.cudagraph_mode),
        "attention_backend": attention_backend(reports),
        "attention_layers": attention_layers(reports),
        "attention_backend_requested": str(
            getattr(getattr(config, "attention_config", None), "backend", None)
        ),
        "enable_trace_replay": bool(getattr(model, "enable_trace_replay", False)),
        "vocab_layout": vocab_layout(reports),
        "lm_head_dtype": lm_head_dtype(reports),
        "lm_head_compute_dtype": joined(reports, "lm_head_compute_dtype"),
        "sampler_logits_dtype": joined(reports, "sampler_logits_dtypes"),
        "sampler_logits_width": joined(reports, "sampler_logits_width"),
        "worker_extension_file": joined(reports, "extension_file"),
        "logp_injection": logp_injection(reports),
        "sampling_seen": sampling_seen(reports),
        "model_runner": model_runner(reports),
        "num_engine_core_processes": len(process_ids["engine_core"]),
        "num_worker_processes": len(process_ids["workers"]),
        "construction_env": dict(construction_env),
        **(
            {"worker_amx_enabled": list(amx_enabled)}
            if is_cpu
            else {"gpu_memory_utilization": float(cache.gpu_memory_utilization)}
        ),
    }
