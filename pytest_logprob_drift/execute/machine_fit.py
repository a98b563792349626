"""Whether this machine can run a plan's cases at all, decided before any engine starts.

Owns ``MachineFacts`` (the GPUs a run can see and the engine builds installed, each with how
it was read) and ``machine_refusal``: for a scenario on ``cuda``, every case the runtime would
execute needs as many visible GPUs as the larger of its sides' world sizes (the rollout's
``tensor_parallel_size`` x ``context_parallel_size`` where the runtime's rollout spreads over
devices, and ``training.sharding=fsdp``'s two ranks; both sides share the devices), and the
runtime's engine package must be its CUDA build. A run that does not fit is refused as a
whole, in one line naming each case's need and what the machine has. On ``cpu`` nothing is
checked here. With the Ray launcher the GPUs are the cluster's, which Ray places (its own
resource demands), so only the build is checked. Knows nothing about torch, vLLM or how the
facts were read (``runtimes.machine`` reads them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pytest_logprob_drift.plan.binding import FSDP_WORLD_SIZE, ExecutionPlan
from pytest_logprob_drift.plan.knobs import value_of
from pytest_logprob_drift.records import KnobValue, RuntimeInfo


@dataclass(frozen=True, slots=True, kw_only=True)
class MachineFacts:
    """What this machine offers a run."""

    gpus: int
    gpus_read: str
    """How ``gpus`` was read (e.g. ``torch.cuda.device_count()``, with CUDA_VISIBLE_DEVICES)."""
    cuda_builds: Mapping[str, str | None]
    """Per engine package a runtime needs the CUDA build of: None when that build is
    installed, else what is installed instead (a sentence)."""


def case_gpus(requested: Mapping[str, KnobValue], runtime: RuntimeInfo) -> int:
    """The GPUs one case needs: the larger of the rollout's devices and the trainer's ranks."""

    def size(path: str) -> int:
        value = value_of(requested, path)
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else 1

    rollout = 1
    if runtime.rollout_spreads:
        rollout = size("rollout.tensor_parallel_size") * size("rollout.context_parallel_size")
    training = FSDP_WORLD_SIZE if value_of(requested, "training.sharding") == "fsdp" else 1
    return max(rollout, training)


def machine_refusal(
    plan: ExecutionPlan, runtime: RuntimeInfo, facts: MachineFacts, *, ray: bool
) -> str | None:
    """Why this machine cannot run ``plan``'s cases on ``runtime`` (one line), or None."""
    scenario = plan.plan.scenario
    if scenario.device != "cuda" or not runtime.executes(scenario):
        return None
    device, checkpoint = scenario.device, plan.plan.identity.checkpoint.uri
    cases = [ec for ec in plan.cases if not ec.runtime_refusals(runtime, device, checkpoint)]
    if not cases:
        return None
    problems: list[str] = []
    if runtime.cuda_build is not None:
        instead = facts.cuda_builds.get(runtime.cuda_build, "not checked")
        if instead is not None:
            problems.append(
                f"runtime {runtime.name!r} needs {runtime.cuda_build}'s CUDA build; {instead}"
            )
    if not ray:
        needs = [(ec.case.label, case_gpus(ec.case.requested, runtime)) for ec in cases]
        short = [(label, n) for label, n in needs if n > facts.gpus]
        if short:
            problems.append(
                "cases need more GPUs than this machine shows: "
                + "; ".join(f"{label} needs {n}" for label, n in short)
                + f"; this machine has {_gpus(facts)}"
            )
    if not problems:
        return None
    return f"this machine cannot run scenario {scenario.level.value} on cuda: " + "; ".join(
        problems
    )


def _gpus(facts: MachineFacts) -> str:
    count = "no CUDA device" if facts.gpus == 0 else f"{facts.gpus} visible GPU(s)"
    return f"{count} ({facts.gpus_read})"
