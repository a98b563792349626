"""The names of the runtimes, what each can execute, and where its adapter lives.

Owns the static, torch-free description of every runtime (``cpu-smoke``, ``hf``, ``vllm-hf``):
which scenario levels and devices it executes, and the ``module:attr`` of its adapter factory,
imported only when a case executes. A case whose scenario a runtime does not execute is
PLAN_ONLY for that runtime. Adding a runtime is one entry here plus its adapter module; the
planner and runner do not change. Knows nothing about engines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pytest_logprob_drift.errors import UsageError
from pytest_logprob_drift.records import Scenario, ScenarioLevel


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeInfo:
    name: str
    levels: tuple[ScenarioLevel, ...]
    devices: tuple[str, ...]
    adapter: str
    """``module:attr`` of a zero-argument callable returning the RuntimeAdapter."""
    extra: str | None
    summary: str

    def executes(self, scenario: Scenario) -> bool:
        return scenario.level in self.levels and scenario.device in self.devices

    def plan_only_reason(self, scenario: Scenario) -> str:
        levels = "/".join(level.value for level in self.levels)
        return (f"scenario {scenario.level.value} on {scenario.device} is plan-only for runtime "
                f"{self.name!r} (it executes {levels} on {'/'.join(self.devices)})")


RUNTIMES: Mapping[str, RuntimeInfo] = {
    "cpu-smoke": RuntimeInfo(
        name="cpu-smoke", levels=(ScenarioLevel.S0,), devices=("cpu",),
        adapter="pytest_logprob_drift.runtimes.smoke.runtime:CpuSmokeAdapter",
        extra=None, summary="deterministic synthetic model + read-only stateless scorer"),
    "hf": RuntimeInfo(
        name="hf", levels=(ScenarioLevel.S0,), devices=("cpu",),
        adapter="pytest_logprob_drift.runtimes.transformers.adapter:HfAdapter", extra="hf",
        summary="transformers KV-cache generation vs transformers teacher-forced (FSDP opt.)"),
    "vllm-hf": RuntimeInfo(
        name="vllm-hf", levels=(ScenarioLevel.S0, ScenarioLevel.S1), devices=("cpu",),
        adapter="pytest_logprob_drift.runtimes.vllm.adapter:VllmHfAdapter", extra="vllm",
        summary="vLLM rollout engine vs transformers teacher-forced (FSDP opt.)"),
}


def runtime_info(name: str) -> RuntimeInfo:
    if name not in RUNTIMES:
        raise UsageError(f"unknown runtime {name!r}; known: {', '.join(sorted(RUNTIMES))}")
    return RUNTIMES[name]
