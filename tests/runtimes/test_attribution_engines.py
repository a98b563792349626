"""Attribution's structural truths on real engines (slow): in bf16, a training-only knob leaves
the rollout side bitwise equal, a rollout-only knob leaves the training side bitwise equal on
the tokens both executions share, a knob that changes nothing is "no effect", and a rollout
that samples other tokens is compared only on the shared prefix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from drift_testing import EXPERIMENTS, make_runner

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.attribution.analysis import NO_EFFECT
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


def assert_structure(
    cases: dict[str, Any], *, training_only: str, rollout_only: str, no_op: str
) -> None:
    assert cases["_doc"]["noise_floor"]["rollout_max_abs_delta"] == 0.0  # CPU: run to run exact
    assert cases["_doc"]["noise_floor"]["training_max_abs_delta"] == 0.0
    training = cases[training_only]
    assert training["rollout"]["max_abs_delta"] == 0.0
    assert training["rollout"]["bitwise_equal_fraction"] == 1.0
    assert training["training"]["max_abs_delta"] > 0.0
    assert training["earliest_divergence"] is None
    assert training["classification"].startswith("moved the training side")
    rollout = cases[rollout_only]
    assert rollout["training"]["max_abs_delta"] == 0.0  # on the shared tokens
    assert rollout["rollout"]["max_abs_delta"] > 0.0
    assert "moved the rollout side" in rollout["classification"]
    if rollout["earliest_divergence"] is not None:  # other tokens: only the prefix is compared
        assert rollout["shared_tokens"] < training["shared_tokens"]
        assert rollout["classification"].startswith(
            f"changed the sampled tokens from position {rollout['earliest_divergence']}"
        )
    assert cases[no_op]["classification"] == NO_EFFECT


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


def test_vllm_bf16_attribution(tmp_path: Path) -> None:
    cases = attribution(
        tmp_path,
        "cross_config_s1_vllm_cpu_tiny_bf16.json",
        "vllm-hf",
        [
            {"path": "training.compute_dtype", "values": ["float32"]},
            {"path": "rollout.dtype", "values": ["float32"]},
            {"path": "rollout.enable_prefix_caching", "values": [True]},
        ],
    )
    assert_structure(
        cases,
        training_only="training.compute_dtype=float32",
        rollout_only="rollout.dtype=float32",
        no_op="rollout.enable_prefix_caching=true",
    )
