"""The CPU smoke runtime and the temporary smoke-only operators, published to the frontends.

Owns the two providers of the ``pytest_logprob_drift.smoke`` entry-point group: the
``cpu-smoke`` runtime description with the built-in checkpoint it serves (its adapter,
``runtime.CpuSmokeAdapter``, is imported only when a case executes) and the descriptors of the
smoke-only ``selected_logprob`` backends (``operators``). Only the frontends (CLI and pytest
plugin) load this group; planning, the runner and the store never name anything here (planning
learns the synthetic checkpoint's limits from the description the frontends hand it).
Importing this package never imports torch. Removing smoke support is deleting this package,
its entry-point group and the frontends' flag (SMOKE_OPERATORS.md).
"""

from __future__ import annotations

from pytest_logprob_drift.records import BuiltinCheckpoint, RuntimeInfo, ScenarioLevel
from pytest_logprob_drift.registry.catalog import OperatorDescriptor

SYNTHETIC = BuiltinCheckpoint(
    uri="synthetic://cpu-smoke/v1", vocab_size=64, seed_multiplier=1_000_003
)
"""The synthetic model of ``runtime.py`` (its ``SYNTHETIC_URI`` and ``VOCAB``; a test keeps
them equal): no fixed context, and sample ``index`` is drawn from a torch generator seeded
with ``seed * 1_000_003 + index``."""

CPU_SMOKE = RuntimeInfo(
    name="cpu-smoke",
    executes_on=(("cpu", (ScenarioLevel.S0,)),),
    adapter="pytest_logprob_drift.runtimes.smoke.runtime:CpuSmokeAdapter",
    extra=None,
    summary="deterministic synthetic model + read-only stateless scorer",
    checkpoints=(SYNTHETIC,),
)


def smoke_runtimes() -> tuple[RuntimeInfo, ...]:
    """Entry point ``runtimes`` of the ``pytest_logprob_drift.smoke`` group."""
    return (CPU_SMOKE,)


def smoke_operators() -> tuple[OperatorDescriptor, ...]:
    """Entry point ``operators`` of the ``pytest_logprob_drift.smoke`` group (all
    ``test_only``)."""
    from pytest_logprob_drift.runtimes.smoke.operators import SMOKE_DESCRIPTORS

    return SMOKE_DESCRIPTORS
