"""The FSDP training scorer with its ranks as Ray actors in a placement group (``ray`` launcher).

Owns the Ray transport of ``fsdp.FsdpScorerGroup``: one placement group with one bundle per
rank (a GPU each on CUDA, else the launch policy's CPUs), one ``RankActor`` per bundle that
sets its own torch.distributed environment (rank 0's node IP and a free port found inside
rank 0; ``RANK``/``WORLD_SIZE``) and then runs exactly the rank code the local processes run
(``fsdp_rank.start``/``handle``/``leave``) on the same ``fsdp_messages`` requests and replies;
collecting the replies (a dead actor, a failed call or a timeout becomes ``FsdpScorerError``
in one line naming the rank, its actor and its node), the launch evidence (the launcher, every
rank's node, the world size each rank read back from its process group, the actors' start
times), and tearing down exactly once: ``Close`` to every rank (they leave the process
group), then every actor killed and the placement group removed, also after a failed start or
a dead rank. Scoring and the layer capture (``FsdpScorerGroup.score``, ``.capture_layers``)
are inherited unchanged. Imports ray lazily; knows nothing about cases, plans, knobs,
comparison, artifacts or pytest.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final, TypedDict, cast

from pytest_logprob_drift.runtimes.ray_cluster import import_ray
from pytest_logprob_drift.runtimes.transformers import fsdp_messages as wire
from pytest_logprob_drift.runtimes.transformers.fsdp import (
    _R,
    FsdpScorerGroup,
    _GroupState,
    _init_message,
    _rank_threads,
)

__all__ = ["RankActor", "RayFsdpScorerGroup"]

_CLOSE_S: Final = 10.0


class RankPlace(TypedDict):
    """Where one Ray rank runs: its node, process and start time (``RankActor.where``)."""

    node_id: str
    node_ip: str
    actor_id: str
    pid: int
    started_unix: float


class RankActor:
    """One FSDP rank inside a Ray worker process (used as ``ray.remote(RankActor)``)."""

    def __init__(self, rank: int, world_size: int, local_device: int | None) -> None:
        self.t0 = time.monotonic()
        self.started_unix = time.time()
        self.rank = rank
        self.world_size = world_size
        self.local_device = local_device
        self.pid = os.getpid()
        self.model: Any = None

    def where(self) -> RankPlace:
        """This rank's node, process and start time."""
        ray = import_ray()
        context = ray.get_runtime_context()
        return {
            "node_id": str(context.get_node_id()),
            "node_ip": str(ray.util.get_node_ip_address()),
            "actor_id": str(context.get_actor_id()),
            "pid": self.pid,
            "started_unix": self.started_unix,
        }

    def master_address(self) -> tuple[str, int]:
        """This node's IP and a port free on it (asked of rank 0 only)."""
        ip = str(import_ray().util.get_node_ip_address())
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((ip, 0))
            port: int = s.getsockname()[1]
        return ip, port

    def configure(self, master_addr: str, master_port: int) -> None:
        """torch.distributed's environment for this rank (``env://`` rendezvous)."""
        os.environ.update(
            {
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
                "RANK": str(self.rank),
                "WORLD_SIZE": str(self.world_size),
                "LOCAL_RANK": str(self.rank if self.local_device is None else self.local_device),
            }
        )

    def call(self, request: wire.Request) -> wire.Reply | None:
        """One request of the protocol, answered as a local rank process would answer it."""
        from pytest_logprob_drift.runtimes.transformers import fsdp_rank

        if isinstance(request, wire.Init):
            try:
                self.model, ready = fsdp_rank.start(
                    request, self.rank, self.pid, self.t0, local_device=self.local_device
                )
            except BaseException:
                return fsdp_rank.failed(self.rank, self.pid)
            return ready
        if isinstance(request, wire.Close):
            self.model = None
            fsdp_rank.leave()
            return None
        return fsdp_rank.handle(self.model, request, self.rank, self.pid)


