"""The training scorer sharded with FSDP2 over real, separate rank processes: the parent side.

Owns launching ``world_size`` rank processes (``python -c`` subprocesses running
``fsdp_rank.main``, so callers need no ``if __name__ == "__main__"`` guard) with their
torch.distributed environment, one private channel per rank, supervising them (a rank's
failure, crash or timeout becomes ``FsdpScorerError`` carrying the rank's own text), assembling
the ranks' replies into one result and one evidence record (a score, or a layer capture's
reduction), and tearing everything down
exactly once (also after a failed start or a rank crash). The transport is replaceable: a
subclass supplies its own ``_new_state``/``_SHUTDOWN``/``_launch``/``_collect`` and
``launch_evidence`` (``fsdp_ray``: the ranks as Ray actors) and inherits scoring unchanged.
What runs inside a rank lives in ``fsdp_rank``; what crosses the channel is ``fsdp_messages``.
Knows nothing about cases, plans, knobs, thresholds, comparison, artifacts or pytest.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Final, TypeVar

import torch
from torch import Tensor

from pytest_logprob_drift.errors import RuntimeFailure
from pytest_logprob_drift.numerics.sampling import Truncation
from pytest_logprob_drift.records import JsonValue
from pytest_logprob_drift.runtimes.transformers import engine
from pytest_logprob_drift.runtimes.transformers import fsdp_messages as wire
from pytest_logprob_drift.runtimes.transformers.engine import NATIVE_LOGP, REFERENCE_LOGP
from pytest_logprob_drift.tensorio import TensorFormatError

__all__ = [
    "NATIVE_LOGP",
    "REFERENCE_LOGP",
    "FsdpScorerError",
    "FsdpScorerGroup",
]

_RANK_ENTRY: Final = "from pytest_logprob_drift.runtimes.transformers.fsdp_rank import main; main()"
_LOG_TAIL: Final = 4000

_R = TypeVar("_R", wire.Ready, wire.Scored, wire.LayersCaptured, wire.WeightsGathered)


class FsdpScorerError(RuntimeFailure):
    """A rank failed (exception, crash or timeout); the message carries the rank's own text."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


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
            wire.send(conn, wire.Close())
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


def _rank_threads(world_size: int) -> int:
    """Intra-op threads per rank: ``OMP_NUM_THREADS`` if set, else the CPUs shared out."""
    threads_env = os.environ.get("OMP_NUM_THREADS", "")
    if threads_env.isdigit() and int(threads_env) > 0:
        return int(threads_env)
    return max(1, (os.cpu_count() or 1) // world_size)


def _init_message(
    model_dir: Path, dtype: str, attn: str, device: str, op_timeout_s: float, threads: int
) -> wire.Init:
    """What every rank is told to load, whichever launcher started it."""
    return wire.Init(
        model_dir=str(model_dir.resolve()),
        dtype=dtype,
        attn_implementation=attn,
        device=device,
        op_timeout_s=op_timeout_s,
        threads=threads,
    )


def _rank_env(state: _GroupState, rank: int, world_size: int, threads: int) -> dict[str, str]:
    """The environment of rank ``rank``: torch.distributed's variables, this interpreter's
    import path and the thread count."""
    path_entries = [p or os.getcwd() for p in sys.path]
    existing = os.environ.get("PYTHONPATH")
    if existing:
        path_entries.append(existing)
    env = dict(os.environ)
    env.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(state.master_port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "PYTHONPATH": os.pathsep.join(path_entries),
            "OMP_NUM_THREADS": str(threads),
        }
    )
    return env


def _spawn_rank(state: _GroupState, rank: int, env: dict[str, str], init: wire.Init) -> None:
    """Start one rank process with its end of a fresh channel; send it ``init``."""
    assert state.workdir is not None
    parent_end, child_end = multiprocessing.Pipe(duplex=True)
    env = {**env, wire.CHANNEL_FD_ENV: str(child_end.fileno())}
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
    wire.send(parent_end, init)


