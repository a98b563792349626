"""The training scorer sharded with FSDP2 over real, separate rank processes.

Owns: launching ``world_size`` rank processes (``python -c`` subprocesses, so callers need no
``if __name__ == "__main__"`` guard), the torch.distributed rendezvous (gloo + a CPU
DeviceMesh on CPU, nccl on CUDA), loading the checkpoint in every rank and sharding it with
``torch.distributed.fsdp.fully_shard`` (each decoder layer, then the root), running the
read-only teacher-forced scorer of ``hf_engine`` on every rank, reporting evidence read inside
the ranks, propagating a rank's failure as an exception carrying the rank's own error text, and
tearing everything down exactly once (also after a failed start or a rank crash).

Parent and ranks talk over one private socket pair per rank (inherited file descriptor, POSIX
only); tensors cross it as ``torch.save`` bytes and are read back with ``weights_only=True``.

Must not know about cases, plans, knobs, thresholds, comparison, artifacts or pytest.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Final

import torch
from torch import Tensor

from pytest_logprob_drift.errors import RuntimeFailure
from pytest_logprob_drift.execute.readonly import ReadOnlyGuard
from pytest_logprob_drift.runtimes.transformers import engine as hf_engine

__all__ = [
    "NATIVE_LOGP",
    "REFERENCE_LOGP",
    "FsdpScorerError",
    "FsdpScorerGroup",
    "resolve_logp_backend",
]

_ENGINE: Final = "pytest_logprob_drift.runtimes.transformers.engine"
NATIVE_LOGP: Final = f"{_ENGINE}:native_selected_logprob"
REFERENCE_LOGP: Final = f"{_ENGINE}:reference_selected_logprob"

_FD_ENV: Final = "LOGPROB_DRIFT_RANK_FD"
_RANK_ENTRY: Final = (
    "from pytest_logprob_drift.runtimes.transformers.fsdp import _rank_main; _rank_main()"
)
_LOG_TAIL: Final = 4000


class FsdpScorerError(RuntimeFailure):
    """A rank failed (exception, crash or timeout); the message carries the rank's own text."""


def resolve_logp_backend(spec: str) -> hf_engine.LogpFn:
    """Import a ``"module:attr"`` (``attr`` may be dotted) selected-logprob function."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"logp backend {spec!r} is not a 'module:attr' import string")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"logp backend {spec!r} is not callable")
    fn: hf_engine.LogpFn = obj
    return fn


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _to_bytes(tensors: Mapping[str, Tensor]) -> bytes:
    buf = io.BytesIO()
    torch.save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, buf)
    return buf.getvalue()


def _from_bytes(data: bytes) -> dict[str, Tensor]:
    loaded = torch.load(io.BytesIO(data), weights_only=True)
    if not isinstance(loaded, dict):
        raise TypeError("expected a dict of tensors")
    return {str(k): v for k, v in loaded.items()}


# --------------------------------------------------------------------------- parent side


@dataclass
class _GroupState:
    """Everything teardown needs; deliberately holds no reference to the group object."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    conns: list[Connection] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    workdir: tempfile.TemporaryDirectory[str] | None = None
    master_port: int = 0
    failed: bool = False
    closed: bool = False


def _shutdown(state: _GroupState, grace_s: float) -> None:
    """Ask ranks to leave the process group, wait, kill survivors, release everything."""
    if state.closed:
        return
    state.closed = True
    for conn in state.conns:
        try:
            conn.send(("close",))
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + (min(grace_s, 2.0) if state.failed else grace_s)
    for proc in state.procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in state.procs:
        if proc.poll() is None:
            proc.kill()
            try:
                proc.wait(timeout=10.0)
            except subprocess.TimeoutExpired:  # pragma: no cover - unkillable process
                pass
    for conn in state.conns:
        conn.close()
    if state.workdir is not None:
        state.workdir.cleanup()


def _log_tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-_LOG_TAIL:].decode(errors="replace")


