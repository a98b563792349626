"""Attribution's structural truths on real engines (slow; ``attribution_structure``): in bf16, a
training-only knob leaves the rollout side bitwise equal, a rollout-only knob leaves the training
side bitwise equal on the tokens both executions share, a knob that changes nothing is "no
effect", and a rollout that samples other tokens is compared only on the shared prefix. Here on
transformers; on vLLM in ``test_replay_vllm``, on the attribution its run without replay seals.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from attribution_structure import assert_structure
from drift_testing import EXPERIMENTS, make_runner

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.attribution.document import document_json
from pytest_logprob_drift.attribution.sealed import attribute_and_seal, verify_attribution

pytestmark = pytest.mark.slow


def attribution(
    tmp_path: Path, config: str, runtime: str, interventions: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    document = json.loads((EXPERIMENTS / config).read_text())
    if interventions is not None:
        document["interventions"] = interventions
    path = tmp_path / config
    path.write_text(json.dumps(document))
    plan = plan_file(str(path))
    with make_runner(
        plan, runtime=runtime, artifacts=tmp_path / "runs", baseline_repeats=2
    ) as runner:
        results = runner.run()
    assert {r.outcome.value for r in results} == {"MISMATCH"}  # bf16 on both sides
    baseline = next(r for r in results if r.label == "baseline")
    assert baseline.attempt_dir is not None
    run_dir = tmp_path / "runs" / plan.plan.experiment_id
    sealed = attribute_and_seal(
        run_dir,
        plan.plan.experiment_id,
        baseline.attempt_dir,
        baseline.repeat_dirs,
        [r.attempt_dir for r in results if r is not baseline and r.attempt_dir is not None],
    )
    assert verify_attribution(run_dir, sealed.directory) == []
    document = document_json(sealed.document)  # the sealed record as its JSON data
    return {c["label"]: c for c in document["cases"]} | {"_doc": document}


def test_transformers_bf16_attribution(tmp_path: Path) -> None:
    cases = attribution(
        tmp_path,
        "cross_config_s0_hf_tiny_bf16.json",
        "hf",
        [
            {"path": "training.compute_dtype", "values": ["float32"]},
            {"path": "rollout.dtype", "values": ["float32"]},
            {"path": "training.sharding", "values": ["fsdp"]},
        ],
    )
    assert_structure(
        cases,
        training_only="training.compute_dtype=float32",
        rollout_only="rollout.dtype=float32",
        no_op="training.sharding=fsdp",
    )
