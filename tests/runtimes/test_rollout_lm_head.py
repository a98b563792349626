"""``rollout.lm_head_dtype`` on real engines: the transformers rollout applies ``float32``
(read back from its live LM head), and so does vLLM (``hf_overrides={"head_dtype":
"float32"}``, read back from the logits its workers' samplers receive; issue 33).
On the same vLLM engine, the identity's ``min_p`` is observed in the requests the worker ran.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from drift_testing import S0_HF, S1, experiment_config, make_runner, run_by_label

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.outcomes import Outcome

pytestmark = pytest.mark.slow

CASE = "rollout.lm_head_dtype=float32"


def _config(source: Path, path: Path, experiment_id: str, rollout_dtype: str) -> str:
    changes = {
        "experiment_id": experiment_id,
        "baseline.rollout.dtype": rollout_dtype,
        "baseline.rollout.lm_head_dtype": "compute",
        "interventions": [{"path": "rollout.lm_head_dtype", "values": ["float32"]}],
    }
    return str(experiment_config(path.parent, source, changes, file_name=path.name))


def _knobs(result: Any) -> dict[str, Any]:
    knobs: dict[str, Any] = json.loads((result.attempt_dir / "actual.json").read_text())["knobs"]
    return knobs


def test_transformers_rollout_runs_its_lm_head_in_float32(tmp_path: Path) -> None:
    plan = plan_file(_config(S0_HF, tmp_path / "hf.json", "hf-rollout-head", "bfloat16"))
    results = run_by_label(plan, runtime="hf", artifacts=tmp_path / "runs")
    for label, head in (("baseline", "compute"), (CASE, "float32")):
        result = results[label]
        assert result.outcome in (Outcome.PASS, Outcome.MISMATCH), (label, result.reason)
        record = _knobs(result)["rollout.lm_head_dtype"]
        assert (record["status"], record["actual"]) == ("applied", head), record
        assert _knobs(result)["rollout.dtype"]["actual"] == "bfloat16"


def test_vllm_runs_compute_and_a_float32_head(tmp_path: Path) -> None:
    """Also: the identity's min_p (and top_p) observed on the running engine, in the requests
    its worker's batch took in, and reported for identity validation."""
    pytest.importorskip("vllm")
    config = _config(S1, tmp_path / "vllm.json", "vllm-rollout-head", "float32")
    document = json.loads(Path(config).read_text())
    document["identity"]["sampling"].update({"min_p": 0.05, "top_p": 0.9})
    Path(config).write_text(json.dumps(document))
    plan = plan_file(config)
    with make_runner(plan, runtime="vllm-hf", artifacts=tmp_path / "runs") as runner:
        results = {r.label: r for r in runner.run()}
        constructions = runner.pool.rollout_constructions
    baseline = results["baseline"]
    assert baseline.outcome is Outcome.PASS, baseline.reason
    knobs = _knobs(baseline)
    assert knobs["rollout.lm_head_dtype"]["actual"] == "compute"
    assert knobs["rollout.lm_head_dtype"]["status"] == "applied"
    # Since issue 33: vLLM's hf_overrides={"head_dtype": "float32"}, its own engine.
    head = results[CASE]
    assert head.outcome is Outcome.PASS, head.reason
    record = _knobs(head)["rollout.lm_head_dtype"]
    assert (record["status"], record["actual"]) == ("applied", "float32"), record
    assert constructions == 2
    # The workers' LM head weight, read back from the live engine: the model's dtype.
    read_back = json.loads((baseline.attempt_dir / "actual.json").read_text())["read_back"]
    assert read_back["vllm.lm_head_dtype"] == read_back["vllm.dtype"] == "float32"
    applied = read_back["vllm.sampling_applied"]
    assert applied["observed"] is True
    assert applied["values"] == [{"temperature": 1.0, "top_p": 0.9, "top_k": 0, "min_p": 0.05}]
    sides = json.loads((baseline.attempt_dir / "identity.json").read_text())
    assert sides["rollout"]["sampling_min_p"] == sides["training"]["sampling_min_p"] == 0.05
    assert sides["rollout"]["sampling_top_p"] == 0.9
