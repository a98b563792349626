"""The launcher: how engines' processes are started, as execution policy (never a config field).

Owns the frozen ``Launch`` record the frontends hand the runner (``local``: today's child
processes started by this process, the default; ``ray``: training ranks as Ray actors in a
placement group, vLLM's Ray executor where its platform has one, on an existing cluster or a
local one bound to 127.0.0.1), and the ``LaunchAware`` protocol an adapter implements to
receive it, and the ``ResourceAware`` protocol an adapter implements to declare what its
engines need from the cluster (so the runner may run engine groups side by side). The
launcher is policy like the artifacts directory: it never enters a case id or
an execution key; adapters record it in each attempt's ``actual``. Knows nothing about Ray,
torch or any concrete runtime (nothing here imports them).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

from pytest_logprob_drift.errors import UsageError

if TYPE_CHECKING:
    from pytest_logprob_drift.execute.protocol import RuntimeBinding

__all__ = ["LAUNCHERS", "RAY_ADDRESS_ENV", "Launch", "LaunchAware", "ResourceAware", "fits"]

LAUNCHERS: Final = ("local", "ray")
RAY_ADDRESS_ENV: Final = "RAY_ADDRESS"


@dataclass(frozen=True, slots=True, kw_only=True)
class Launch:
    """How engines are launched: ``local`` (the default) or ``ray``."""

    launcher: str = "local"
    ray_address: str | None = None
    """An existing cluster to connect to (``None``: ``RAY_ADDRESS`` if set, else a local
    cluster on 127.0.0.1 started for the run and shut down after it)."""
    ray_num_cpus: int | None = None
    """CPUs of a local cluster this run starts (``None``: this machine's CPU count)."""
    concurrent: bool = True
    """With ``ray``: run engine groups side by side when their declared resources fit."""
    rank_cpus: float = 1.0
    """CPUs one training rank actor declares on a CPU scenario (its placement-group bundle)."""

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise UsageError(
                f"launcher {self.launcher!r}: unknown launcher; one of {', '.join(LAUNCHERS)}"
            )
        if self.ray_num_cpus is not None and self.ray_num_cpus < 1:
            raise UsageError(f"ray num_cpus must be at least 1, got {self.ray_num_cpus}")
        if not 0 < self.rank_cpus <= 1024:
            raise UsageError(f"ray rank CPUs must be in (0, 1024], got {self.rank_cpus}")
        if self.launcher == "local" and self.ray_address:
            raise UsageError("a Ray address needs the ray launcher")

    @property
    def is_ray(self) -> bool:
        return self.launcher == "ray"

    def address(self) -> str | None:
        """The cluster to connect to: the given address, else ``RAY_ADDRESS``, else None."""
        return self.ray_address or os.environ.get(RAY_ADDRESS_ENV) or None


@runtime_checkable
class LaunchAware(Protocol):
    """An adapter that launches engines according to the execution policy's launcher."""

    def use_launch(self, launch: Launch) -> None: ...


@runtime_checkable
class ResourceAware(Protocol):
    """An adapter that declares what its engines need from the cluster, so the runner can run
    engine groups side by side when they fit (Ray then schedules them)."""

    def engine_resources(self, binding: RuntimeBinding) -> Mapping[str, float]:
        """Cluster resources (``CPU``, ``GPU``) the engines of one case hold while it runs;
        empty when they run in this process."""
        ...

    def cluster_resources(self) -> Mapping[str, float]:
        """The cluster's free resources now (connecting to it first)."""
        ...


def fits(demand: Mapping[str, float], free: Mapping[str, float]) -> bool:
    """Whether ``demand`` fits in ``free`` (a resource absent from ``free`` is zero)."""
    return all(amount <= free.get(name, 0.0) + 1e-9 for name, amount in demand.items() if amount)
