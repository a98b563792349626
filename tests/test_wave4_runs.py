"""Runs sealed by the fourth wave's release still verify, report and resume with the same outcomes.

``tests/data/wave4/runs/`` holds runs sealed by the code at commit f9371e5 (the last commit of
the fourth wave), before the fifth wave changed any reader: the shipped NeMo-RL, slime and
neutral-JSONL example dumps imported; the S0 smoke experiment with ``--replay``; a transformers
bfloat16 experiment with ``--replay`` and both sides' weight documents; the deep tiny model with
layer diagnostics; and a vLLM rollout whose weights were pushed from the trainer with prefix
caching on (the only read-back whose members were sealed as JSON inside strings).
``tests/data/wave4/EXPECTED.json`` is what that release's ``verify`` and ``report --json`` said
of each run (written by the release itself, never by the code under test): every later release
must say the same.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.drift_testing import cli

DATA = Path(__file__).parent / "data" / "wave4"
EXPECTED: dict[str, Any] = json.loads((DATA / "EXPECTED.json").read_text())
RUNS = sorted(EXPECTED)


@pytest.fixture
def run_copy(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """A writable copy of one sealed run (the committed one is never touched)."""
    target = tmp_path / request.param
    shutil.copytree(DATA / "runs" / request.param, target)
    return target


def _tree_digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _verified_attempts(out: str) -> dict[str, dict[str, str]]:
    """``attempt -> {case_id, status, outcome}`` from verify's attempt table."""
    attempts = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 4 and len(parts[0]) == 16 and parts[2] in ("ok", "invalid"):
            attempts[parts[1]] = {"case_id": parts[0], "status": parts[2], "outcome": parts[3]}
    return attempts


@pytest.mark.parametrize("run_copy", RUNS, indirect=True)
def test_wave4_run_verifies_with_the_same_outcomes(run_copy: Path) -> None:
    expected = EXPECTED[run_copy.name]
    code, out, err = cli("verify", run_copy)
    assert (code, err) == (expected["verify_exit"], ""), out
    assert expected["verify_summary"] in out
    assert _verified_attempts(out) == expected["attempts"]


@pytest.mark.parametrize("run_copy", RUNS, indirect=True)
@pytest.mark.slow
def test_wave4_run_reports_the_same_cases(run_copy: Path, tmp_path: Path) -> None:
    expected = EXPECTED[run_copy.name]
    code, out, err = cli("report", run_copy, "--json", "--html", tmp_path / "page.html")
    assert (code, err) == (expected["report_exit"], ""), out
    report = json.loads(out)
    cases = {
        c["case_id"]: {k: c[k] for k in ("label", "outcome", "active_tokens", "mismatches")}
        for c in report["cases"]
    }
    assert cases == expected["cases"]
    # A later release may rank fewer interventions (what is within the contract is listed
    # apart), never others and never in another order.
    ranked = iter(expected["ranking"])
    assert all(label in ranked for label in report["ranking"]), report["ranking"]
    assert report["invalid"] == 0


def test_wave4_pushed_weights_still_read_as_pushed_from_the_trainer() -> None:
    """The read-back of the pushed case (members sealed as JSON inside strings by that release)
    still says how the weights arrived: pushed from the trainer, prefix cache reset."""
    from pytest_logprob_drift.report.findings import weights_fact
    from pytest_logprob_drift.store.decode import decode
    from pytest_logprob_drift.store.documents import Actual

    run = DATA / "runs" / "wave4-vllm-weight-sync"
    case = EXPECTED[run.name]["cases"]
    (pushed,) = [c for c, row in case.items() if row["label"] == "rollout.weight_sync=trainer"]
    (attempt,) = (run / "cases" / pushed).iterdir()
    actual = decode((attempt / "actual.json").read_bytes(), Actual)
    assert actual.read_back is not None
    fact = weights_fact(actual.read_back)
    assert fact is not None
    assert fact.startswith("pushed from the trainer (trainer)"), fact
    assert "prefix cache reset after the push" in fact, fact


@pytest.mark.parametrize("run_copy", ["wave4-cpu-smoke"], indirect=True)
def test_wave4_smoke_run_resumes_without_touching_a_sealed_byte(run_copy: Path) -> None:
    before = _tree_digests(run_copy / "cases")
    plan = (run_copy / "plan.jsonl").read_bytes()
    code, out, err = cli(
        "run",
        DATA / "smoke.json",
        "--runtime",
        "cpu-smoke",
        "--allow-smoke-operators",
        "--replay",
        "--expect",
        "logp.backend=smoke_only.logp_offset=MISMATCH",
        "--artifacts",
        run_copy.parent,
    )
    assert (code, err) == (0, ""), out
    after = _tree_digests(run_copy / "cases")
    assert {k: after[k] for k in before} == before
    assert (run_copy / "plan.jsonl").read_bytes() == plan  # the same cases: no row added
    code, out, err = cli("verify", run_copy)
    assert (code, err) == (0, ""), out
