"""One rank process of the FSDP training scorer: what runs inside it.

Owns the rank side of ``fsdp.FsdpScorerGroup``: the torch.distributed rendezvous (gloo + a CPU
DeviceMesh on CPU, nccl on CUDA), loading the checkpoint and sharding it with
``torch.distributed.fsdp.fully_shard`` (each decoder layer, then the root), the evidence read
back from the live sharded model, scoring each request with the engine's teacher-forced scorer
under the shared read-only guard on this rank's local shards, importing the selected-logprob
function by its ``module:attr`` reference, answering every failure with the rank's own
traceback, and leaving the process group. Speaks to the parent only through
``fsdp_messages``. Knows nothing about launching or supervising processes, cases, plans,
knobs, thresholds, comparison, artifacts or pytest.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import traceback
from collections.abc import Mapping
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from pytest_logprob_drift.execute.readonly import ReadOnlyGuard
from pytest_logprob_drift.references import resolve_reference
from pytest_logprob_drift.runtimes.transformers import engine
from pytest_logprob_drift.runtimes.transformers import fsdp_messages as wire

__all__ = ["main", "resolve_logp_backend"]


def resolve_logp_backend(spec: str) -> engine.LogpFn:
    """Import a ``"module:attr"`` (``attr`` may be dotted) selected-logprob function."""
    obj = resolve_reference(spec)
    if not callable(obj):
        raise ValueError(f"logp backend {spec!r} is not callable")
    fn: engine.LogpFn = obj
    return fn


# --------------------------------------------------------------------------- start


def _rendezvous(init: wire.Init, rank: int) -> tuple[Any, str]:
    """Join the process group; return this rank's device mesh and its model device."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world_size = int(os.environ["WORLD_SIZE"])
    timeout = timedelta(seconds=float(init.op_timeout_s))
    if init.device == "cuda":
        torch.cuda.set_device(rank)
        backend, model_device = "nccl", f"cuda:{rank}"
    else:
        backend, model_device = "gloo", "cpu"
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
    return init_device_mesh(init.device, (world_size,)), model_device


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


def _ready_evidence(
    model: Any, mesh: Any, sharded: list[str], startup_s: Mapping[str, float]
) -> wire.ReadyEvidence:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    actual = engine.read_back(model)
    local = 0
    placements: set[str] = set()
    for p in model.parameters():
        if isinstance(p, DTensor):
            local += p.to_local().numel()
            placements.add(str(tuple(p.placements)))
        else:
            local += p.numel()
            placements.add("replicated(plain tensor)")
    return wire.ReadyEvidence(
        param_dtype=str(actual["param_dtype"]),
        attn_implementation=str(actual["attn_implementation"]),
        device=str(actual["device"]),
        num_parameters=int(str(actual["num_parameters"])),
        local_param_numel=local,
        param_placements=tuple(sorted(placements)),
        device_mesh=str(mesh),
        sharded_modules=tuple(sharded),
        world_size=dist.get_world_size(),
        backend=str(dist.get_backend()),
        startup_s=dict(startup_s),
    )


def _start(conn: Connection, rank: int, pid: int, t0: float) -> Any:
    """Receive ``Init``, join the group, load and shard the model, reply ``Ready``."""
    init = wire.receive_request(conn)
    if not isinstance(init, wire.Init):
        raise wire.ProtocolError(f"expected 'init', got {type(init).__name__!r}")
    torch.set_num_threads(int(init.threads))
    mesh, model_device = _rendezvous(init, rank)
    t1 = time.monotonic()
    model = engine.load_model(
        Path(init.model_dir),
        dtype=init.dtype,
        attn_implementation=init.attn_implementation,
        device=model_device,
    )
    t2 = time.monotonic()
    sharded = _shard(model, mesh)
    model.eval()
    startup_s = {
        "rendezvous": round(t1 - t0, 3),
        "load": round(t2 - t1, 3),
        "shard": round(time.monotonic() - t2, 3),
    }
    evidence = _ready_evidence(model, mesh, sharded, startup_s)
    wire.send(conn, wire.Ready(rank=rank, pid=pid, evidence=evidence))
    return model


# --------------------------------------------------------------------------- scoring


def _reshard_all(model: Any) -> None:
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def _guarded_score(
    model: Any, batch: Mapping[str, Tensor], batch_size: int, logp_fn: engine.LogpFn
) -> tuple[Tensor, ReadOnlyGuard]:
    """Score inside this rank under the shared read-only guard, on this rank's local shards
    (resharded before each snapshot). The training scorer never gets a KV cache here."""
    guard = ReadOnlyGuard(model, kv_cache_allowed=False, settle=lambda: _reshard_all(model))
    with guard.watch():
        result = engine.hf_teacher_forced_score(
            model, batch, batch_size=batch_size, logp_fn=logp_fn
        )
    return result, guard


def _scored(model: Any, request: wire.Score, rank: int, pid: int) -> wire.Scored:
    import torch.distributed as dist

    batch = request.tensors()
    logp_fn = resolve_logp_backend(request.logp_backend)
    result, guard = _guarded_score(model, batch, int(request.batch_size), logp_fn)
    data = wire.result_bytes(result)
    evidence = wire.ScoreEvidence(
        world_size=dist.get_world_size(),
        backend=str(dist.get_backend()),
        result_sha256=hashlib.sha256(data).hexdigest(),
        state_digest_before=guard.digest_before,
        state_digest_after=guard.digest_after,
        forward_calls=guard.forward_calls,
        readonly_violations=tuple(guard.violations),
    )
    return wire.Scored(rank=rank, pid=pid, logprobs=data if rank == 0 else None, evidence=evidence)


def _failed(rank: int, pid: int) -> wire.Failed:
    """The exception being handled, as this rank's reply."""
    return wire.Failed(rank=rank, pid=pid, traceback=traceback.format_exc())


def _serve(conn: Connection, model: Any, rank: int, pid: int) -> None:
    """Answer ``Score`` requests until ``Close`` arrives or the parent is gone."""
    while True:
        try:
            request = wire.receive_request(conn)
        except (EOFError, OSError):
            return  # parent is gone
        except wire.ProtocolError:
            wire.send(conn, _failed(rank, pid))
            continue
        if isinstance(request, wire.Close):
            return
        try:
            if not isinstance(request, wire.Score):
                raise wire.ProtocolError(f"expected 'score', got {type(request).__name__!r}")
            wire.send(conn, _scored(model, request, rank, pid))
        except BaseException:
            wire.send(conn, _failed(rank, pid))


# --------------------------------------------------------------------------- process


def _leave(conn: Connection) -> None:
    import torch.distributed as dist

    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    finally:
        conn.close()


def main() -> None:
    """Entry point of one rank process (started by FsdpScorerGroup, never by users)."""
    t0 = time.monotonic()
    conn = Connection(int(os.environ[wire.CHANNEL_FD_ENV]))
    rank = int(os.environ["RANK"])
    pid = os.getpid()
    try:
        model = _start(conn, rank, pid, t0)
    except BaseException:
        wire.send(conn, _failed(rank, pid))
        conn.close()
        sys.exit(1)
    _serve(conn, model, rank, pid)
    _leave(conn)