def _score_evidence(
    ready: list[wire.ReadyEvidence], replies: list[wire.Scored], logp_backend: str
) -> dict[str, object]:
    """One evidence record of a scoring call from every rank's ``Ready`` and ``Scored``
    (``lm_head_dtype``: the logits dtype rank 0's LM head produced, observed at its output)."""
    ev = [reply.evidence for reply in replies]
    return {
        "world_size": ev[0].world_size,
        "backend": ev[0].backend,
        "rank_pids": [reply.pid for reply in replies],
        "fsdp": "fully_shard",
        "param_dtype": ready[0].param_dtype,
        "attn_implementation": ready[0].attn_implementation,
        "device": ready[0].device,
        "device_mesh": ready[0].device_mesh,
        "num_parameters": ready[0].num_parameters,
        "local_param_numel": [r.local_param_numel for r in ready],
        "sharded_modules": list(ready[0].sharded_modules),
        "param_placements": list(ready[0].param_placements),
        "logp_backend": logp_backend,
        "rank_startup_s": [dict(r.startup_s) for r in ready],
        "ranks_agree": len({e.result_sha256 for e in ev}) == 1,
        "readonly_violations": [
            f"rank {rank}: {v}" for rank, e in enumerate(ev) for v in e.readonly_violations
        ],
        "state_digests_before": [e.state_digest_before for e in ev],
        "state_digests_after": [e.state_digest_after for e in ev],
        "forward_calls": [e.forward_calls for e in ev],
        "rank_world_sizes": [e.world_size for e in ev],
        "logprob_semantics": ev[0].logprob_semantics,
        "lm_head_dtype": ev[0].logits_dtype,
        "full_vocab_rows": ev[0].full_vocab_rows,
    }


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
        engine.check_dtype_and_attention(dtype, attn_implementation)
        if device not in ("cpu", "cuda"):
            raise ValueError(f"unsupported device {device!r} (supported: 'cpu', 'cuda')")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self._check_devices(device, world_size)
        self._world_size = world_size
        self._op_timeout_s = op_timeout_s
        self._start_timeout_s = start_timeout_s
        self._state = self._new_state()
        self._finalizer = weakref.finalize(self, type(self)._SHUTDOWN, self._state, close_grace_s)
        self._ready: list[wire.ReadyEvidence] = []
        with self._closed_on_failure():
            self._launch(Path(model_dir), dtype, attn_implementation, device, op_timeout_s)
            self._ready = [reply.evidence for reply in self._collect(wire.Ready, start_timeout_s)]

    # -- lifecycle ---------------------------------------------------------------------------

    _SHUTDOWN = staticmethod(_shutdown)
    """Teardown of this transport, run once by the finalizer (holds no reference to self)."""

    def _new_state(self) -> _GroupState:
        return _GroupState()

    def _check_devices(self, device: str, world_size: int) -> None:
        """Local ranks share this machine's CUDA devices, one each."""
        if device == "cuda" and torch.cuda.device_count() < world_size:
            raise ValueError(
                f"world_size {world_size} needs {world_size} CUDA devices, "
                f"found {torch.cuda.device_count()}"
            )

    def weights_report(self) -> Mapping[str, JsonValue]:
        """Rank 0's gathered weight digests, taken by every rank right after sharding
        (``fsdp_rank``; ``{"error": ...}`` when a rank could not take them)."""
        report = self._ready[0].weights if self._ready else None
        return report if report is not None else {"error": "the ranks reported no weights"}

    def launch_evidence(self) -> dict[str, object]:
        """How the ranks were launched, for the ``actual`` record: the launcher and the node
        of every rank (here: this machine)."""
        return {
            "launcher": "local",
            "rank_nodes": [socket.gethostname()] * self._world_size,
            "process_group_world_size": [r.world_size for r in self._ready],
        }

    def _launch(
        self, model_dir: Path, dtype: str, attn: str, device: str, op_timeout_s: float
    ) -> None:
        state = self._state
        state.workdir = tempfile.TemporaryDirectory(prefix="logprob-drift-fsdp-")
        state.master_port = _free_port()
        threads = _rank_threads(self._world_size)
        init = _init_message(model_dir, dtype, attn, device, op_timeout_s, threads)
        for rank in range(self._world_size):
            env = _rank_env(state, rank, self._world_size, threads)
            _spawn_rank(state, rank, env, init)

    @contextmanager
    def _closed_on_failure(self) -> Iterator[None]:
        """Any exception inside closes the group (killing every rank) before it propagates."""
        try:
            yield
        except BaseException:
            self._state.failed = True
            self.close()
            raise

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

    def _receive(self, rank: int, kind: type[_R]) -> _R:
        """The next reply of rank ``rank``, which must be a ``kind``."""
        state = self._state
        try:
            reply: wire.Reply = wire.receive_reply(state.conns[rank])
        except (EOFError, OSError):
            try:
                code: int | None = state.procs[rank].wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                code = None
            what = "closed its channel" if code is None else f"exited (code {code})"
            raise self._rank_failure(rank, what) from None
        except wire.ProtocolError as exc:
            raise self._rank_failure(rank, f"broke the protocol: {exc}") from None
        if isinstance(reply, wire.Failed):
            raise self._rank_failure(rank, f"failed:\n{reply.traceback}")
        if not isinstance(reply, kind):
            raise self._rank_failure(rank, f"sent {reply.KIND!r}, expected {kind.KIND!r}")
        return reply

    def _collect(self, kind: type[_R], timeout_s: float) -> list[_R]:
        """One reply of ``kind`` from every rank, in rank order; fail fast on any rank failure."""
        state = self._state
        replies: dict[int, _R] = {}
        deadline = time.monotonic() + timeout_s
        while len(replies) < self._world_size:
            pending = [c for r, c in enumerate(state.conns) if r not in replies]
            for conn in wait(pending, timeout=0.5):
                assert isinstance(conn, Connection)
                rank = state.conns.index(conn)
                replies[rank] = self._receive(rank, kind)
            for rank, proc in enumerate(state.procs):
                if rank not in replies and proc.poll() is not None:
                    if state.conns[rank].poll():  # its last words are still in the pipe
                        break
                    raise self._rank_failure(rank, f"exited (code {proc.returncode})")
            if time.monotonic() > deadline:
                missing = sorted(set(range(self._world_size)) - set(replies))
                raise self._rank_failure(
                    missing[0], f"timed out after {timeout_s:.0f}s waiting for {kind.KIND!r}"
                )
        return [replies[r] for r in range(self._world_size)]

    # -- scoring -----------------------------------------------------------------------------

    def _check_request(
        self, batch: Mapping[str, Tensor], batch_size: int, lm_head_dtype: str
    ) -> None:
        """What a scoring or capture request needs before it is sent: an open group, a
        positive batch size, a known LM head dtype and a canonical batch."""
        if self._state.closed:
            raise FsdpScorerError("the FSDP scorer group is closed")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if lm_head_dtype not in engine.LM_HEAD_DTYPES:
            raise ValueError(f"lm_head_dtype must be one of {', '.join(engine.LM_HEAD_DTYPES)}")
        engine.validate_canonical_batch(batch)

    def score(
        self,
        batch: Mapping[str, Tensor],
        *,
        batch_size: int,
        logp_backend: str,
        processed: Truncation | None = None,
        lm_head_dtype: str = "compute",
        full_vocab: list[Tensor] | None = None,
    ) -> tuple[Tensor, dict[str, object]]:
        """Teacher-forced logprobs of the canonical ``batch`` (float32 ``[B, L]``) + evidence.

        Every rank scores the full batch (FSDP shards parameters, not data); rank 0's result is
        returned. ``logp_backend`` is a ``"module:attr"`` string imported inside the ranks.
        ``processed`` and ``lm_head_dtype`` mean what they mean to the in-process scorer
        (``engine.hf_teacher_forced_score``, ``engine.lm_head_at_score``); ``full_vocab``, when
        given (a list), receives rank 0's scored ``[A, V]`` float32 rows of the active
        positions (asked of the ranks only then).
        """
        self._check_request(batch, batch_size, lm_head_dtype)
        if ":" not in logp_backend:
            raise ValueError(f"logp backend {logp_backend!r} is not a 'module:attr' import string")
        request = wire.Score.of(
            {k: batch[k] for k in engine.SCORER_KEYS},
            batch_size=batch_size,
            logp_backend=logp_backend,
            processed=processed,
            lm_head_dtype=lm_head_dtype,
            full_vocabulary=full_vocab is not None,
        )
        with self._closed_on_failure():
            for conn in self._state.conns:
                wire.send(conn, request)
            replies = self._collect(wire.Scored, self._op_timeout_s)
            if full_vocab is not None:
                full_vocab.append(replies[0].full_vocab_rows())
        return replies[0].result(), _score_evidence(self._ready, replies, logp_backend)

    # -- layer diagnostics -------------------------------------------------------------------

    def capture_layers(
        self, batch: Mapping[str, Tensor], *, batch_size: int, lm_head_dtype: str = "compute"
    ) -> tuple[dict[str, Tensor], dict[str, object]]:
        """The layer diagnostics' reduction of the sharded model's states at the positions
        that score the canonical ``batch``'s active tokens (``layer_capture.capture_layers``,
        run and reduced in every rank: FSDP shards parameters, not data) + evidence
        (``world_size``, ``rank_pids``, ``ranks_agree``: every rank's reduction has the same
        SHA-256). Rank 0's reduction is returned; ``FsdpScorerError`` when any rank fails (the
        group is then closed) or when the ranks' reductions differ (the group stays open: its
        scores are still checked by their own digests)."""
        self._check_request(batch, batch_size, lm_head_dtype)
        request = wire.CaptureLayers.of(
            {k: batch[k] for k in engine.SCORER_KEYS},
            batch_size=batch_size,
            lm_head_dtype=lm_head_dtype,
        )
        with self._closed_on_failure():
            for conn in self._state.conns:
                wire.send(conn, request)
            replies = self._collect(wire.LayersCaptured, self._op_timeout_s)
            try:
                tensors = replies[0].tensors()
            except (wire.ProtocolError, TensorFormatError) as exc:
                raise self._rank_failure(0, f"sent a bad layer reduction: {exc}") from None
        return tensors, layers_evidence(replies)

    # -- weight push ---------------------------------------------------------------------

    def gather_weights(self) -> tuple[dict[str, Tensor], dict[str, object]]:
        """The sharded model's whole state (every rank gathers it with ``full_tensor()``; rank
        0's copy is returned) + evidence (``world_size``, ``gather_s`` per rank,
        ``ranks_agree``: every rank gathered the same bytes). ``FsdpScorerError`` when a rank
        fails or the ranks disagree."""
        if self._state.closed:
            raise FsdpScorerError("the FSDP scorer group is closed")
        with self._closed_on_failure():
            for conn in self._state.conns:
                wire.send(conn, wire.GatherWeights())
            replies = self._collect(wire.WeightsGathered, self._op_timeout_s)
            digests = {r.state_sha256 for r in replies}
            if len(digests) != 1:
                raise self._rank_failure(0, "gathered a state other ranks did not")
            try:
                state = replies[0].tensors()
            except (wire.ProtocolError, TensorFormatError) as exc:
                raise self._rank_failure(0, f"sent a bad gathered state: {exc}") from None
        return state, {
            "world_size": self._world_size,
            "gather_s": [round(r.gather_s, 6) for r in replies],
            "ranks_agree": True,
        }


def layers_evidence(replies: list[wire.LayersCaptured]) -> dict[str, object]:
    """The evidence of one layer capture from every rank's reply; ``FsdpScorerError`` naming
    the ranks and their digests when the ranks' reductions differ."""
    digests = [reply.reduction_sha256 for reply in replies]
    if len(set(digests)) != 1:
        listed = ", ".join(f"rank {r.rank} {d[:16]}" for r, d in zip(replies, digests, strict=True))
        raise FsdpScorerError(f"the FSDP ranks' layer reductions differ ({listed})")
    return {
        "world_size": len(replies),
        "rank_pids": [reply.pid for reply in replies],
        "ranks_agree": True,
        "reduction_sha256": digests[0],
    }
