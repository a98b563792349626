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

SMOKE_DESCRIPTORS: tuple[OperatorDescriptor, ...] = (
    OperatorDescriptor(
        operation=SELECTED_LOGPROB,
        backend_id=SMOKE_REFERENCE,
        target_tags=("rollout", "training"),
        devices=("cpu",),
        dtypes=("float32", "bfloat16", "float16"),
        required_topology=frozen_mapping({}),
        alignment_properties=("log_softmax_gather",),
        lifecycle=Lifecycle.ENGINE_CONSTRUCTION,
        factory="pytest_logprob_drift.runtimes.smoke.kernels:reference_selected_logprob",
        version="smoke-1",
        build_fingerprint="smoke-1",
        test_only=True,
    ),
    OperatorDescriptor(
        operation=SELECTED_LOGPROB,
        backend_id=SMOKE_OFFSET,
        target_tags=("rollout", "training"),
        devices=("cpu",),
        dtypes=("float32", "bfloat16", "float16"),
        required_topology=frozen_mapping({}),
        alignment_properties=("deliberate_training_side_offset",),
        lifecycle=Lifecycle.ENGINE_CONSTRUCTION,
        factory="pytest_logprob_drift.runtimes.smoke.kernels:build_offset_selected_logprob",
        version="smoke-1",
        build_fingerprint="smoke-1",
        test_only=True,
        factory_style=FactoryStyle.BUILDER,
    ),
    OperatorDescriptor(
        operation=SELECTED_LOGPROB,
        backend_id=SMOKE_ROLLOUT_OFFSET,
        target_tags=("rollout", "training"),
        devices=("cpu",),
        dtypes=("float32", "bfloat16", "float16"),
        required_topology=frozen_mapping({}),
        alignment_properties=("deliberate_rollout_side_offset",),
        lifecycle=Lifecycle.ENGINE_CONSTRUCTION,
        factory="pytest_logprob_drift.runtimes.smoke.kernels:build_rollout_offset_selected_logprob",
        version="smoke-1",
        build_fingerprint="smoke-1",
        test_only=True,
        factory_style=FactoryStyle.BUILDER,
    ),
    OperatorDescriptor(
        operation=SELECTED_LOGPROB,
        backend_id=SMOKE_ROLLOUT_WEIGHT,
        target_tags=("rollout", "training"),
        devices=("cpu",),
        dtypes=("float32", "bfloat16", "float16"),
        required_topology=frozen_mapping({}),
        alignment_properties=("deliberate_rollout_weight_perturbation",),
        lifecycle=Lifecycle.ENGINE_CONSTRUCTION,
        factory="pytest_logprob_drift.runtimes.smoke.kernels:build_rollout_weight_perturbation",
        version="smoke-1",
        build_fingerprint="smoke-1",
        test_only=True,
        factory_style=FactoryStyle.BUILDER,
    ),
)
SMOKE_BACKEND_IDS = frozenset(d.backend_id for d in SMOKE_DESCRIPTORS)
