"""SMOKE_OPERATORS.md's removal procedure holds: with the smoke package and its entry-point
group gone, everything except the S0 smoke cases still plans and runs.

The CLI runs in a fresh interpreter where ``pytest_logprob_drift.runtimes.smoke`` cannot be
imported and the ``pytest_logprob_drift.smoke`` entry-point group is empty, which is exactly
the state after deleting the package and its pyproject entries.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from drift_testing import EXPERIMENTS, S0, S0_HF

import pytest_logprob_drift

SAME_PACKAGE = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        [str(Path(pytest_logprob_drift.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    ),
}
"""The environment of an interpreter that imports the package these tests imported (a
relative ``PYTHONPATH`` would not, from another working directory)."""

SMOKE_REMOVED = """
import sys
import pytest_logprob_drift.registry.entry_points as installed
sys.modules["pytest_logprob_drift.runtimes.smoke"] = None  # the package is deleted
_select = installed.select
def select(group):  # the pyproject entries are deleted
    return [] if group == "pytest_logprob_drift.smoke" else _select(group)
installed.select = select
"""
WITHOUT_SMOKE = (
    SMOKE_REMOVED
    + "from pytest_logprob_drift.cli import main\nraise SystemExit(main(sys.argv[1:]))\n"
)


def cli_without_smoke(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_SMOKE, *args],
        cwd=cwd,
        env=SAME_PACKAGE,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.process  # a fresh interpreter without the smoke package
@pytest.mark.parametrize(
    "config",
    [pytest.param(config, id=config.stem) for config in sorted(EXPERIMENTS.glob("*.json"))],
)
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


@pytest.mark.process  # a fresh interpreter without the smoke package
def test_cpu_smoke_runtime_is_unknown_without_the_smoke_group(tmp_path: Path) -> None:
    result = cli_without_smoke(
        "run", str(S0_HF), "--runtime", "cpu-smoke", "--artifacts", str(tmp_path / "runs"),
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    assert "unknown runtime 'cpu-smoke'; known: hf, vllm-hf" in result.stderr
    assert not (tmp_path / "runs").exists()


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


def test_the_synthetic_checkpoint_is_unknown_to_planning_without_the_smoke_group(
    tmp_path: Path,
) -> None:
    """The synthetic checkpoint's limits are declared by the smoke runtime's record, so they
    leave with it: S0_HF pointed at ``synthetic://cpu-smoke/v1`` (prompt ids up to 960) is
    refused for the synthetic model's 64 ids while the smoke group is registered, and without
    it planning knows nothing of that checkpoint (nor its ``synthetic://`` scheme)."""
    document = json.loads(S0_HF.read_text(encoding="utf-8"))
    document["identity"]["checkpoint"]["uri"] = "synthetic://cpu-smoke/v1"
    config = tmp_path / "synthetic.json"
    config.write_text(json.dumps(document), encoding="utf-8")
    registered = subprocess.run(
        [sys.executable, "-m", "pytest_logprob_drift", "plan", str(config)],
        cwd=tmp_path,
        env=SAME_PACKAGE,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert registered.returncode == 2, registered.stderr
    assert "$.identity.prompts.token_ids[0][0]" in registered.stderr
    assert "vocabulary of synthetic://cpu-smoke/v1 (64 ids" in registered.stderr
    removed = cli_without_smoke("plan", str(config), "--json", cwd=tmp_path)
    assert removed.returncode == 0, removed.stderr
    assert "synthetic" not in removed.stderr
    listed = "from pytest_logprob_drift.policy import runtime_catalog\n"
    listed += "print(sorted(runtime_catalog().checkpoints))\n"
    known = subprocess.run(
        [sys.executable, "-c", SMOKE_REMOVED + listed],
        env=SAME_PACKAGE,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    checkpoints = ast.literal_eval(known.stdout.strip())
    assert "tiny://qwen3-h64-v1" in checkpoints, known.stderr
    assert all(uri.startswith("tiny://") for uri in checkpoints), checkpoints