class _ActorChannel:
    """A rank's end of the protocol over Ray: ``send`` submits the request to the actor and
    keeps the reply's object reference; the group collects them in order."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.pending: list[Any] = []

    def send(self, message: wire.Request) -> None:
        self.pending.append(self.actor.call.remote(message))


@dataclass
class _RayState(_GroupState):
    """Everything the Ray teardown needs (no reference to the group object)."""

    actors: list[Any] = field(default_factory=list)
    channels: list[_ActorChannel] = field(default_factory=list)
    placement_group: Any = None
    where: list[RankPlace] = field(default_factory=list)


def _shutdown_ray(state: _GroupState, grace_s: float) -> None:
    """Ranks leave the process group (``Close``), then every actor is killed and the
    placement group removed. Idempotent; never raises for an actor that is already gone."""
    if state.closed:
        return
    state.closed = True
    assert isinstance(state, _RayState)
    ray = import_ray()
    if not ray.is_initialized():
        return
    if not state.failed and state.channels:
        refs = [ch.actor.call.remote(wire.Close()) for ch in state.channels]
        try:
            ray.wait(refs, num_returns=len(refs), timeout=min(grace_s, _CLOSE_S))
        except Exception:  # a dead actor: killed below
            pass
    for actor in state.actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:
            pass
    if state.placement_group is not None:
        from ray.util.placement_group import remove_placement_group

        try:
            remove_placement_group(state.placement_group)
        except Exception:
            pass
    _wait_until_gone(state, ray)


def _wait_until_gone(state: _RayState, ray: Any, timeout_s: float = 10.0) -> None:
    """Wait until the actors' worker processes on this machine have exited (a killed actor's
    process is reaped by its raylet asynchronously)."""
    pids = [int(w["pid"]) for w in state.where if "pid" in w]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text if len(text) <= 400 else text[:400] + ' ...'}"


class RayFsdpScorerGroup(FsdpScorerGroup):
    """``world_size`` Ray actors holding one FSDP2-sharded model; see ``FsdpScorerGroup``."""

    _SHUTDOWN = staticmethod(_shutdown_ray)

    def __init__(self, model_dir: Path, *, rank_cpus: float = 1.0, **kwargs: Any) -> None:
        self._rank_cpus = rank_cpus
        super().__init__(model_dir, **kwargs)

    def _new_state(self) -> _GroupState:
        return _RayState()

    def _check_devices(self, device: str, world_size: int) -> None:
        """Nothing here: the GPUs are the cluster's (a placement group that cannot be placed
        is reported by ``_launch``), not necessarily this machine's."""

    @property
    def _ray_state(self) -> _RayState:
        state = self._state
        assert isinstance(state, _RayState)
        return state

    def _launch(
        self, model_dir: Path, dtype: str, attn: str, device: str, op_timeout_s: float
    ) -> None:
        ray = import_ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        state = self._ray_state
        cuda = device == "cuda"
        bundle = {"GPU": 1.0, "CPU": 1.0} if cuda else {"CPU": float(self._rank_cpus)}
        state.placement_group = placement_group([dict(bundle)] * self._world_size, "PACK")
        ready = state.placement_group.ready()
        done, _ = ray.wait([ready], timeout=self._start_timeout_s)
        if not done:
            raise self._rank_failure(
                0,
                f"found no room on the Ray cluster for {self._world_size} bundles of {bundle} "
                f"within {self._start_timeout_s:.0f}s (free: {ray.available_resources()})",
            )
        remote = ray.remote(RankActor)
        for rank in range(self._world_size):
            actor = remote.options(
                num_cpus=bundle["CPU"],
                num_gpus=bundle.get("GPU", 0.0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=state.placement_group, placement_group_bundle_index=rank
                ),
                max_restarts=0,
                max_concurrency=1,
            ).remote(rank, self._world_size, 0 if cuda else None)
            state.actors.append(actor)
        state.where = self._get([a.where.remote() for a in state.actors], "start")
        master_addr, master_port = self._get([state.actors[0].master_address.remote()], "start")[0]
        state.master_port = int(master_port)
        init = _init_message(
            model_dir, dtype, attn, device, op_timeout_s, _rank_threads(self._world_size)
        )
        for actor in state.actors:
            actor.configure.remote(master_addr, int(master_port))  # runs before call (ordered)
            channel = _ActorChannel(actor)
            state.channels.append(channel)
            channel.send(init)
        # ``score`` sends through ``_state.conns``; here they are the actors' channels.
        state.conns = cast(list[Connection], state.channels)

    def _get(self, refs: list[Any], what: str) -> list[Any]:
        """``ray.get`` of one reference per rank, with failures as rank failures."""
        ray = import_ray()
        out: list[Any] = []
        for rank, ref in enumerate(refs):
            try:
                out.append(ray.get(ref, timeout=self._start_timeout_s))
            except Exception as exc:
                raise self._rank_failure(rank, f"failed to {what}: {_one_line(exc)}") from None
        return out

    def _rank_failure(self, rank: int, what: str) -> Any:
        self._state.failed = True
        where = self._ray_state.where
        node = f" on node {where[rank]['node_id'][:12]}" if rank < len(where) else ""
        from pytest_logprob_drift.runtimes.transformers.fsdp import FsdpScorerError

        return FsdpScorerError(f"FSDP rank {rank} (Ray actor{node}) {what}")

    def _collect(self, kind: type[_R], timeout_s: float) -> list[_R]:
        """The next reply of every rank, in rank order; fail fast on the first failure."""
        ray = import_ray()
        state = self._ray_state
        refs = {rank: ch.pending.pop(0) for rank, ch in enumerate(state.channels)}
        rank_of = {ref: rank for rank, ref in refs.items()}
        replies: dict[int, _R] = {}
        deadline = time.monotonic() + timeout_s
        waiting = list(refs.values())
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(refs) - set(replies))
                raise self._rank_failure(
                    missing[0], f"timed out after {timeout_s:.0f}s waiting for {kind.KIND!r}"
                )
            done, waiting = ray.wait(waiting, num_returns=1, timeout=min(left, 1.0))
            for ref in done:
                rank = rank_of[ref]
                try:
                    reply = ray.get(ref)
                except Exception as exc:  # the actor died or its call raised
                    raise self._rank_failure(rank, f"died: {_one_line(exc)}") from None
                if isinstance(reply, wire.Failed):
                    last = reply.traceback.strip().splitlines()[-1:] or [""]
                    raise self._rank_failure(rank, f"failed: {last[0]}")
                if not isinstance(reply, kind):
                    got = getattr(reply, "KIND", type(reply).__name__)
                    raise self._rank_failure(rank, f"sent {got!r}, expected {kind.KIND!r}")
                replies[rank] = reply
        return [replies[r] for r in range(self._world_size)]

    @property
    def pids(self) -> list[int]:
        return [int(w["pid"]) for w in self._ray_state.where]

    @property
    def actors(self) -> list[Any]:
        """The rank actors' handles (for fault tests)."""
        return list(self._ray_state.actors)

    def launch_evidence(self) -> dict[str, object]:
        where = self._ray_state.where
        return {
            "launcher": "ray",
            "rank_nodes": [str(w["node_id"]) for w in where],
            "rank_node_ips": [str(w["node_ip"]) for w in where],
            "rank_actor_pids": [int(w["pid"]) for w in where],
            "rank_actor_started_unix": [float(w["started_unix"]) for w in where],
            "process_group_world_size": [r.world_size for r in self._ready],
            "placement_group": str(self._ray_state.placement_group.id.hex()),
            "rank_bundle_cpus": self._rank_cpus,
        }
