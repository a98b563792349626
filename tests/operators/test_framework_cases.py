"""Production selected-logprob backends pass the framework cases the smoke operators pass.

The contract's precondition for removing the smoke operators: each production backend, bound
through the entry-point catalog (no smoke registration, no authorization flag), runs the S0
framework cases on the cpu-smoke runtime and the baseline on the real hf runtime, and PASSes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.runner import Runner

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ("rlkernel.reference_logp", "rlkernel.chunked_logp")


def _config(tmp_path: Path, source: str, backend: str, *, interventions: list[object]) -> Path:
    document = json.loads((ROOT / "experiments" / source).read_text())
    document["baseline"]["logp"] = {"backend": backend}
    document["interventions"] = interventions
    path = tmp_path / f"{backend}.json"
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize("backend", PRODUCTION)
def test_backend_passes_the_s0_cpu_smoke_cases(tmp_path: Path, backend: str) -> None:
    config = _config(tmp_path, "cross_config_s0_cpu_smoke.json", backend,
                     interventions=[{"path": "batch.size", "values": [1]}])
    execution_plan = plan_file(str(config))
    assert not execution_plan.has_errors
    assert not any(ec.uses_smoke_operators for ec in execution_plan.cases)
    with Runner(execution_plan, runtime="cpu-smoke", artifacts=tmp_path / "runs") as runner:
        results = runner.run()
    assert {r.label: r.outcome for r in results} == {"baseline": Outcome.PASS,
                                                     "batch.size=1": Outcome.PASS}
    provenance = json.loads((results[0].attempt_dir / "actual.json").read_text())  # type: ignore[operator]
    assert {p["backend"] for p in provenance["operator_provenance"]} == {backend}


@pytest.mark.parametrize("backend", PRODUCTION)
def test_backend_passes_the_hf_baseline(tmp_path: Path, backend: str) -> None:
    pytest.importorskip("transformers")
    config = _config(tmp_path, "cross_config_s0_hf_tiny.json", backend, interventions=[])
    execution_plan = plan_file(str(config))
    with Runner(execution_plan, runtime="hf", artifacts=tmp_path / "runs") as runner:
        (result,) = runner.run()
    assert result.outcome is Outcome.PASS, result.reason
    records = {r["knob"]: r for r in result.comparison["records"]}
    assert records["logp.backend"]["actual"] == backend
