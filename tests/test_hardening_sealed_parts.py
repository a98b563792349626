"""Re-sealed layer parts that lie (issue 40, items 3, 5 and 6), on the real commands.

One run with every optional part (layers, replay, importance sampling) is sealed once per
module by the smoke runtime with a layer capture and replays (``tests/sealed_parts.py``, a few
seconds, no real engine). Each test copies it, rewrites comparison.json's
``diagnostics.layers`` or a layer file, re-seals it as anyone who can write an unkeyed run can
(``tests/resealing.py``) and runs ``verify``, ``report`` (text, ``--json``) and ``run`` (a
resume) in this process (``drift_testing.cli``); the report whose stderr must hold no warning
runs as a process (a child of the ``cli_process`` fork server: pytest records warnings in this
one instead of printing them). A sealed value outside its
documented range or a reduction record that lies makes the attempt invalid, naming
comparison.json and the JSON path, in one line; never exit 3 or a traceback; a resume executes
the case again. A reduction that is valid but has a reference state of norm 0 is reported
without a warning on stderr.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_processes import ForkServer
from drift_testing import cli_completed

from pytest_logprob_drift.numerics.layer_reduction import compare, state_digests
from tests import sealed_parts
from tests.resealing import reseal

LABEL = "rollout.dtype=bfloat16"
"""The case whose two sides' states differ (the rollout in bfloat16)."""
REDUCTION = "$.diagnostics.layers.reduction"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sealed_parts.sealed_run(tmp_path_factory.mktemp("sealed-parts"))


@pytest.fixture
def run_dir(pristine: Path, tmp_path: Path) -> Path:
    shutil.copytree(pristine.parent, tmp_path / "runs")
    shutil.copy(pristine.parent.parent / "sealed-parts.json", tmp_path / "sealed-parts.json")
    return tmp_path / "runs" / sealed_parts.EXPERIMENT


def _attempt(run_dir: Path, label: str = LABEL) -> Path:
    [found] = [
        p.parent
        for p in sorted(run_dir.glob("cases/*/*/comparison.json"))
        if json.loads(p.read_text())["label"] == label
    ]
    return found


Command = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def command() -> Command:
    """``logprob-drift ARGS`` in this process (``cli_completed(*args, cwd=...)``): exit code,
    stdout, stderr."""
    return cli_completed


def _edit_reduction(attempt: Path, run_dir: Path, **changes: Any) -> None:
    path = attempt / "comparison.json"
    document = json.loads(path.read_text())
    document["diagnostics"]["layers"]["reduction"].update(changes)
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    reseal(run_dir, path)


def _invalid_entry(command: Command, run_dir: Path, attempt: Path) -> dict[str, Any]:
    """verify --json's entry for ``attempt``: exit 1, nothing on stderr, the attempt invalid."""
    verified = command("verify", run_dir, "--json", cwd=run_dir.parent)
    assert (verified.returncode, verified.stderr) == (1, ""), verified.stderr
    [entry] = [
        a for a in json.loads(verified.stdout)["attempts"] if a["attempt_id"] == attempt.name
    ]
    assert entry["status"] == "invalid", entry
    return entry


