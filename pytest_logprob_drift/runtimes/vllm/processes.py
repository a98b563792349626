"""Processes, shared memory and environment around a vLLM engine, seen from the operating system.

Owns: listing this process's live descendants and their command lines (from /proc only);
naming the engine-core and worker processes below a set of engine-core processes (or, with
the engine core in this process, its workers); the /dev/shm
segments a set of processes has mapped, and unlinking the ones an engine left behind; reaping
exited engine-core processes (join, kill after a timeout); and the context manager that patches
``os.environ`` for an engine construction (the CPU thread binding per tensor-parallel rank, no
``VLLM_CPU_KVCACHE_SPACE``) and afterwards restores it exactly.

Knows nothing about vLLM's objects or configuration (it sees ``multiprocessing`` process
objects and PIDs), about cases, knobs, scoring or pytest. Imports neither torch nor vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

__all__ = [
    "construction_env",
    "engine_process_ids",
    "engine_tree",
    "list_child_processes",
    "mapped_shm_segments",
    "process_command_line",
    "reap",
    "release_orphaned_shm",
]

_BIND_ENV: Final = "VLLM_CPU_OMP_THREADS_BIND"
_KVCACHE_ENV: Final = "VLLM_CPU_KVCACHE_SPACE"
_RAY_ADDRESS_ENV: Final = "RAY_ADDRESS"
_SHM_DIR: Final = "/dev/shm/"
_PSM_PREFIX: Final = "psm_"
_WORKER_TITLE: Final = "VLLM::Worker"
"""How vLLM titles its worker processes (``VLLM::Worker_TP0``, ...)."""


# --------------------------------------------------------------------------- /proc


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


def _pids(processes: Iterable[Any]) -> list[int]:
    """PIDs of ``multiprocessing`` process objects that were started."""
    return [int(p.pid) for p in processes if p.pid is not None]


def engine_tree(processes: Iterable[Any]) -> list[int]:
    """PIDs of the engine-core ``processes`` and all their descendants."""
    cores = _pids(processes)
    return sorted({*cores, *(pid for core in cores for pid in list_child_processes(core))})


def engine_process_ids(
    processes: Iterable[Any], workers: Iterable[Any] = ()
) -> dict[str, list[int]]:
    """Live engine-core PIDs (children of this process) and the worker PIDs below them; with an
    engine core in this process, ``workers``: its executor's worker process objects."""
    live = set(list_child_processes())
    cores = [pid for pid in _pids(processes) if pid in live]
    below = [
        pid
        for core in cores
        for pid in list_child_processes(core)
        if process_command_line(pid).startswith(_WORKER_TITLE)
    ]
    own = [pid for pid in _pids(workers) if pid in live]
    return {"engine_core": cores, "workers": sorted({*below, *own})}


# --------------------------------------------------------------------------- reaping


def reap(processes: Iterable[Any], join_s: float) -> None:
    """Join exited engine-core processes (a zombie otherwise); kill one still alive after
    ``join_s`` seconds. Errors of already-closed process objects are ignored."""
    for proc in processes:
        try:
            proc.join(join_s)
            if proc.is_alive():
                proc.kill()
                proc.join(join_s)
        except (AssertionError, ValueError, OSError):
            pass


# --------------------------------------------------------------------------- /dev/shm


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


def release_orphaned_shm(names: set[str]) -> None:
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
def construction_env(
    *, tensor_parallel_size: int, is_cpu: bool, ray_address: str | None = None
) -> Iterator[dict[str, str | None]]:
    """Set the environment an engine build needs; afterwards restore ``os.environ`` exactly.

    Yields what was applied (``None`` for a removed variable). On the CPU wheel: for TP > 1,
    ``VLLM_CPU_OMP_THREADS_BIND`` gets one CPU group per rank unless the user set it (vLLM's
    ``auto`` binding wants one NUMA node per rank); ``VLLM_CPU_KVCACHE_SPACE`` is removed
    because it would override the ``kv_cache_memory_bytes`` given to the constructor. vLLM's
    CPU platform also writes variables into this process's environment while the engine is
    built (``VLLM_WORKER_MULTIPROC_METHOD``, ``TORCHINDUCTOR_COMPILE_THREADS``, ...); those are
    undone too, so that a later training scorer in this process sees the environment it had.
    ``ray_address``: the cluster vLLM's Ray executor joins (``RAY_ADDRESS``; the engine core
    is a spawned process and calls ``ray.init`` itself).
    """
    before = dict(os.environ)
    applied: dict[str, str | None] = {}
    if ray_address:
        applied[_RAY_ADDRESS_ENV] = ray_address
    if is_cpu:
        if tensor_parallel_size > 1 and not os.environ.get(_BIND_ENV):
            applied[_BIND_ENV] = _cpu_bind_groups(tensor_parallel_size)
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