class FsdpScorerGroup:
    """``world_size`` rank processes holding one FSDP2-sharded model, scoring on demand.

    Use as a context manager (or call ``close()``). Construction raises ValueError for an
    unsupported dtype/attention/device value and FsdpScorerError when a rank fails to start;
    either way no rank process survives. ``score`` raises FsdpScorerError with the failing
    rank's text when any rank fails, and the group is then closed.
    """

    def __init__(
        self,
        model_dir: Path,
        *,
        dtype: str,
        attn_implementation: str,
        world_size: int = 2,
        device: str = "cpu",
        start_timeout_s: float = 300.0,
        op_timeout_s: float = 600.0,
        close_grace_s: float = 20.0,
    ) -> None:
        if dtype not in hf_engine.DTYPES:
            raise ValueError(
                f"unsupported dtype {dtype!r} (supported: {', '.join(hf_engine.DTYPES)})"
            )
        if attn_implementation not in hf_engine.ATTN_IMPLEMENTATIONS:
            raise ValueError(f"unsupported attn_implementation {attn_implementation!r}")
        if device not in ("cpu", "cuda"):
            raise ValueError(f"unsupported device {device!r} (supported: 'cpu', 'cuda')")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if device == "cuda" and torch.cuda.device_count() < world_size:
            raise ValueError(
                f"world_size {world_size} needs {world_size} CUDA devices, "
                f"found {torch.cuda.device_count()}"
            )
        self._world_size = world_size
        self._op_timeout_s = op_timeout_s
        self._state = _GroupState()
        self._finalizer = weakref.finalize(self, _shutdown, self._state, close_grace_s)
        self._ready: list[dict[str, Any]] = []
        try:
            self._launch(Path(model_dir), dtype, attn_implementation, device, op_timeout_s)
            replies = self._collect("ready", start_timeout_s)
            self._ready = [reply[3] for reply in replies]
        except BaseException:
            self._state.failed = True
            self.close()
            raise

    # -- lifecycle ---------------------------------------------------------------------------

    def _launch(
        self, model_dir: Path, dtype: str, attn: str, device: str, op_timeout_s: float
    ) -> None:
        state = self._state
        state.workdir = tempfile.TemporaryDirectory(prefix="logprob-drift-fsdp-")
        state.master_port = _free_port()
        threads_env = os.environ.get("OMP_NUM_THREADS", "")
        threads = (
            int(threads_env)
            if threads_env.isdigit() and int(threads_env) > 0
            else max(1, (os.cpu_count() or 1) // self._world_size)
        )
        path_entries = [p or os.getcwd() for p in sys.path]
        existing = os.environ.get("PYTHONPATH")
        if existing:
            path_entries.append(existing)
        config = {
            "model_dir": str(model_dir.resolve()),
            "dtype": dtype,
            "attn_implementation": attn,
            "device": device,
            "op_timeout_s": op_timeout_s,
            "threads": threads,
        }
        for rank in range(self._world_size):
            parent_end, child_end = multiprocessing.Pipe(duplex=True)
            env = dict(os.environ)
            env.update(
                {
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(state.master_port),
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": str(self._world_size),
                    "LOCAL_WORLD_SIZE": str(self._world_size),
                    "PYTHONPATH": os.pathsep.join(path_entries),
                    _FD_ENV: str(child_end.fileno()),
                }
            )
            env["OMP_NUM_THREADS"] = str(threads)
            log = Path(state.workdir.name) / f"rank{rank}.log"
            state.logs.append(log)
            state.conns.append(parent_end)  # closed by _shutdown even if Popen fails
            with log.open("wb") as log_file:
                try:
                    proc = subprocess.Popen(
                        [sys.executable, "-c", _RANK_ENTRY],
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        pass_fds=(child_end.fileno(),),
                    )
                finally:
                    child_end.close()
            state.procs.append(proc)
            parent_end.send(("init", config))

    def close(self) -> None:
        """Leave the process group in every rank, join them, kill survivors. Idempotent."""
        self._finalizer()

    def __enter__(self) -> FsdpScorerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._state.closed

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._state.procs]

    @property
    def master_port(self) -> int:
        return self._state.master_port

    # -- messaging ---------------------------------------------------------------------------

    def _rank_failure(self, rank: int, what: str) -> FsdpScorerError:
        self._state.failed = True
        tail = _log_tail(self._state.logs[rank]) if rank < len(self._state.logs) else ""
        detail = f"\n--- rank {rank} output (tail) ---\n{tail}" if tail.strip() else ""
        return FsdpScorerError(f"FSDP rank {rank} {what}{detail}")

    def _collect(self, kind: str, timeout_s: float) -> list[tuple[Any, ...]]:
        """One reply of ``kind`` from every rank, in rank order; fail fast on any rank failure."""
        state = self._state
        replies: dict[int, tuple[Any, ...]] = {}
        deadline = time.monotonic() + timeout_s
        while len(replies) < self._world_size:
            pending = [c for r, c in enumerate(state.conns) if r not in replies]
            for conn in wait(pending, timeout=0.5):
                assert isinstance(conn, Connection)
                rank = state.conns.index(conn)
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    try:
                        code: int | None = state.procs[rank].wait(timeout=10.0)
                    except subprocess.TimeoutExpired:
                        code = None
                    what = "closed its channel" if code is None else f"exited (code {code})"
                    raise self._rank_failure(rank, what) from None
                if msg[0] == "error":
                    raise self._rank_failure(rank, f"failed:\n{msg[3]}")
                if msg[0] != kind:
                    raise self._rank_failure(rank, f"sent {msg[0]!r}, expected {kind!r}")
                replies[rank] = msg
            for rank, proc in enumerate(state.procs):
                if rank not in replies and proc.poll() is not None:
                    conn = state.conns[rank]
                    if conn.poll():  # its last words are still in the pipe
                        break
                    raise self._rank_failure(rank, f"exited (code {proc.returncode})")
            if time.monotonic() > deadline:
                missing = sorted(set(range(self._world_size)) - set(replies))
                raise self._rank_failure(
                    missing[0], f"timed out after {timeout_s:.0f}s waiting for {kind!r}"
                )
        return [replies[r] for r in range(self._world_size)]

    # -- scoring -----------------------------------------------------------------------------

    def score(
        self, batch: Mapping[str, Tensor], *, batch_size: int, logp_backend: str
    ) -> tuple[Tensor, dict[str, object]]:
        """Teacher-forced logprobs of the canonical ``batch`` (float32 ``[B, L]``) + evidence.

        Every rank scores the full batch (FSDP shards parameters, not data); rank 0's result is
        returned. ``logp_backend`` is a ``"module:attr"`` string imported inside the ranks.
        """
        if self._state.closed:
            raise FsdpScorerError("the FSDP scorer group is closed")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if ":" not in logp_backend:
            raise ValueError(f"logp backend {logp_backend!r} is not a 'module:attr' import string")
        hf_engine.validate_canonical_batch(batch)
        payload = _to_bytes(
            {k: batch[k] for k in ("token_ids", "attention_mask", "active_mask", "position_ids")}
        )
        try:
            for conn in self._state.conns:
                conn.send(("score", payload, batch_size, logp_backend))
            replies = self._collect("scored", self._op_timeout_s)
        except BaseException:
            self._state.failed = True
            self.close()
            raise
        result = _from_bytes(replies[0][3])["logprobs"]
        digests = [reply[4]["result_sha256"] for reply in replies]
        ev = [reply[4] for reply in replies]
        ready = self._ready
        evidence: dict[str, object] = {
            "world_size": ev[0]["world_size"],
            "backend": ev[0]["backend"],
            "rank_pids": [reply[2] for reply in replies],
            "fsdp": "fully_shard",
            "param_dtype": ready[0]["param_dtype"],
            "attn_implementation": ready[0]["attn_implementation"],
            "device": ready[0]["device"],
            "device_mesh": ready[0]["device_mesh"],
            "num_parameters": ready[0]["num_parameters"],
            "local_param_numel": [r["local_param_numel"] for r in ready],
            "sharded_modules": ready[0]["sharded_modules"],
            "param_placements": ready[0]["param_placements"],
            "logp_backend": logp_backend,
            "rank_startup_s": [r["startup_s"] for r in ready],
            "ranks_agree": len(set(digests)) == 1,
            "readonly_violations": [
                f"rank {rank}: {v}" for rank, e in enumerate(ev) for v in e["readonly_violations"]
            ],
            "state_digests_before": [e["state_digest_before"] for e in ev],
            "state_digests_after": [e["state_digest_after"] for e in ev],
            "forward_calls": [e["forward_calls"] for e in ev],
            "rank_world_sizes": [e["world_size"] for e in ev],
        }
        return result, evidence


