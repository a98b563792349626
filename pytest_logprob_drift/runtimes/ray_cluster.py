"""The Ray cluster a run uses under the ``ray`` launcher: connect to one, or start a local one.

Owns connecting this process to an existing cluster (the launch policy's address, else
``RAY_ADDRESS``), or starting a local single-node cluster bound to 127.0.0.1 (``num_cpus`` as
given, no dashboard, usage stats off, a small object store; optionally begun in the background
while the first engines load), sharing that connection between
every user in this process (a lease count), and shutting down only what it started: a cluster
this process started is stopped when the last lease is released; a connection to a cluster
someone else started (or a ``ray.init`` done before us, e.g. by a test fixture) is left as it
was. Also answers the cluster's free resources. Imports ray lazily (``ray`` extra); knows
nothing about cases, engines or ranks.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pytest_logprob_drift.errors import RuntimeFailure
from pytest_logprob_drift.execute.launch import Launch

__all__ = [
    "OBJECT_STORE_BYTES",
    "ClusterLease",
    "abandon_background_start",
    "acquire",
    "free_resources",
    "import_ray",
    "start_in_background",
]

OBJECT_STORE_BYTES: Final = 256 * 1024 * 1024
"""Object store of a local cluster: batches and results are small (KiB to MiB)."""

_LOOPBACK_ENV: Final = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray replaces a loopback ``_node_ip_address`` by the machine's routable address unless its
multi-node support is off (``ray_constants.ENABLE_RAY_CLUSTER``, read from this variable; the
single-node mode Ray itself uses on macOS and Windows): then the head node, its raylet and
every worker use 127.0.0.1."""

_LOCK = threading.Lock()


class _NotMainThread(logging.Filter):
    """Drops Ray's warning that a ``ray.init`` outside the main thread sets no SIGTERM handler:
    the background start does that on purpose (the process keeps Python's default SIGTERM,
    and Ray's node processes die with their starting thread)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "current thread is not the main thread" not in record.getMessage()


class _Keeper(threading.Thread):
    """Starts a local cluster in the background and stays alive until it is shut down: Ray's
    node processes die with the *thread* that started them (``PR_SET_PDEATHSIG``), so the
    starting thread must outlive the cluster."""

    def __init__(self, launch: Launch) -> None:
        super().__init__(name="logprob-drift-ray-start", daemon=True)
        self.launch = launch
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        logging.getLogger("ray._private.worker").addFilter(_NOT_MAIN_THREAD)
        try:
            _start_local(import_ray(), self.launch)
        except RuntimeFailure as exc:
            self.error = str(exc)
            return
        finally:
            self.ready.set()
        self.stop.wait()


_NOT_MAIN_THREAD: Final = _NotMainThread()


@dataclass
class _State:
    leases: int = 0
    started: bool = False
    address: str = ""
    saved: tuple[str | None, bool] | None = None
    keeper: _Keeper | None = None


_STATE = _State()


def _loopback_only(on: bool) -> None:
    """While a cluster started here runs, it (and its processes, which inherit the
    environment) uses 127.0.0.1 only; ``on=False`` puts back what was there before."""
    from ray._private import ray_constants

    if on:
        _STATE.saved = (os.environ.get(_LOOPBACK_ENV), ray_constants.ENABLE_RAY_CLUSTER)
        os.environ[_LOOPBACK_ENV] = "0"
        ray_constants.ENABLE_RAY_CLUSTER = False
    elif _STATE.saved is not None:
        env, constant = _STATE.saved
        _STATE.saved = None
        if env is None:
            os.environ.pop(_LOOPBACK_ENV, None)
        else:
            os.environ[_LOOPBACK_ENV] = env
        ray_constants.ENABLE_RAY_CLUSTER = constant


def import_ray() -> Any:
    """The ``ray`` module, or a RuntimeFailure naming the extra that provides it."""
    try:
        import ray
    except ImportError as exc:
        raise RuntimeFailure(
            f"the ray launcher needs Ray: pip install 'pytest-logprob-drift[ray]' ({exc})"
        ) from None
    return ray


@dataclass(frozen=True, slots=True)
class ClusterLease:
    """One user's hold on the cluster; ``release`` once."""

    address: str
    started_here: bool

    def release(self) -> None:
        release()


