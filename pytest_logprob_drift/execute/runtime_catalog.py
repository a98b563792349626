"""The runtime catalog an execution is handed, and loading a runtime's adapter.

Owns ``RuntimeCatalog``: the runtimes a frontend makes available, by name (``RuntimeInfo``
records, which name their adapter factory as ``module:attr``), looking one up with a clear
error, the union of the built-in checkpoints they declare (what planning checks a config's
checkpoint against; one checkpoint may serve several runtimes), and importing and constructing
its adapter only when a case executes (a missing engine package names the install extra).
Adding a runtime is one record plus its adapter module; the planner and runner do not change.
Knows nothing about any concrete runtime or engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pytest_logprob_drift.errors import ConfigError, UsageError
from pytest_logprob_drift.records import BuiltinCheckpoint, FrozenRecord, RuntimeInfo, Scenario
from pytest_logprob_drift.references import UnresolvedReference, resolve_reference

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:  # planning (``plan``, collection) never needs the execution protocol
    from pytest_logprob_drift.execute.protocol import RuntimeAdapter


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class RuntimeCatalog(FrozenRecord):
    """An immutable set of runtimes keyed by name."""

    runtimes: tuple[RuntimeInfo, ...] = ()
    _index: Mapping[str, RuntimeInfo] = field(init=False, repr=False, compare=False)
    _checkpoints: Mapping[str, BuiltinCheckpoint] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index: dict[str, RuntimeInfo] = {}
        checkpoints: dict[str, BuiltinCheckpoint] = {}
        for info in self.runtimes:
            if info.name in index and index[info.name] != info:
                raise ConfigError(f"runtime {info.name}", "two different runtimes use this name")
            index[info.name] = info
            for checkpoint in info.checkpoints:
                where = f"runtime {info.name}: checkpoint {checkpoint.uri!r}"
                if not checkpoint.scheme:
                    raise ConfigError(where, "a built-in checkpoint's URI has a scheme (name://)")
                if checkpoints.setdefault(checkpoint.uri, checkpoint) != checkpoint:
                    raise ConfigError(where, "another runtime declares it with other limits")
        object.__setattr__(self, "_index", MappingProxyType(index))
        object.__setattr__(self, "_checkpoints", MappingProxyType(checkpoints))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._index))

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def get(self, name: str) -> RuntimeInfo:
        if name not in self._index:
            raise UsageError(f"unknown runtime {name!r}; known: {', '.join(self.names)}")
        return self._index[name]

    @property
    def checkpoints(self) -> Mapping[str, BuiltinCheckpoint]:
        """Every built-in checkpoint its runtimes declare, by URI: what the frontends hand
        planning (``plan`` names no runtime, so it checks against all of them)."""
        return self._checkpoints

    def executing(self, scenario: Scenario) -> list[str]:
        """Names of the runtimes that execute ``scenario``."""
        return [name for name in self.names if self._index[name].executes(scenario)]

    def with_runtimes(self, extra: Iterable[RuntimeInfo]) -> RuntimeCatalog:
        return RuntimeCatalog(self.runtimes + tuple(extra))


def load_adapter(info: RuntimeInfo) -> RuntimeAdapter:
    """Import the runtime's adapter factory and construct the adapter."""
    try:
        factory = resolve_reference(info.adapter)
    except UnresolvedReference as exc:
        hint = f" (install the '{info.extra}' extra)" if info.extra else ""
        raise UsageError(f"runtime {info.name!r} is not available: {exc.message}{hint}") from None
    adapter: RuntimeAdapter = factory()
    return adapter