# --------------------------------------------------------------------------- rank side


def _shard(model: Any, mesh: Any) -> list[str]:
    from torch.distributed.fsdp import fully_shard

    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    names = [f"{type(m).__name__} x{len(layers)}" for m in layers[:1]] + [type(model).__name__]
    # Inference only: every group (the root too) frees its unsharded parameters after forward,
    # so between calls each rank holds exactly its shards.
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    return names


def _reshard_all(model: Any) -> None:
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def _rank_ready_evidence(model: Any, mesh: Any, sharded: list[str]) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    actual = hf_engine.read_back(model)
    local = 0
    placements: set[str] = set()
    for p in model.parameters():
        if isinstance(p, DTensor):
            local += p.to_local().numel()
            placements.add(str(tuple(p.placements)))
        else:
            local += p.numel()
            placements.add("replicated(plain tensor)")
    return {
        "param_dtype": actual["param_dtype"],
        "attn_implementation": actual["attn_implementation"],
        "device": actual["device"],
        "num_parameters": actual["num_parameters"],
        "local_param_numel": local,
        "param_placements": sorted(placements),
        "device_mesh": str(mesh),
        "sharded_modules": sharded,
        "world_size": dist.get_world_size(),
        "backend": str(dist.get_backend()),
    }


def _guarded_score(
    model: Any, batch: Mapping[str, Tensor], batch_size: int, logp_fn: hf_engine.LogpFn
) -> tuple[Tensor, dict[str, Any]]:
    """Score inside this rank under the shared read-only guard, on this rank's local shards
    (resharded before each snapshot). The training scorer never gets a KV cache here."""
    guard = ReadOnlyGuard(model, kv_cache_allowed=False, settle=lambda: _reshard_all(model))
    with guard.watch():
        result = hf_engine.hf_teacher_forced_score(
            model, batch, batch_size=batch_size, logp_fn=logp_fn
        )
    return result, {
        "state_digest_before": guard.digest_before,
        "state_digest_after": guard.digest_after,
        "forward_calls": guard.forward_calls,
        "readonly_violations": list(guard.violations),
    }


