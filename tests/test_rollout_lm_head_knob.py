"""``rollout.lm_head_dtype`` (issue 13): the knob, how each runtime declares it, case ids.

Both rollouts apply both values (vLLM's ``float32`` through ``hf_overrides={"head_dtype":
"float32"}`` since issue 33; its read-back reads the dtype of the logits the workers' samplers
receive). Configs without the field keep their case ids (``case_ids_before_issue13.json``,
checked by ``test_sampling_semantics``); a config that names it gets its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from drift_testing import S0_HF, experiment_config

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.plan.knobs import KNOBS, InvalidKnobValue, Side, canonical_path
from pytest_logprob_drift.records import ApplicationStatus, Lifecycle


def test_the_knob_and_its_aliases() -> None:
    spec = KNOBS["rollout.lm_head_dtype"]
    assert spec.knob.lifecycle is Lifecycle.ENGINE_CONSTRUCTION
    assert canonical_path("rollout.cast_lm_head_to_fp32") == "rollout.lm_head_dtype"
    assert spec.normalize("FP32") == "float32"
    assert spec.normalize("compute_dtype") == "compute"
    with pytest.raises(InvalidKnobValue, match="float32, compute"):
        spec.normalize("bfloat16")
    assert spec.side is Side.ROLLOUT  # reaches the rollout settings and binding


def _config(tmp_path: Path, *, baseline: str, values: list[str]) -> str:
    changes = {
        "baseline.rollout.lm_head_dtype": baseline,
        "interventions": [{"path": "rollout.lm_head_dtype", "values": values}],
    }
    name = f"{baseline}-{'-'.join(values)}.json"
    return str(experiment_config(tmp_path, S0_HF, changes, file_name=name))


def test_a_config_that_names_it_plans_it(tmp_path: Path) -> None:
    plan = plan_file(_config(tmp_path, baseline="compute", values=["fp32"]))
    assert not plan.plan.has_errors
    cases = {c.case.label: c.case for c in plan.cases}
    assert set(cases) == {"baseline", "rollout.lm_head_dtype=float32"}
    assert cases["baseline"].requested["rollout.lm_head_dtype"] == "compute"
    assert cases["rollout.lm_head_dtype=float32"].requested["rollout.lm_head_dtype"] == "float32"
    shipped = {c.case.label: c.case.case_id for c in plan_file(str(S0_HF)).cases}
    assert cases["baseline"].case_id != shipped["baseline"]  # a named field is hashed


def test_transformers_rollout_applies_both_values() -> None:
    pytest.importorskip("transformers")
    from pytest_logprob_drift.runtimes.transformers.adapter import HfAdapter

    for value in ("compute", "float32"):
        record = HfAdapter().materialize({"rollout.lm_head_dtype": value})["rollout.lm_head_dtype"]
        assert record.status is ApplicationStatus.APPLIED, record
        assert record.value == value


def test_vllm_rollout_applies_both_values() -> None:
    """``float32`` through vLLM's ``hf_overrides={"head_dtype": "float32"}`` (issue 33)."""
    pytest.importorskip("transformers")
    from pytest_logprob_drift.runtimes.vllm.adapter import VllmHfAdapter

    adapter = VllmHfAdapter()
    compute = adapter.materialize({"rollout.lm_head_dtype": "compute"})["rollout.lm_head_dtype"]
    assert compute.status is ApplicationStatus.APPLIED
    head = adapter.materialize({"rollout.lm_head_dtype": "float32"})["rollout.lm_head_dtype"]
    assert head.status is ApplicationStatus.APPLIED
    assert head.value == "float32"
    assert "hf_overrides={'head_dtype': 'float32'}" in head.evidence


def test_vllm_read_back_of_the_lm_head_dtype() -> None:
    from pytest_logprob_drift.runtimes.vllm.read_back import lm_head_dtype, model_reports

    def dtype_of(*reports: dict[str, object]) -> str:
        return lm_head_dtype(model_reports(reports))

    assert dtype_of({"lm_head_dtype": "bfloat16"}, {"lm_head_dtype": "bfloat16"}) == "bfloat16"
    assert dtype_of({"lm_head_dtype": "float32"}, {"lm_head_dtype": "bfloat16"}) == (
        "bfloat16,float32"
    )
    assert dtype_of({"vocab": {}}) == "unknown"
