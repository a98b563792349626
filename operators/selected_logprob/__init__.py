"""Production backends of the ``selected_logprob`` semantic operator and their descriptors.

Owns the list of this package's ``selected_logprob`` backends and their capability data
(``descriptors()``: plain dicts the framework turns into its own descriptor records) and
re-exports the three backend callables. The callables are imported lazily, so reading the
descriptors neither imports torch nor runs any backend code; build fingerprints hash the
backend sources on disk.

Must not know the framework's descriptor, catalog or session types, threshold values, or
which backend a case selects.
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Any

    from .chunked import chunked_selected_logprob
    from .reference import reference_selected_logprob
    from .vocab_parallel import vocab_parallel_selected_logprob

__all__ = [
    "OPERATION",
    "chunked_selected_logprob",
    "descriptors",
    "reference_selected_logprob",
    "vocab_parallel_selected_logprob",
]

OPERATION = "selected_logprob"

_EXPORTS: dict[str, str] = {
    "reference_selected_logprob": "reference",
    "chunked_selected_logprob": "chunked",
    "vocab_parallel_selected_logprob": "vocab_parallel",
}

_PACKAGE_DIR = Path(__file__).resolve().parent
_ALL_DTYPES = ["float32", "bfloat16", "float16"]
_ALL_DEVICES = ["cpu", "cuda"]

# backend_id, module, attribute, version, target tags, required topology per target (numeric
# ``min_<name>`` lower bounds only, as the framework's capability check reads them),
# alignment properties, and the in-package modules whose code the backend executes
# (hashed, in this order, into its build fingerprint).
_BACKENDS: tuple[dict[str, Any], ...] = (
    {
        "backend_id": "rlkernel.reference_logp",
        "module": "reference",
        "attr": "reference_selected_logprob",
        "version": "1.0.0",
        "target_tags": ["rollout", "training"],
        "required_topology": {},
        # Not "exact_to_float_rounding": torch's CPU log_softmax accumulates the exponential
        # sum with visible error at large V (max |diff| vs float64 ~2.6e-5 at V=151,936).
        "alignment_properties": ["fp32_accumulation", "numerical_reference"],
        "sources": ["reference"],
    },
    {
        "backend_id": "rlkernel.chunked_logp",
        "module": "chunked",
        "attr": "chunked_selected_logprob",
        "version": "1.0.0",
        "target_tags": ["rollout", "training"],
        "required_topology": {},
        "alignment_properties": [
            "fp32_accumulation",
            "exact_to_float_rounding",
            "no_full_vocab_materialization",
            "online_logsumexp",
        ],
        "sources": ["chunked", "reference"],
    },
    {
        "backend_id": "rlkernel.vocab_parallel_logp",
        "module": "vocab_parallel",
        # The kernel-protocol entry; vocab_parallel_selected_logprob is its sharded core.
        "attr": "process_group_selected_logprob",
        "version": "1.0.0",
        "target_tags": ["training"],
        "required_topology": {"training": {"min_world_size": 2}},
        "alignment_properties": [
            "fp32_accumulation",
            "exact_to_float_rounding",
            "no_full_vocab_materialization",
            "vocab_parallel_collectives",
        ],
        "sources": ["vocab_parallel", "chunked", "reference"],
    },
)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def build_fingerprint(modules: list[str]) -> str:
    """First 16 hex digits of sha256 over the named sibling modules' source bytes, in order."""
    digest = hashlib.sha256()
    for module in modules:
        source = (_PACKAGE_DIR / f"{module}.py").read_bytes()
        digest.update(f"{module}.py\0{len(source)}\0".encode())
        digest.update(source)
    return digest.hexdigest()[:16]


def descriptors() -> list[dict[str, Any]]:
    """Plain-dict capability descriptions of this package's ``selected_logprob`` backends.

    Keys: operation, backend_id, target_tags, devices, dtypes, required_topology,
    alignment_properties, lifecycle, factory (``module:attr``), version, build_fingerprint,
    fallback_policy, test_only. Fresh objects on each call; callers may keep them.
    """
    return [
        {
            "operation": OPERATION,
            "backend_id": backend["backend_id"],
            "target_tags": list(backend["target_tags"]),
            "devices": list(_ALL_DEVICES),
            "dtypes": list(_ALL_DTYPES),
            "required_topology": {
                tag: dict(values) for tag, values in backend["required_topology"].items()
            },
            "alignment_properties": list(backend["alignment_properties"]),
            "lifecycle": "engine_construction",
            "factory": f"{__name__}.{backend['module']}:{backend['attr']}",
            "version": backend["version"],
            "build_fingerprint": build_fingerprint(list(backend["sources"])),
            "fallback_policy": "never",
            "test_only": False,
        }
        for backend in _BACKENDS
    ]
