"""Descriptors of the temporary smoke-only selected-logprob backends.

Owns the static descriptors of ``smoke_only.logp_reference``, ``smoke_only.logp_offset`` (moves
the training side), ``smoke_only.logp_rollout_offset`` (moves the rollout side) and
``smoke_only.rollout_weight_perturbation`` (changes one weight element on the last vLLM TP rank).
They are CPU-only and ``test_only``; they are published only through the
``pytest_logprob_drift.smoke`` entry-point group (never the production operators group), which
only the frontends load, and executing them needs ``--allow-smoke-operators``. Their kernels
live in ``kernels.py`` (torch), imported only when a case instantiates them. See
SMOKE_OPERATORS.md for why they are temporary and how to remove them. Knows nothing about
planning or runtimes.
"""

from __future__ import annotations

from pytest_logprob_drift.records import Lifecycle, frozen_mapping
from pytest_logprob_drift.registry.catalog import (
    SELECTED_LOGPROB,
    FactoryStyle,
    OperatorDescriptor,
)

SMOKE_REFERENCE = "smoke_only.logp_reference"
SMOKE_OFFSET = "smoke_only.logp_offset"
SMOKE_ROLLOUT_OFFSET = "smoke_only.logp_rollout_offset"
"""Moves the rollout side only (the offset above moves the training side only): proves that a
backend injected into a rollout engine's sampler (vLLM's, in its workers) is what produced the
rollout's logprobs."""
SMOKE_ROLLOUT_WEIGHT = "smoke_only.rollout_weight_perturbation"
"""The reference formula, and, when built inside a vLLM worker on the last tensor-parallel rank,
one element of that rank's ``model.embed_tokens.weight`` changed (its first row, first column,
plus 1): proves that the weight check names a tensor changed on one side on one TP rank."""
OFFSET_MULTIPLE_OF_THRESHOLD = 8.0
"""The offset backend moves training-side logprobs by this multiple of the threshold."""

_KERNELS = "pytest_logprob_drift.runtimes.smoke.kernels"


def _smoke(
    backend_id: str, alignment: str, factory: str, style: FactoryStyle
) -> OperatorDescriptor:
    """One smoke backend: CPU-only, test-only, on both sides, version ``smoke-1``."""
    return OperatorDescriptor(
        operation=SELECTED_LOGPROB,
        backend_id=backend_id,
        target_tags=("rollout", "training"),
        devices=("cpu",),
        dtypes=("float32", "bfloat16", "float16"),
        required_topology=frozen_mapping({}),
        alignment_properties=(alignment,),
        lifecycle=Lifecycle.ENGINE_CONSTRUCTION,
        factory=f"{_KERNELS}:{factory}",
        version="smoke-1",
        build_fingerprint="smoke-1",
        test_only=True,
        factory_style=style,
    )


SMOKE_DESCRIPTORS: tuple[OperatorDescriptor, ...] = (
    _smoke(
        SMOKE_REFERENCE, "log_softmax_gather", "reference_selected_logprob", FactoryStyle.KERNEL
    ),
    _smoke(
        SMOKE_OFFSET,
        "deliberate_training_side_offset",
        "build_offset_selected_logprob",
        FactoryStyle.BUILDER,
    ),
    _smoke(
        SMOKE_ROLLOUT_OFFSET,
        "deliberate_rollout_side_offset",
        "build_rollout_offset_selected_logprob",
        FactoryStyle.BUILDER,
    ),
    _smoke(
        SMOKE_ROLLOUT_WEIGHT,
        "deliberate_rollout_weight_perturbation",
        "build_rollout_weight_perturbation",
        FactoryStyle.BUILDER,
    ),
)
SMOKE_BACKEND_IDS = frozenset(d.backend_id for d in SMOKE_DESCRIPTORS)
