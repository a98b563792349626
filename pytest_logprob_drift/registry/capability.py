"""Whether one backend can serve one side of one case, as its descriptor declares.

Owns ``check_capability`` and its ``OperatorResolutionError``: the side it serves (target),
device, dtype and minimum topology a descriptor declares, and the execution policy's refusals
(a test-only backend without authorization, a backend that may fall back under strict
execution). Planning asks it for every case without importing the per-case
``OperatorSession``, which asks it again before building a kernel. Knows nothing about
configs, planning or runtimes.
"""

from __future__ import annotations

from collections.abc import Mapping

from pytest_logprob_drift.registry.catalog import FallbackPolicy, OperatorDescriptor


class OperatorResolutionError(Exception):
    """A case asked for a backend that the catalog cannot serve as requested."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code}: {message}")


def check_capability(
    descriptor: OperatorDescriptor,
    *,
    target: str,
    device: str,
    dtype: str | None,
    topology: Mapping[str, int],
    allow_test_only: bool,
    strict: bool = True,
) -> None:
    """Raise OperatorResolutionError if the backend cannot serve this side as requested."""
    ident = f"{descriptor.operation} backend {descriptor.backend_id!r}"
    if descriptor.test_only and not allow_test_only:
        raise OperatorResolutionError(
            "TEST_ONLY_NOT_AUTHORIZED",
            f"{ident} is a test-only backend; the execution policy does not authorize it",
        )
    if strict and descriptor.fallback_policy is not FallbackPolicy.NEVER:
        raise OperatorResolutionError(
            "FALLBACK_POLICY",
            f"{ident} declares fallback policy "
            f"{descriptor.fallback_policy.value!r}; strict execution "
            "needs a backend that never falls back",
        )
    if target not in descriptor.target_tags:
        raise OperatorResolutionError(
            "UNSUPPORTED_TARGET",
            f"{ident} does not serve the {target} side (targets: {list(descriptor.target_tags)})",
        )
    if device not in descriptor.devices:
        raise OperatorResolutionError(
            "UNSUPPORTED_DEVICE",
            f"{ident} does not run on {device} (devices: {list(descriptor.devices)})",
        )
    if dtype is not None and dtype not in descriptor.dtypes:
        raise OperatorResolutionError(
            "UNSUPPORTED_DTYPE",
            f"{ident} does not support {dtype} (dtypes: {list(descriptor.dtypes)})",
        )
    for key, minimum in descriptor.required_topology.get(target, {}).items():
        name = key.removeprefix("min_")
        have = topology.get(name, 1)
        if have < minimum:
            raise OperatorResolutionError(
                "UNSUPPORTED_TOPOLOGY",
                f"{ident} needs {target} {name} >= {minimum}, case has {have}",
            )
