"""The semantic-offset diagnostic at temperature 0.7 on the ``hf`` and ``vllm-hf`` runtimes
(real tiny Qwen3).

top_p 0.9 at temperature 0.7: the rollout reporting processed logprobs against a raw trainer
is MISMATCH, and the diagnostic says the processed distribution recomputed from the trainer's
full logits explains it (``log S`` cannot at T != 1); the raw baseline PASSes without it. The
run verifies offline (``verify`` recomputes the diagnostic from the sealed tensors).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from drift_testing import S0_HF, S1, experiment_config, run_by_label

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.check.verify import verify_run
from pytest_logprob_drift.execute.runner import CaseResult
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.report.html import render_page
from pytest_logprob_drift.report.load import load_report

pytestmark = pytest.mark.slow

ROLLOUT = "rollout.logprobs_mode=processed_logprobs"


def _config(source: Path, tmp_path: Path, experiment_id: str) -> str:
    changes = {
        "experiment_id": experiment_id,
        "identity.sampling.temperature": 0.7,
        "identity.sampling.top_p": 0.9,
        "diagnostics": {"full_vocabulary": True},
        "baseline.rollout.logprobs_mode": "raw_logprobs",
        "interventions": [{"path": "rollout.logprobs_mode", "values": ["processed_logprobs"]}],
    }
    return str(experiment_config(tmp_path, source, changes, file_name="config.json"))


def _explained_as_processed_rollout(
    results: dict[str, CaseResult], run_dir: Path
) -> dict[str, Any]:
    """The baseline passes without the diagnostic firing; the processed-logprobs rollout case
    mismatches, explained as ``processed_rollout``; the run verifies. Returns the diagnostic."""
    baseline, processed = results["baseline"], results[ROLLOUT]
    assert baseline.outcome is Outcome.PASS, baseline.reason
    assert baseline.comparison.to_json()["diagnostics"]["semantic_offset"]["fires"] is False
    assert processed.outcome is Outcome.MISMATCH, processed.reason
    offset: dict[str, Any] = processed.comparison.to_json()["diagnostics"]["semantic_offset"]
    assert offset["fires"] is True and offset["explanation"] == "processed_rollout", offset
    assert {s.status for s in verify_run(run_dir)} == {"ok"}
    return offset


def test_temperature_0_7_processed_rollout_is_explained(tmp_path: Path) -> None:
    results = run_by_label(
        plan_file(_config(S0_HF, tmp_path, "hf-offset-t07")),
        runtime="hf",
        artifacts=tmp_path / "runs",
    )
    offset = _explained_as_processed_rollout(results, tmp_path / "runs" / "hf-offset-t07")
    assert offset["message"].startswith(
        "processed semantics: the rollout's logprobs match the processed distribution "
        "(temperature 0.7, top_p 0.9)"
    )
    # People see it: the report's case table and the case section.
    page = render_page(load_report(tmp_path / "runs" / "hf-offset-t07", page_dir=tmp_path))
    assert "<h3>Full-vocabulary divergence</h3>" in page
    assert "processed semantics: the rollout&#x27;s logprobs match" in page
    # the semantic-offset column (behind the case table's "more columns" toggle)
    assert "<td class='words more'>processed_rollout</td>" in page


def test_temperature_0_7_processed_vllm_rollout_is_explained(tmp_path: Path) -> None:
    """The same on vLLM: its ``processed_logprobs`` at temperature 0.7 and top_p 0.9 are the
    processed distribution recomputed from the transformers trainer's full logits."""
    pytest.importorskip("vllm")
    results = run_by_label(
        plan_file(_config(S1, tmp_path, "vllm-offset-t07")),
        runtime="vllm-hf",
        artifacts=tmp_path / "runs",
    )
    _explained_as_processed_rollout(results, tmp_path / "runs" / "vllm-offset-t07")