def _start_local(ray: Any, launch: Launch) -> None:
    """Start a local single-node cluster bound to 127.0.0.1 and connect this process to it."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    _loopback_only(True)
    try:
        ray.init(
            # "local": a new cluster, even where ``ray start`` left its address in
            # /tmp/ray/ray_current_cluster (ray.init() without an address joins it)
            address="local",
            num_cpus=launch.ray_num_cpus or os.cpu_count() or 1,
            include_dashboard=False,
            object_store_memory=OBJECT_STORE_BYTES,
            log_to_driver=False,
            configure_logging=False,
            _node_ip_address="127.0.0.1",
        )
    except Exception as exc:  # a failed start
        _loopback_only(False)
        raise RuntimeFailure(
            f"ray: cannot start a local cluster on 127.0.0.1: {type(exc).__name__}: {exc}"
        ) from None


def start_in_background(launch: Launch) -> None:
    """Begin starting the local cluster that ``acquire`` would start, so that it comes up while
    the first engines load; ``acquire`` waits for it. Nothing when an address is given (joining
    is quick), this process is already connected, or a start is under way."""
    if not launch.is_ray or launch.address():
        return
    ray = import_ray()
    with _LOCK:
        if ray.is_initialized() or _STATE.keeper is not None:
            return
        _STATE.keeper = _Keeper(launch)
        _STATE.keeper.start()


def _stop_keeper() -> None:
    """Let the background starter end (after the cluster it started was shut down)."""
    keeper, _STATE.keeper = _STATE.keeper, None
    if keeper is not None:
        keeper.stop.set()
        keeper.join()


def abandon_background_start() -> None:
    """Shut down a cluster started by ``start_in_background`` that nobody acquired."""
    keeper = _STATE.keeper
    if keeper is None:
        return
    keeper.ready.wait()
    ray = import_ray()
    with _LOCK:
        if _STATE.leases or _STATE.keeper is not keeper:
            return
        if keeper.error is None and ray.is_initialized():
            ray.shutdown()
            _loopback_only(False)
        _stop_keeper()


def acquire(launch: Launch) -> ClusterLease:
    """Connect (or start a local cluster, or take the one started in the background) unless
    this process already is connected."""
    ray = import_ray()
    keeper = _STATE.keeper
    if keeper is not None:
        keeper.ready.wait()
    with _LOCK:
        if keeper is not None and keeper.error is not None and _STATE.keeper is keeper:
            _stop_keeper()
            raise RuntimeFailure(keeper.error)
        if not ray.is_initialized():
            address = launch.address()
            if address:
                os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
                try:
                    ray.init(address=address, log_to_driver=False, configure_logging=False)
                except Exception as exc:  # connection refused, bad address
                    raise RuntimeFailure(
                        f"ray: cannot connect to {address}: {type(exc).__name__}: {exc}"
                    ) from None
            else:
                _start_local(ray, launch)
            _STATE.started = not address
            _STATE.address = str(ray.get_runtime_context().gcs_address)
        elif _STATE.keeper is not None and not _STATE.leases and not _STATE.address:
            _STATE.started = True  # the background start: ours to shut down
            _STATE.address = str(ray.get_runtime_context().gcs_address)
        elif not _STATE.leases and not _STATE.address:
            _STATE.started = False  # someone else's ray.init: never ours to shut down
            _STATE.address = str(ray.get_runtime_context().gcs_address)
        _STATE.leases += 1
        return ClusterLease(address=_STATE.address, started_here=_STATE.started)


def release() -> None:
    """Drop one lease; the last one shuts down a cluster this process started."""
    ray = import_ray()
    with _LOCK:
        if _STATE.leases == 0:
            return
        _STATE.leases -= 1
        if _STATE.leases:
            return
        if _STATE.started and ray.is_initialized():
            ray.shutdown()
            _loopback_only(False)
        _stop_keeper()
        _STATE.started = False
        _STATE.address = ""


def free_resources() -> Mapping[str, float]:
    """The cluster's currently available resources (``CPU``, ``GPU``, ...)."""
    ray = import_ray()
    return {str(k): float(v) for k, v in ray.available_resources().items()}
