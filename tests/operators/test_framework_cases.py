"""Production selected-logprob backends pass the framework cases the smoke operators pass.

The contract's precondition for removing the smoke operators: each production backend, bound
through the entry-point catalog (no smoke registration, no authorization flag), runs the S0
framework cases on the cpu-smoke runtime and the baseline on the real hf runtime, and PASSes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from drift_testing import ROOT, experiment_config, make_runner

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.outcomes import Outcome

PRODUCTION = ("rlkernel.reference_logp", "rlkernel.chunked_logp")


def _config(tmp_path: Path, source: str, backend: str, *, interventions: list[object]) -> Path:
    changes = {"baseline.logp": {"backend": backend}, "interventions": interventions}
    return experiment_config(tmp_path, source, changes, file_name=f"{backend}.json")


@pytest.mark.parametrize("backend", PRODUCTION)
def test_backend_passes_the_s0_cpu_smoke_cases(tmp_path: Path, backend: str) -> None:
    config = _config(
        tmp_path,
        "cross_config_s0_cpu_smoke.json",
        backend,
        interventions=[{"path": "batch.size", "values": [1]}],
    )
    execution_plan = plan_file(str(config))
    assert not execution_plan.has_errors
    assert not any(ec.uses_test_only_operators for ec in execution_plan.cases)
    with make_runner(execution_plan, runtime="cpu-smoke", artifacts=tmp_path / "runs") as runner:
        results = runner.run()
    assert {r.label: r.outcome for r in results} == {
        "baseline": Outcome.PASS,
        "batch.size=1": Outcome.PASS,
    }
    provenance = json.loads((results[0].attempt_dir / "actual.json").read_text())  # type: ignore[operator]
    assert {p["backend"] for p in provenance["operator_provenance"]} == {backend}


@pytest.mark.slow
@pytest.mark.parametrize("backend", PRODUCTION)
def test_backend_passes_the_hf_baseline(tmp_path: Path, backend: str) -> None:
    pytest.importorskip("transformers")
    config = _config(tmp_path, "cross_config_s0_hf_tiny.json", backend, interventions=[])
    execution_plan = plan_file(str(config))
    with make_runner(execution_plan, runtime="hf", artifacts=tmp_path / "runs") as runner:
        (result,) = runner.run()
    assert result.outcome is Outcome.PASS, result.reason
    records = {r.knob: r.to_json() for r in result.comparison.records}
    assert records["logp.backend"]["actual"] == backend


@pytest.mark.slow
def test_vocab_parallel_backend_passes_inside_fsdp_ranks(tmp_path: Path) -> None:
    """The vocab-parallel backend runs its collectives in the 2 real FSDP training ranks (each
    keeps its vocabulary shard) against the reference backend on the rollout side."""
    pytest.importorskip("transformers")
    document = json.loads((ROOT / "experiments" / "cross_config_s0_hf_tiny.json").read_text())
    del document["baseline"]["logp"]
    document["baseline"]["training"]["sharding"] = "fsdp"
    document["operators"] = {
        "selected_logprob": {
            "rollout": "rlkernel.reference_logp",
            "training": "rlkernel.vocab_parallel_logp",
        }
    }
    document["interventions"] = []
    config = tmp_path / "vocab_parallel.json"
    config.write_text(json.dumps(document))
    execution_plan = plan_file(str(config))
    assert not execution_plan.has_errors, execution_plan.issues
    with make_runner(execution_plan, runtime="hf", artifacts=tmp_path / "runs") as runner:
        (result,) = runner.run()
    assert result.outcome is Outcome.PASS, result.reason
    assert result.comparison.diagnostics.max_abs_diff < 1e-4
    actual = json.loads((result.attempt_dir / "actual.json").read_text())  # type: ignore[operator]
    evidence = actual["training_evidence"]
    assert evidence["world_size"] == 2
    assert evidence["logp_backend"].endswith("vocab_parallel:process_group_selected_logprob")
    assert {p["backend"] for p in actual["operator_provenance"]} == {
        "rlkernel.reference_logp",
        "rlkernel.vocab_parallel_logp",
    }


def test_vocab_parallel_backend_is_refused_without_a_training_world(tmp_path: Path) -> None:
    """Its descriptor requires training world size >= 2: an unsharded case does not bind."""
    document = json.loads((ROOT / "experiments" / "cross_config_s0_hf_tiny.json").read_text())
    del document["baseline"]["logp"]
    document["operators"] = {
        "selected_logprob": {
            "rollout": "rlkernel.reference_logp",
            "training": "rlkernel.vocab_parallel_logp",
        }
    }
    document["interventions"] = []
    config = tmp_path / "unsharded.json"
    config.write_text(json.dumps(document))
    execution_plan = plan_file(str(config))
    codes = {i.code for i in execution_plan.issues}
    assert "UNSUPPORTED_TOPOLOGY" in codes
    issue = next(i for i in execution_plan.issues if i.code == "UNSUPPORTED_TOPOLOGY")
    assert issue.path == "$.operators.selected_logprob.training"
