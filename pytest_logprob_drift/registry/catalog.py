"""Semantic operator descriptors and the immutable catalog.

Owns what a backend of a semantic operation (``selected_logprob`` first) declares about itself
(``OperatorDescriptor``: targets, devices, dtypes, topology, alignment properties, lifecycle,
factory, version, fallback policy and the temporary-test marker ``test_only``), the
``SemanticOperatorCatalog`` of immutable descriptors, and loading descriptors from an
entry-point group (``pytest_logprob_drift.operators`` for production backends, which refuses
test-only ones). Factories are ``module:attr`` strings imported only on instantiation (see
``registry.session``), so describing and planning never import torch. Knows nothing about
configs, planning rules, runtimes, or which test-only backends exist.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pytest_logprob_drift.errors import ConfigError
from pytest_logprob_drift.records import (
    FrozenRecord,
    Lifecycle,
    canonical_json,
    frozen_mapping,
    sha256_hex,
)
from pytest_logprob_drift.registry import entry_points

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Any

ENTRY_POINT_GROUP = "pytest_logprob_drift.operators"
SELECTED_LOGPROB = "selected_logprob"
NATIVE_BACKEND = "native"
TARGETS = ("rollout", "training")


class FallbackPolicy(enum.Enum):
    """What a backend may do when it cannot serve a request."""

    NEVER = "never"
    """Fail; strict execution requires this."""
    DECLARED = "declared"
    """May fall back, but only to a declared backend, and it is recorded as fallback."""


class FactoryStyle(enum.Enum):
    """How the object named by a descriptor's factory becomes a kernel."""

    KERNEL = "kernel"
    """The object is the kernel: ``(logits, token_ids) -> float32 logprobs``."""
    BUILDER = "builder"
    """The object is called as ``builder(target=..., options=...)`` and returns the kernel."""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class OperatorDescriptor(FrozenRecord):
    """Everything a backend declares; immutable, hashed into execution identity."""

    operation: str
    backend_id: str
    target_tags: tuple[str, ...]
    devices: tuple[str, ...]
    dtypes: tuple[str, ...]
    required_topology: Mapping[str, Mapping[str, int]]
    """Per target: e.g. ``{"training": {"min_world_size": 2}}``."""
    alignment_properties: tuple[str, ...]
    lifecycle: Lifecycle
    factory: str | None
    """``module:attr`` of the implementation; None means the runtime's own native path."""
    version: str
    build_fingerprint: str
    fallback_policy: FallbackPolicy = FallbackPolicy.NEVER
    test_only: bool = False
    """A temporary test backend: never accepted from the production entry-point group, and
    resolved only when the execution policy authorizes test-only backends."""
    factory_style: FactoryStyle = FactoryStyle.KERNEL

    @property
    def fingerprint(self) -> str:
        return sha256_hex(canonical_json(self))[:16]

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> OperatorDescriptor:
        """Build from the plain-dict form that entry points return; unknown keys are refused
        (a misspelt field must not be silently ignored)."""
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ConfigError(
                f"entry point {ENTRY_POINT_GROUP}",
                f"operator descriptor "
                f"{data.get('backend_id')!r} has unknown field(s) "
                f"{', '.join(map(repr, unknown))}",
            )
        try:
            return cls(
                operation=str(data["operation"]),
                backend_id=str(data["backend_id"]),
                target_tags=tuple(data["target_tags"]),
                devices=tuple(data["devices"]),
                dtypes=tuple(data["dtypes"]),
                required_topology=frozen_mapping(
                    {k: frozen_mapping(dict(v)) for k, v in data["required_topology"].items()}
                ),
                alignment_properties=tuple(data["alignment_properties"]),
                lifecycle=Lifecycle(data["lifecycle"]),
                factory=data["factory"],
                version=str(data["version"]),
                build_fingerprint=str(data["build_fingerprint"]),
                fallback_policy=FallbackPolicy(data.get("fallback_policy", "never")),
                test_only=bool(data.get("test_only", False)),
                factory_style=FactoryStyle(data.get("factory_style", "kernel")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"entry point {ENTRY_POINT_GROUP}",
                f"malformed operator descriptor {dict(data)!r}: {exc}",
            ) from None


NATIVE_DESCRIPTOR = OperatorDescriptor(
    operation=SELECTED_LOGPROB,
    backend_id=NATIVE_BACKEND,
    target_tags=TARGETS,
    devices=("cpu", "cuda"),
    dtypes=("float32", "bfloat16", "float16"),
    required_topology=frozen_mapping({}),
    alignment_properties=("runtime_native",),
    lifecycle=Lifecycle.ENGINE_CONSTRUCTION,
    factory=None,
    version="runtime",
    build_fingerprint="runtime",
)


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class SemanticOperatorCatalog(FrozenRecord):
    """An immutable set of descriptors keyed by (operation, backend id)."""

    descriptors: tuple[OperatorDescriptor, ...] = ()
    _index: Mapping[tuple[str, str], OperatorDescriptor] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        index: dict[tuple[str, str], OperatorDescriptor] = {}
        for descriptor in self.descriptors:
            key = (descriptor.operation, descriptor.backend_id)
            if key in index and index[key] != descriptor:
                raise ConfigError(
                    f"operator {descriptor.backend_id}", f"two different descriptors register {key}"
                )
            index[key] = descriptor
        object.__setattr__(self, "_index", MappingProxyType(index))

    def get(self, operation: str, backend_id: str) -> OperatorDescriptor | None:
        return self._index.get((operation, backend_id))

    def backend_ids(self, operation: str) -> tuple[str, ...]:
        return tuple(sorted(d.backend_id for d in self.descriptors if d.operation == operation))

    def with_descriptors(self, extra: Iterable[OperatorDescriptor]) -> SemanticOperatorCatalog:
        """A new catalog with ``extra`` added (explicit registration); self is unchanged."""
        return SemanticOperatorCatalog(self.descriptors + tuple(extra))

    def without_test_only(self) -> SemanticOperatorCatalog:
        """The catalog an unauthorized execution registers: test-only backends removed."""
        return SemanticOperatorCatalog(tuple(d for d in self.descriptors if not d.test_only))

    @property
    def fingerprint(self) -> str:
        return sha256_hex(canonical_json(sorted(d.fingerprint for d in self.descriptors)))[:16]


def entry_point_items(group: str, what: str, *, name: str | None = None) -> list[Any]:
    """Every item the providers of ``group`` (or only its entry ``name``) return, in entry
    name order; a provider that cannot be loaded is a ConfigError naming it."""
    found: list[Any] = []
    selected = [ep for ep in entry_points.select(group) if name is None or ep.name == name]
    for entry_point in sorted(selected, key=lambda ep: ep.name):
        try:
            provider = entry_point.load()
            items = list(provider())
        except Exception as exc:  # a broken third-party plugin must not crash planning
            raise ConfigError(
                f"entry point {group}:{entry_point.name}",
                f"cannot load {what} from {entry_point.value!r}: {type(exc).__name__}: {exc}",
            ) from None
        found.extend(items)
    return found


def as_descriptor(item: OperatorDescriptor | Mapping[str, Any]) -> OperatorDescriptor:
    return item if isinstance(item, OperatorDescriptor) else OperatorDescriptor.from_mapping(item)


def load_entry_point_descriptors(group: str = ENTRY_POINT_GROUP) -> tuple[OperatorDescriptor, ...]:
    """Descriptors that installed distributions publish under ``group``."""
    return tuple(as_descriptor(item) for item in entry_point_items(group, "operator descriptors"))


def production_descriptors(
    items: Iterable[OperatorDescriptor], source: str
) -> tuple[OperatorDescriptor, ...]:
    """``items``, refusing any test-only descriptor (named with ``source``)."""
    descriptors = tuple(items)
    for descriptor in descriptors:
        if descriptor.test_only:
            raise ConfigError(
                f"operator {descriptor.backend_id}",
                f"test-only backends cannot be registered through {source}",
            )
    return descriptors


def default_catalog() -> SemanticOperatorCatalog:
    """Built-in ``native`` plus every production entry-point backend; never a test-only one."""
    return SemanticOperatorCatalog(
        (
            NATIVE_DESCRIPTOR,
            *production_descriptors(
                load_entry_point_descriptors(), f"the {ENTRY_POINT_GROUP} entry points"
            ),
        )
    )
