"""Per-case operator resolution: instantiation, caching and provenance.

Owns ``OperatorSession``: one per case, resolving each side's backend strictly (the named
backend or an error, never another backend), refusing test-only backends unless the execution
policy authorizes them and backends that may fall back internally under strict execution,
importing factories lazily (``module:attr``), caching kernels for the case and recording
provenance; it is closed when the case ends so nothing leaks into the next case. Knows nothing
about configs, planning or runtimes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pytest_logprob_drift.records import (
    FrozenRecord,
    JsonObject,
    JsonValue,
    canonical_json,
    frozen_mapping,
)
from pytest_logprob_drift.references import UnresolvedReference, resolve_reference
from pytest_logprob_drift.registry.capability import OperatorResolutionError, check_capability
from pytest_logprob_drift.registry.catalog import (
    FactoryStyle,
    OperatorDescriptor,
    SemanticOperatorCatalog,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Any, TypedDict

    class KernelReference(TypedDict):
        """What another process needs to build a side's kernel by name and prove which it
        built (``ResolvedOperator.reference``); plain JSON, sent to vLLM workers."""

        backend: str
        factory: str
        factory_style: str
        target: str
        options: JsonObject
        version: str
        build_fingerprint: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class ResolvedOperator(FrozenRecord):
    """One backend bound to one side of one case."""

    descriptor: OperatorDescriptor
    target: str
    options: Mapping[str, JsonValue]

    def provenance(self) -> JsonObject:
        d = self.descriptor
        return {
            "operation": d.operation,
            "target": self.target,
            "backend": d.backend_id,
            "version": d.version,
            "build_fingerprint": d.build_fingerprint,
            "descriptor_fingerprint": d.fingerprint,
            "factory": d.factory,
            "test_only": d.test_only,
            "options": dict(self.options),
        }

    def reference(self) -> KernelReference | None:
        """What another process needs to build this side's kernel by name and prove which it
        built (None for the runtime's native path): the backend id, the factory
        (``module:attr``) and its style, the target and options a builder is called with, and
        the descriptor's version and build fingerprint."""
        d = self.descriptor
        if d.factory is None:
            return None
        return {
            "backend": d.backend_id,
            "factory": d.factory,
            "factory_style": d.factory_style.value,
            "target": self.target,
            "options": dict(self.options),
            "version": d.version,
            "build_fingerprint": d.build_fingerprint,
        }


class OperatorSession:
    """Per-case resolution, instantiation, cache and provenance. Use as a context manager."""

    def __init__(
        self, catalog: SemanticOperatorCatalog, *, allow_test_only: bool, strict: bool = True
    ) -> None:
        self._catalog = catalog
        self._allow_test_only = allow_test_only
        self._strict = strict
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

    def resolve(
        self,
        operation: str,
        target: str,
        backend_id: str,
        *,
        device: str,
        dtype: str | None,
        topology: Mapping[str, int],
        options: Mapping[str, JsonValue] | None = None,
    ) -> ResolvedOperator:
        """Strict: the named backend or an error; never another backend."""
        self._check_open()
        descriptor = self._catalog.get(operation, backend_id)
        if descriptor is None:
            known = ", ".join(self._catalog.backend_ids(operation)) or "none"
            raise OperatorResolutionError(
                "UNKNOWN_BACKEND",
                f"no {operation} backend {backend_id!r} is registered (known: {known})",
            )
        check_capability(
            descriptor,
            target=target,
            device=device,
            dtype=dtype,
            topology=topology,
            allow_test_only=self._allow_test_only,
            strict=self._strict,
        )
        resolved = ResolvedOperator(
            descriptor=descriptor, target=target, options=frozen_mapping(dict(options or {}))
        )
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
            try:
                obj = resolve_reference(factory)
            except UnresolvedReference as exc:
                raise OperatorResolutionError(
                    "FACTORY_UNAVAILABLE",
                    f"backend "
                    f"{descriptor.backend_id!r} factory "
                    f"{factory!r} cannot be loaded: "
                    f"{exc.message}",
                ) from None
            if descriptor.factory_style is FactoryStyle.BUILDER:
                obj = obj(target=resolved.target, options=dict(resolved.options))
            self._cache[key] = obj
        return self._cache[key]

    def provenance(self) -> list[JsonObject]:
        return [r.provenance() for r in self._resolved]