def _rank_main() -> None:
    """Entry point of one rank process (started by FsdpScorerGroup, never by users)."""
    t0 = time.monotonic()
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    conn = Connection(int(os.environ[_FD_ENV]))
    rank = int(os.environ["RANK"])
    pid = os.getpid()
    model: Any = None
    try:
        kind, cfg = conn.recv()
        if kind != "init":
            raise RuntimeError(f"expected 'init', got {kind!r}")
        torch.set_num_threads(int(cfg["threads"]))
        world_size = int(os.environ["WORLD_SIZE"])
        device: str = cfg["device"]
        timeout = timedelta(seconds=float(cfg["op_timeout_s"]))
        if device == "cuda":
            torch.cuda.set_device(rank)
            dist.init_process_group("nccl", rank=rank, world_size=world_size, timeout=timeout)
            model_device = f"cuda:{rank}"
        else:
            dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timeout)
            model_device = "cpu"
        mesh = init_device_mesh(device, (world_size,))
        t1 = time.monotonic()
        model = hf_engine.load_model(
            Path(cfg["model_dir"]),
            dtype=cfg["dtype"],
            attn_implementation=cfg["attn_implementation"],
            device=model_device,
        )
        t2 = time.monotonic()
        sharded = _shard(model, mesh)
        model.eval()
        evidence = _rank_ready_evidence(model, mesh, sharded)
        evidence["startup_s"] = {
            "rendezvous": round(t1 - t0, 3),
            "load": round(t2 - t1, 3),
            "shard": round(time.monotonic() - t2, 3),
        }
        conn.send(("ready", rank, pid, evidence))
    except BaseException:
        conn.send(("error", rank, pid, traceback.format_exc()))
        conn.close()
        sys.exit(1)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break  # parent is gone
        if msg[0] == "close":
            break
        try:
            _, payload, batch_size, logp_backend = msg
            batch = _from_bytes(payload)
            logp_fn = resolve_logp_backend(logp_backend)
            result, guard = _guarded_score(model, batch, int(batch_size), logp_fn)
            data = _to_bytes({"logprobs": result})
            evidence = {
                "world_size": dist.get_world_size(),
                "backend": str(dist.get_backend()),
                "result_sha256": hashlib.sha256(data).hexdigest(),
                **guard,
            }
            conn.send(("scored", rank, pid, data if rank == 0 else None, evidence))
        except BaseException:
            conn.send(("error", rank, pid, traceback.format_exc()))
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    finally:
        conn.close()
