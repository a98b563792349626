"""Semantic operator descriptors, the immutable catalog, and per-case resolution sessions.

Owns what a backend of a semantic operation (``selected_logprob`` first) declares about itself,
the ``SemanticOperatorCatalog`` of immutable descriptors (built-ins plus the entry-point group
``pytest_logprob_drift.operators``), and ``OperatorSession``: one per case, for resolution,
instantiation, caching and provenance, closed when the case ends so nothing leaks into the next
case. Strict resolution never falls back to another backend. Factories are ``module:attr``
strings imported only on instantiation, so describing and planning never import torch. Knows
nothing about configs, planning rules or runtimes.
"""

from __future__ import annotations

import enum
import importlib
import importlib.metadata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pytest_logprob_drift.errors import ConfigError
from pytest_logprob_drift.records import Lifecycle, canonical_json, frozen_mapping, sha256_hex

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


class OperatorResolutionError(Exception):
    """A case asked for a backend that the catalog cannot serve as requested."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code}: {message}")


@dataclass(frozen=True, slots=True, kw_only=True)
class OperatorDescriptor:
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
    is_smoke_only: bool = False
    factory_style: FactoryStyle = FactoryStyle.KERNEL

    @property
    def fingerprint(self) -> str:
        return sha256_hex(canonical_json(self))[:16]

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> OperatorDescriptor:
        """Build from the plain-dict form that entry points return."""
        try:
            return cls(
                operation=str(data["operation"]),
                backend_id=str(data["backend_id"]),
                target_tags=tuple(data["target_tags"]),
                devices=tuple(data["devices"]),
                dtypes=tuple(data["dtypes"]),
                required_topology=frozen_mapping(
                    {k: frozen_mapping(dict(v)) for k, v in data["required_topology"].items()}),
                alignment_properties=tuple(data["alignment_properties"]),
                lifecycle=Lifecycle(data["lifecycle"]),
                factory=data["factory"],
                version=str(data["version"]),
                build_fingerprint=str(data["build_fingerprint"]),
                fallback_policy=FallbackPolicy(data.get("fallback_policy", "never")),
                is_smoke_only=bool(data.get("is_smoke_only", False)),
                factory_style=FactoryStyle(data.get("factory_style", "kernel")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"entry point {ENTRY_POINT_GROUP}",
                              f"malformed operator descriptor {dict(data)!r}: {exc}") from None


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


@dataclass(frozen=True, slots=True)
class SemanticOperatorCatalog:
    """An immutable set of descriptors keyed by (operation, backend id)."""

    descriptors: tuple[OperatorDescriptor, ...] = ()
    _index: Mapping[tuple[str, str], OperatorDescriptor] = field(init=False, repr=False,
                                                                  compare=False)

    def __post_init__(self) -> None:
        index: dict[tuple[str, str], OperatorDescriptor] = {}
        for descriptor in self.descriptors:
            key = (descriptor.operation, descriptor.backend_id)
            if key in index and index[key] != descriptor:
                raise ConfigError(f"operator {descriptor.backend_id}",
                                  f"two different descriptors register {key}")
            index[key] = descriptor
        object.__setattr__(self, "_index", MappingProxyType(index))

    def get(self, operation: str, backend_id: str) -> OperatorDescriptor | None:
        return self._index.get((operation, backend_id))

    def backend_ids(self, operation: str) -> tuple[str, ...]:
        return tuple(sorted(d.backend_id for d in self.descriptors if d.operation == operation))

    def with_descriptors(self, extra: Iterable[OperatorDescriptor]) -> SemanticOperatorCatalog:
        """A new catalog with ``extra`` added (explicit registration); self is unchanged."""
        return SemanticOperatorCatalog(self.descriptors + tuple(extra))

    @property
    def fingerprint(self) -> str:
        return sha256_hex(canonical_json(sorted(d.fingerprint for d in self.descriptors)))[:16]


def load_entry_point_descriptors() -> tuple[OperatorDescriptor, ...]:
    """Descriptors that installed distributions publish under the entry-point group."""
    found: list[OperatorDescriptor] = []
    for entry_point in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP),
                              key=lambda ep: ep.name):
        try:
            provider = entry_point.load()
            items = list(provider())
        except Exception as exc:  # a broken third-party plugin must not crash planning
            raise ConfigError(f"entry point {ENTRY_POINT_GROUP}:{entry_point.name}",
                              f"cannot load operator descriptors from {entry_point.value!r}: "
                              f"{type(exc).__name__}: {exc}") from None
        for item in items:
            found.append(item if isinstance(item, OperatorDescriptor)
                         else OperatorDescriptor.from_mapping(item))
    return tuple(found)


def default_catalog() -> SemanticOperatorCatalog:
    """Built-in ``native`` plus every entry-point backend; smoke backends are never here."""
    descriptors = (NATIVE_DESCRIPTOR, *load_entry_point_descriptors())
    for descriptor in descriptors:
        if descriptor.is_smoke_only:
            raise ConfigError(f"operator {descriptor.backend_id}",
                              "smoke-only backends cannot be registered through entry points")
    return SemanticOperatorCatalog(descriptors)


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolvedOperator:
    """One backend bound to one side of one case."""

    descriptor: OperatorDescriptor
    target: str
    options: Mapping[str, Any]

    def provenance(self) -> dict[str, Any]:
        d = self.descriptor
        return {"operation": d.operation, "target": self.target, "backend": d.backend_id,
                "version": d.version, "build_fingerprint": d.build_fingerprint,
                "descriptor_fingerprint": d.fingerprint, "factory": d.factory,
                "is_smoke_only": d.is_smoke_only, "options": dict(self.options)}


def check_capability(descriptor: OperatorDescriptor, *, target: str, device: str,
                     dtype: str | None, topology: Mapping[str, int],
                     allow_smoke: bool) -> None:
    """Raise OperatorResolutionError if the backend cannot serve this side as requested."""
    ident = f"{descriptor.operation} backend {descriptor.backend_id!r}"
    if descriptor.is_smoke_only and not allow_smoke:
        raise OperatorResolutionError("SMOKE_NOT_AUTHORIZED", f"{ident} is a smoke-only "
                                      "backend; it needs --allow-smoke-operators")
    if target not in descriptor.target_tags:
        raise OperatorResolutionError("UNSUPPORTED_TARGET", f"{ident} does not serve the "
                                      f"{target} side (targets: {list(descriptor.target_tags)})")
    if device not in descriptor.devices:
        raise OperatorResolutionError("UNSUPPORTED_DEVICE", f"{ident} does not run on {device}"
                                      f" (devices: {list(descriptor.devices)})")
    if dtype is not None and dtype not in descriptor.dtypes:
        raise OperatorResolutionError("UNSUPPORTED_DTYPE", f"{ident} does not support {dtype}"
                                      f" (dtypes: {list(descriptor.dtypes)})")
    for key, minimum in descriptor.required_topology.get(target, {}).items():
        name = key.removeprefix("min_")
        have = topology.get(name, 1)
        if have < minimum:
            raise OperatorResolutionError("UNSUPPORTED_TOPOLOGY", f"{ident} needs {target} "
                                          f"{name} >= {minimum}, case has {have}")


class OperatorSession:
    """Per-case resolution, instantiation, cache and provenance. Use as a context manager."""

    def __init__(self, catalog: SemanticOperatorCatalog, *, allow_smoke: bool) -> None:
        self._catalog = catalog
        self._allow_smoke = allow_smoke
        self._cache: dict[tuple[str, str, str], Callable[..., Any]] = {}
        self._resolved: list[ResolvedOperator] = []
        self._closed = False

    def __enter__(self) -> OperatorSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._cache.clear()
        self._resolved.clear()
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("OperatorSession used after close; create one per case")

    def resolve(self, operation: str, target: str, backend_id: str, *, device: str,
                dtype: str | None, topology: Mapping[str, int],
                options: Mapping[str, Any] | None = None) -> ResolvedOperator:
        """Strict: the named backend or an error; never another backend."""
        self._check_open()
        descriptor = self._catalog.get(operation, backend_id)
        if descriptor is None:
            known = ", ".join(self._catalog.backend_ids(operation)) or "none"
            raise OperatorResolutionError("UNKNOWN_BACKEND", f"no {operation} backend "
                                          f"{backend_id!r} is registered (known: {known})")
        check_capability(descriptor, target=target, device=device, dtype=dtype,
                         topology=topology, allow_smoke=self._allow_smoke)
        resolved = ResolvedOperator(descriptor=descriptor, target=target,
                                    options=frozen_mapping(dict(options or {})))
        self._resolved.append(resolved)
        return resolved

    def instantiate(self, resolved: ResolvedOperator) -> Callable[..., Any] | None:
        """Import the backend's factory (cached within this session); None for native."""
        self._check_open()
        descriptor = resolved.descriptor
        factory = descriptor.factory
        if factory is None:
            return None
        key = (factory, resolved.target, canonical_json(resolved.options))
        if key not in self._cache:
            module_name, _, attr = factory.partition(":")
            try:
                module = importlib.import_module(module_name)
                obj = getattr(module, attr)
            except (ImportError, AttributeError) as exc:
                raise OperatorResolutionError("FACTORY_UNAVAILABLE", f"backend "
                                              f"{descriptor.backend_id!r} factory "
                                              f"{factory!r} cannot be loaded: {exc}") from None
            if descriptor.factory_style is FactoryStyle.BUILDER:
                obj = obj(target=resolved.target, options=dict(resolved.options))
            self._cache[key] = obj
        return self._cache[key]

    def provenance(self) -> list[dict[str, Any]]:
        return [r.provenance() for r in self._resolved]
