"""SMOKE_OPERATORS.md's removal procedure holds: with the smoke package and its entry-point
group gone, everything except the S0 smoke cases still plans and runs.

The CLI runs in a fresh interpreter where ``pytest_logprob_drift.runtimes.smoke`` cannot be
imported and the ``pytest_logprob_drift.smoke`` entry-point group is empty, which is exactly
the state after deleting the package and its pyproject entries.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from drift_testing import EXPERIMENTS, S0, S0_HF

WITHOUT_SMOKE = """
import sys
import pytest_logprob_drift.registry.entry_points as installed
sys.modules["pytest_logprob_drift.runtimes.smoke"] = None  # the package is deleted
_select = installed.select
def select(group):  # the pyproject entries are deleted
    return [] if group == "pytest_logprob_drift.smoke" else _select(group)
installed.select = select
from pytest_logprob_drift.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def cli_without_smoke(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_SMOKE, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.parametrize("config", sorted(EXPERIMENTS.glob("*.json")), ids=lambda p: p.stem)
def test_every_experiment_but_s0_smoke_plans_without_the_smoke_group(
    config: Path, tmp_path: Path
) -> None:
    result = cli_without_smoke("plan", str(config), "--json", cwd=tmp_path)
    if config == S0:
        assert result.returncode == 2
        assert "UNKNOWN_BACKEND" in result.stderr and "smoke_only.logp_reference" in result.stderr
        assert "Traceback" not in result.stderr
        return
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["cases"] and not [i for i in document["issues"] if i["severity"] == "error"]
    for row in document["cases"]:
        assert "cpu-smoke" not in row["executable_by"]


def test_cpu_smoke_runtime_is_unknown_without_the_smoke_group(tmp_path: Path) -> None:
    result = cli_without_smoke(
        "run",
        str(S0_HF),
        "--runtime",
        "cpu-smoke",
        "--artifacts",
        str(tmp_path / "runs"),
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "unknown runtime 'cpu-smoke'; known: hf, vllm-hf" in result.stderr


@pytest.mark.slow
def test_s0_hf_runs_without_the_smoke_group(tmp_path: Path) -> None:
    result = cli_without_smoke(
        "run",
        str(S0_HF),
        "--runtime",
        "hf",
        "--artifacts",
        str(tmp_path / "runs"),
        "--expect",
        "training.compute_dtype=bfloat16=MISMATCH",
        "--expect",
        "rollout.dtype=bfloat16=MISMATCH",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS" in result.stdout and "MISMATCH" in result.stdout
