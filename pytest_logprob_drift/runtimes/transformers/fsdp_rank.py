"""One rank process of the FSDP training scorer: what runs inside it.

Owns the rank side of ``fsdp.FsdpScorerGroup``: the torch.distributed rendezvous (gloo + a CPU
DeviceMesh on CPU, nccl on CUDA), loading the checkpoint and sharding it with
``torch.distributed.fsdp.fully_shard`` (each decoder layer, then the root), the evidence read
back from the live sharded model, scoring each request with the engine's teacher-forced scorer
under the shared read-only guard on this rank's local shards (raw or processed semantics, the
LM head in compute dtype or float32, the full-vocabulary rows of the active positions on
request), importing the selected-logprob function by its ``module:attr`` reference, the layer
diagnostics' capture on request (reduced in the rank: only the reduction leaves it, never a
hidden state), answering every failure with the rank's own traceback, and leaving the process
group. The rank's work is
transport-independent (``start``, ``handle``, ``leave``); two transports call it: the local
rank process's pipe (``main``/``_serve``) and the Ray rank actor (``fsdp_ray``). Speaks to the
parent only through ``fsdp_messages``. Knows nothing about launching or supervising processes,
cases, plans, knobs, thresholds, comparison, artifacts or pytest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from pytest_logprob_drift.execute.readonly import ReadOnlyGuard
from pytest_logprob_drift.records import JsonObject
from pytest_logprob_drift.references import resolve_reference
from pytest_logprob_drift.runtimes.transformers import engine
from pytest_logprob_drift.runtimes.transformers import fsdp_messages as wire

__all__ = ["failed", "handle", "leave", "main", "resolve_logp_backend", "start"]


def resolve_logp_backend(spec: str) -> engine.LogpFn:
    """Import a ``"module:attr"`` (``attr`` may be dotted) selected-logprob function."""
    obj = resolve_reference(spec)
    if not callable(obj):
        raise ValueError(f"logp backend {spec!r} is not callable")
    fn: engine.LogpFn = obj
    return fn


# --------------------------------------------------------------------------- start


def _rendezvous(init: wire.Init, rank: int, local_device: int | None) -> tuple[Any, str]:
    """Join the process group (``env://``: ``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE`` set by
    the transport); return this rank's device mesh and its model device (on CUDA the
    ``local_device`` index, default the rank)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world_size = int(os.environ["WORLD_SIZE"])
    timeout = timedelta(seconds=float(init.op_timeout_s))
    if init.device == "cuda":
        index = rank if local_device is None else local_device
        torch.cuda.set_device(index)
        backend, model_device = "nccl", f"cuda:{index}"
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


def start(
    init: wire.Init, rank: int, pid: int, t0: float, *, local_device: int | None = None
) -> tuple[Any, wire.Ready]:
    """Join the group, load and shard the model: the model and this rank's ``Ready``.

    Transport-independent: the local rank process (``main``) and the Ray rank actor
    (``fsdp_ray.RankActor``) both call it with the ``Init`` they received."""
    torch.set_num_threads(int(init.threads))
    mesh, model_device = _rendezvous(init, rank, local_device)
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
    t3 = time.monotonic()
    weights = _weights(model, Path(init.model_dir), rank)
    startup_s["weights"] = round(time.monotonic() - t3, 3)
    evidence = dataclasses.replace(evidence, weights=weights, startup_s=dict(startup_s))
    return model, wire.Ready(rank=rank, pid=pid, evidence=evidence)


def _weights(model: Any, model_dir: Path, rank: int) -> JsonObject:
    """This rank's part of the gathered weight digests (collective: every rank calls it right
    after sharding); a failure is reported, never raised past the group."""
    from pytest_logprob_drift.runtimes.weights.checkpoint import checkpoint_names
    from pytest_logprob_drift.runtimes.weights.module_digests import FSDP_POINT, module_report

    try:
        return module_report(model, checkpoint_names(model_dir), point=FSDP_POINT, rank=rank)
    except Exception as exc:  # the side's weight check reports it as not checked
        return {"error": f"{type(exc).__name__}: {exc}", "point": FSDP_POINT}


def _start(conn: Connection, rank: int, pid: int, t0: float) -> Any:
    """Receive ``Init`` on the pipe, ``start``, reply ``Ready``."""
    init = wire.receive_request(conn)
    if not isinstance(init, wire.Init):
        raise wire.ProtocolError(f"expected 'init', got {type(init).__name__!r}")
    model, ready = start(init, rank, pid, t0)
    wire.send(conn, ready)
    return model


# --------------------------------------------------------------------------- scoring


def _reshard_all(model: Any) -> None:
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


@dataclass(slots=True)
class _RankScore:
    """One rank's scoring result: the ``[B, L]`` logprobs, the guard that watched it, the
    scored full-vocabulary rows (when asked for) and the logits dtype the head produced."""

    logprobs: Tensor
    guard: ReadOnlyGuard
    full_vocab: Tensor | None
    logits_dtype: str


def _guarded_score(
    model: Any,
    batch: Mapping[str, Tensor],
    batch_size: int,
    logp_fn: engine.LogpFn,
    request: wire.Score,
) -> _RankScore:
    """Score inside this rank under the shared read-only guard, on this rank's local shards
    (resharded before each snapshot), with the engine's teacher-forced scorer exactly as the
    in-process trainer calls it (processed semantics, full-vocabulary rows); the LM head in
    float32 when asked (``engine.lm_head_at_score``). The training scorer never gets a KV
    cache here."""
    guard = ReadOnlyGuard(model, kv_cache_allowed=False, settle=lambda: _reshard_all(model))
    rows: list[Tensor] | None = [] if request.full_vocabulary else None
    with engine.lm_head_at_score(model, request.lm_head_dtype) as seen, guard.watch():
        result = engine.hf_teacher_forced_score(
            model,
            batch,
            batch_size=batch_size,
            logp_fn=logp_fn,
            processed=request.processed,
            full_vocab=rows,
        )
    full = None
    if rows is not None:
        vocab = int(model.config.vocab_size)
        full = torch.cat(rows).float() if rows else torch.zeros((0, vocab))
    return _RankScore(
        logprobs=result, guard=guard, full_vocab=full, logits_dtype=",".join(sorted(set(seen)))
    )