@pytest.mark.slow  # renders two report pages and resumes the run (tens of seconds)
def test_positions_per_row_0_is_an_invalid_attempt_for_verify_report_and_resume(
    run_dir: Path,
    command: Command,
) -> None:
    """Issue 40, item 3: was ``ValueError: positions_per_row must be >= 1, got 0``, exit 3."""
    attempt = _attempt(run_dir)
    _edit_reduction(attempt, run_dir, positions_per_row=0)
    expected = f"{REDUCTION}.positions_per_row: Expected `int` >= 1"

    entry = _invalid_entry(command, run_dir, attempt)
    assert (entry["file"], entry["detail"]) == ("comparison.json", expected)
    table = command("verify", run_dir, cwd=run_dir.parent)
    assert (table.returncode, table.stderr) == (1, "")
    [line] = [line for line in table.stdout.splitlines() if line.startswith(attempt.parent.name)]
    assert line.split()[2:] == ["invalid", "comparison.json", *expected.split()]

    text = command("report", run_dir, "--html", run_dir.parent / "page.html", cwd=run_dir.parent)
    assert (text.returncode, text.stderr) == (0, ""), text.stderr
    assert f"invalid attempt (not shown): {attempt.parent.name}/{attempt.name}" in text.stdout
    as_json = command(
        "report", run_dir, "--json", "--html", run_dir.parent / "page2.html", cwd=run_dir.parent
    )
    assert (as_json.returncode, as_json.stderr) == (0, ""), as_json.stderr
    assert expected in json.dumps(json.loads(as_json.stdout))

    config = run_dir.parent.parent / "sealed-parts.json"
    resumed = command(*sealed_parts.run_command(run_dir.parent, config), cwd=run_dir.parent)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr
    results = json.loads(resumed.stdout)["results"]
    assert all(r["attempt_dir"] != str(attempt) for r in results)
    [again] = [r for r in results if r["case_id"] == attempt.parent.name and not r["reused"]]
    assert again["attempt_dir"] is not None
    assert sum(r["reused"] for r in results) == 3  # the other attempts stand


@pytest.mark.parametrize(
    ("key", "value", "made_with"),
    [("projection_dim", 7, 64), ("projection_seed", 0, 20261201), ("digest_bytes", 15, 16)],
)
def test_a_reduction_record_that_lies_is_an_invalid_attempt(
    run_dir: Path, command: Command, key: str, value: int, made_with: int
) -> None:
    """Issue 40, item 5: a re-sealed ``projection_dim: 7`` or ``projection_seed: 0`` verified
    as ok (the recorded parameters were never compared with the sealed reductions')."""
    attempt = _attempt(run_dir)
    _edit_reduction(attempt, run_dir, **{key: value})
    entry = _invalid_entry(command, run_dir, attempt)
    assert entry["file"] == "comparison.json"
    assert entry["detail"] == (
        f"{REDUCTION}.{key}: recorded {value}, the sealed reductions were made with {made_with}"
    )


@pytest.mark.slow  # renders a report page (tens of seconds on a loaded machine)
@pytest.mark.process  # the process's own stderr: pytest records warnings in this one
def test_a_reference_state_of_norm_0_is_reported_without_warnings(
    run_dir: Path, cli_process: ForkServer
) -> None:
    """Issue 40, item 6: the training side's embeddings all zero (norms and projections 0, the
    digests of zeros: a consistent reduction that verifies) make relative errors of about
    1e300; the report printed matplotlib's ``RuntimeWarning: overflow encountered in exp``."""
    attempt = _attempt(run_dir)
    training_path = attempt / "layers_training.pt"
    training = torch.load(training_path, weights_only=True)
    rollout = torch.load(attempt / "layers_rollout.pt", weights_only=True)
    n = int(training["norms"].shape[1])
    training["norms"][0] = 0.0
    training["projections"][0] = 0.0
    training["digests"][0] = state_digests(torch.zeros((n, 32), dtype=torch.float32))
    torch.save(training, training_path)
    figures = compare(training, rollout)
    assert figures["states"][0]["max_rel_error"] > 1e290
    comparison_path = attempt / "comparison.json"
    document = json.loads(comparison_path.read_text())
    document["diagnostics"]["layers"]["figures"] = figures
    comparison_path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    reseal(run_dir, training_path)
    reseal(run_dir, comparison_path)

    verified = cli_process("verify", run_dir, "--json", cwd=run_dir.parent)
    assert verified.stderr == ""
    [entry] = [
        a for a in json.loads(verified.stdout)["attempts"] if a["attempt_id"] == attempt.name
    ]
    assert entry["status"] == "ok", entry
    page = run_dir.parent / "page.html"
    reported = cli_process("report", run_dir, "--html", page, cwd=run_dir.parent)
    assert reported.returncode == 0
    assert "RuntimeWarning" not in reported.stderr
    assert reported.stderr == ""
    assert "layers-by-state" in page.read_text()
