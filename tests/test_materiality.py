"""Only material interventions are ranked (issue 60): a PASS case whose max |diff| is below a
tenth of the contract's threshold is "within the contract", listed apart, never a cause.

The rule is applied here by hand to what the sealed files say (the verdict recomputed from
``token_diffs.pt`` in float64 with numpy, the threshold sealed beside it), and the report's
``ranking``, ``findings.moved``, ``findings.within_contract`` and terminal lines are held
against it; the sealed attribution document stays whole (the run still verifies). The runs:
the two sealed before this change (``tests/data/pre_issue20``) and, slow, a fresh float32
transformers run with ``--baseline-repeats 2``, where noise-sized movements rank by their mean
|diff| ratio.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from drift_testing import cli
from materiality_by_hand import by_hand

from pytest_logprob_drift.attribution.materiality import within_contract

DATA = Path(__file__).parent / "data" / "pre_issue20" / "runs"
ROOT = Path(__file__).resolve().parents[1]


def test_the_rule_at_its_edges() -> None:
    assert within_contract("PASS", 9.99e-5, 1e-3)
    assert not within_contract("PASS", 1e-4, 1e-3)  # at a tenth: material
    assert not within_contract("PASS", 5e-4, 1e-3)
    assert not within_contract("MISMATCH", 0.0, 1e-3)  # a MISMATCH is always material
    assert not within_contract("INVALID_IDENTITY", 0.0, 1e-3)
    assert not within_contract("PASS", None, 1e-3)  # no figure: not known to be small
    assert not within_contract("PASS", float("nan"), 1e-3)
    assert not within_contract("PASS", 0.0, 0.0)
    assert within_contract("PASS", 0.0, 1e-3)


def _check_report(run_dir: Path, tmp_path: Path) -> dict[str, Any]:
    want = by_hand(run_dir)
    code, out, err = cli("report", run_dir, "--no-html", "--json")
    assert code == 0, err
    report = json.loads(out)
    found = report["findings"]
    assert report["ranking"] == want["material"]
    assert found["within_contract"] == want["within"]
    moved = [f["label"] for f in found["moved"]]
    assert moved == [label for label in want["material"] if label not in found["unmoved"]]
    assert [f["rank"] for f in found["moved"]] == list(range(1, len(moved) + 1))
    assert found["unmoved"] == [label for label in want["material"] if label not in moved]
    code, text, err = cli("report", run_dir, "--no-html")
    assert code == 0, err
    ranked_line = next(x for x in text.splitlines() if x.startswith("ranked by effect"))
    assert ranked_line == "ranked by effect on the drift: " + " > ".join(want["material"])
    if want["within"]:
        apart = next(x for x in text.splitlines() if x.startswith("Within the contract"))
        assert apart.endswith(": " + ", ".join(want["within"]) + ".")
    # the sealed document is untouched and still verifies
    (directory,) = sorted((run_dir / "attributions").iterdir())
    assert (directory / "attribution.json").read_bytes() == want["document"]
    code, _, err = cli("verify", run_dir)
    assert code == 0, err
    return want


@pytest.mark.parametrize("name", ["fixture-pre20-cpu-smoke", "fixture-pre20-hf"])
def test_runs_sealed_before_rank_only_material_interventions(name: str, tmp_path: Path) -> None:
    run_dir = tmp_path / name
    shutil.copytree(DATA / name, run_dir)
    want = _check_report(run_dir, tmp_path)
    assert want["within"] == ["batch.size=1"]  # PASS with float32 noise only


@pytest.mark.slow
def test_noise_sized_movements_of_a_float32_run_are_not_ranked(tmp_path: Path) -> None:
    """The float32 transformers run with a measured (zero) noise floor: whatever moved by
    float32 noise is within the contract, the bfloat16 interventions are ranked."""
    artifacts = tmp_path / "runs"
    config = ROOT / "experiments" / "cross_config_s0_hf_tiny.json"
    code, out, err = cli(
        "run", config, "--runtime", "hf", "--baseline-repeats", "2", "--artifacts", artifacts
    )
    assert code in (0, 1), err
    run_dir = artifacts / "s0-hf-tiny"
    want = _check_report(run_dir, tmp_path)
    assert want["within"] and want["material"]
    assert all("bfloat16" in label for label in want["material"])
    # the run's own ranking line says the same
    ranked_line = next(x for x in out.splitlines() if x.startswith("ranked by effect"))
    assert ranked_line == "ranked by effect on the drift: " + " > ".join(want["material"])


WAVE4 = Path(__file__).parent / "data" / "wave4" / "runs"


@pytest.mark.parametrize("name", ["wave4-nemo-rl", "wave4-hf-bf16", "wave4-vllm-weight-sync"])
@pytest.mark.slow
def test_the_terminal_report_is_one_screen(name: str, tmp_path: Path) -> None:
    """One screen (40 lines) for the shipped six-step import and the sealed runs of a few
    cases; ``--verbose`` holds the details (every framework's correction per case)."""
    run_dir = tmp_path / name
    shutil.copytree(WAVE4 / name, run_dir)
    code, out, err = cli("report", run_dir, "--html", tmp_path / "page.html")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) <= 40, out
    assert not any("LOW HIGH" in line for line in lines)
    code, verbose, err = cli("report", run_dir, "--html", tmp_path / "page.html", "--verbose")
    assert code == 0, err
    assert len(verbose.splitlines()) > len(lines)
    assert "OpenRLHF --vllm_is_correction_type tis --vllm_is_truncated_threshold 0.5 5.0" in verbose
    assert verbose.splitlines()[-1].startswith("HTML report: ")
    assert "already exists; not overwritten" in verbose