def _scored(model: Any, request: wire.Score, rank: int, pid: int) -> wire.Scored:
    import torch.distributed as dist

    batch = request.tensors()
    logp_fn = resolve_logp_backend(request.logp_backend)
    scored = _guarded_score(model, batch, int(request.batch_size), logp_fn, request)
    guard = scored.guard
    data = wire.result_bytes(scored.logprobs)
    full = None if scored.full_vocab is None else wire.full_vocab_bytes(scored.full_vocab)
    digest = hashlib.sha256(data)
    if full is not None:
        digest.update(full)
    evidence = wire.ScoreEvidence(
        world_size=dist.get_world_size(),
        backend=str(dist.get_backend()),
        result_sha256=digest.hexdigest(),
        state_digest_before=guard.digest_before,
        state_digest_after=guard.digest_after,
        forward_calls=guard.forward_calls,
        readonly_violations=tuple(guard.violations),
        logprob_semantics="raw" if request.processed is None else "processed",
        logits_dtype=scored.logits_dtype,
        full_vocab_rows=0 if scored.full_vocab is None else int(scored.full_vocab.shape[0]),
    )
    return wire.Scored(
        rank=rank,
        pid=pid,
        logprobs=data if rank == 0 else None,
        evidence=evidence,
        full_vocab=full if rank == 0 else None,
    )


def _layers_captured(
    model: Any, request: wire.CaptureLayers, rank: int, pid: int
) -> wire.LayersCaptured:
    """This rank's layer capture of the request's batch (``layer_capture.capture_layers``),
    reduced here. ``lm_head_at_score`` is entered first, so its hook on the LM head (which,
    for a float32 head, returns the recomputed logits) runs before the capture's hook,
    registered after it: forward hooks run in registration order and a returned value
    replaces the output the later hooks see."""
    from pytest_logprob_drift.runtimes.transformers.layer_capture import capture_layers

    batch = request.tensors()
    with engine.lm_head_at_score(model, request.lm_head_dtype):
        reduction = capture_layers(model, batch, batch_size=int(request.batch_size))
    data = wire.layers_bytes(reduction)
    return wire.LayersCaptured(
        rank=rank,
        pid=pid,
        reduction=data if rank == 0 else None,
        reduction_sha256=hashlib.sha256(data).hexdigest(),
    )


def _weights_gathered(model: Any, rank: int, pid: int) -> wire.WeightsGathered:
    """Every rank gathers the whole state (``weight_push.gathered_state``: ``full_tensor()``
    per sharded tensor, in state order, a collective); rank 0 sends it, every rank its
    digest."""
    from pytest_logprob_drift.runtimes.weight_push import gathered_state
    from pytest_logprob_drift.tensorio import tensor_bytes

    t0 = time.perf_counter()
    state = gathered_state(model)
    data = tensor_bytes(state)
    return wire.WeightsGathered(
        rank=rank,
        pid=pid,
        state=data if rank == 0 else None,
        state_sha256=hashlib.sha256(data).hexdigest(),
        gather_s=time.perf_counter() - t0,
    )


def failed(rank: int, pid: int) -> wire.Failed:
    """The exception being handled, as this rank's reply."""
    return wire.Failed(rank=rank, pid=pid, traceback=traceback.format_exc())


def handle(model: Any, request: wire.Request, rank: int, pid: int) -> wire.Reply:
    """This rank's reply to one request after ``start`` (transport-independent): ``Scored``
    or ``LayersCaptured``, or ``Failed`` with the rank's own traceback (also for anything but
    ``Score`` and ``CaptureLayers``)."""
    try:
        if not isinstance(request, wire.Score | wire.CaptureLayers | wire.GatherWeights):
            raise wire.ProtocolError(
                "expected 'score', 'capture layers' or 'gather weights', got "
                f"{type(request).__name__!r}"
            )
        if model is None:
            raise wire.ProtocolError(f"{type(request).__name__!r} before a successful 'init'")
        if isinstance(request, wire.GatherWeights):
            return _weights_gathered(model, rank, pid)
        if isinstance(request, wire.CaptureLayers):
            return _layers_captured(model, request, rank, pid)
        return _scored(model, request, rank, pid)
    except BaseException:
        return failed(rank, pid)


def _serve(conn: Connection, model: Any, rank: int, pid: int) -> None:
    """Answer ``Score`` and ``CaptureLayers`` requests until ``Close`` arrives or the parent
    is gone."""
    while True:
        try:
            request = wire.receive_request(conn)
        except (EOFError, OSError):
            return  # parent is gone
        except wire.ProtocolError:
            wire.send(conn, failed(rank, pid))
            continue
        if isinstance(request, wire.Close):
            return
        wire.send(conn, handle(model, request, rank, pid))


# --------------------------------------------------------------------------- process


def leave() -> None:
    """Leave the process group (if joined)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _leave(conn: Connection) -> None:
    try:
        leave()
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
        wire.send(conn, failed(rank, pid))
        conn.close()
        sys.exit(1)
    _serve(conn, model, rank, pid)
    _leave(conn)
