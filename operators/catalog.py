"""Descriptors of the production ``selected_logprob`` backends, published by entry point.

Owns the capability data the framework needs to plan and bind these backends (targets, devices,
dtypes, required topology, alignment properties, version and build fingerprint, fallback
policy). It is registered under the entry-point group ``pytest_logprob_drift.operators``, the
same path an external workstream uses. It never imports the kernels (so planning never imports
torch): the build fingerprint hashes the kernel's source file instead.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import Any

VERSION = "1.0.0"
_PACKAGE = __package__ or "logprob_drift_operators"


def _source_fingerprint(module_file: str) -> str:
    try:
        data = resources.files(_PACKAGE).joinpath("selected_logprob", module_file).read_bytes()
    except (FileNotFoundError, OSError):
        return "missing"
    return hashlib.sha256(data).hexdigest()[:16]


def _descriptor(backend_id: str, module: str, attr: str, *, targets: list[str],
                topology: dict[str, dict[str, int]], properties: list[str]) -> dict[str, Any]:
    return {
        "operation": "selected_logprob",
        "backend_id": backend_id,
        "target_tags": targets,
        "devices": ["cpu", "cuda"],
        "dtypes": ["float32", "bfloat16", "float16"],
        "required_topology": topology,
        "alignment_properties": properties,
        "lifecycle": "engine_construction",
        "factory": f"{_PACKAGE}.selected_logprob.{module}:{attr}",
        "version": VERSION,
        "build_fingerprint": _source_fingerprint(f"{module}.py"),
        "fallback_policy": "never",
        "is_smoke_only": False,
    }


def descriptors() -> list[dict[str, Any]]:
    """Entry-point provider: plain dicts the framework turns into OperatorDescriptor records."""
    return [
        _descriptor("rlkernel.reference_logp", "reference", "reference_selected_logprob",
                    targets=["rollout", "training"], topology={},
                    properties=["fp32_accumulation", "numerical_reference"]),
        _descriptor("rlkernel.chunked_logp", "chunked", "chunked_selected_logprob",
                    targets=["rollout", "training"], topology={},
                    properties=["fp32_accumulation", "exact_to_float_rounding",
                                "no_full_vocab_materialization"]),
        _descriptor("rlkernel.vocab_parallel_logp", "vocab_parallel",
                    "vocab_parallel_selected_logprob", targets=["training"],
                    topology={"training": {"min_world_size": 2}},
                    properties=["fp32_accumulation", "vocab_parallel_collectives"]),
    ]
