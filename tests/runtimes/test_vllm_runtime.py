"""The ``vllm-hf`` runtime: the S1 experiment through the pytest plugin with the real vLLM engine.

One real pytest run (pytester, in a subprocess) executes every S1 case; the tests then read the
sealed artifacts it left. A lying adapter (it builds an fp32 engine when bf16 is requested)
proves that an ``actual`` that disagrees with ``requested`` is STRICT_REJECTED.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from drift_testing import plugin_run

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.execute.runner import Runner
from pytest_logprob_drift.execute.side_settings import DType
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.policy import assemble
from pytest_logprob_drift.runtimes.vllm.adapter import VllmHfAdapter, VllmRollout

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "experiments" / "cross_config_s1_vllm_cpu_tiny.json"


@pytest.fixture(scope="module")
def s1_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the whole S1 experiment once through the plugin (real pytest, subprocess)."""
    workdir = tmp_path_factory.mktemp("s1")
    run = plugin_run(
        workdir,
        CONFIG,
        "--drift-expect",
        "rollout.dtype=bfloat16=MISMATCH",
        "--junitxml",
        workdir / "junit.xml",
        runtime="vllm-hf",
    )
    assert run["run_dir"].name == "s1-vllm-cpu-tiny"
    return run


def test_s1_through_the_plugin_gives_the_expected_verdicts(s1_run: dict[str, Any]) -> None:
    proc = s1_run["proc"]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "7 passed" in proc.stdout
    assert "6 PASS, 1 MISMATCH" in proc.stdout
    outcomes = {label: c["comparison"]["outcome"] for label, c in s1_run["cases"].items()}
    assert outcomes == {
        "baseline": "PASS",
        "batch.size=1": "PASS",
        "rollout.dtype=bfloat16": "MISMATCH",
        "rollout.tensor_parallel_size=2": "PASS",
        "training.sharding=fsdp": "PASS",
        "rollout.enforce_eager=false": "PASS",
        "rollout.enable_prefix_caching=true": "PASS",
    }
    baseline = s1_run["cases"]["baseline"]["comparison"]
    assert baseline["diagnostics"]["max_abs_diff"] < 1e-4


def test_tp2_case_ran_two_vllm_workers(s1_run: dict[str, Any]) -> None:
    attempt = s1_run["cases"]["rollout.tensor_parallel_size=2"]["attempt"]
    actual = json.loads((attempt / "actual.json").read_text())
    assert actual["knobs"]["rollout.tensor_parallel_size"]["actual"] == 2
    assert actual["knobs"]["rollout.tensor_parallel_size"]["status"] == "applied"
    assert actual["read_back"]["vllm.num_worker_processes"] == 2
    assert actual["read_back"]["vllm.tensor_parallel_size"] == 2
    # TP vocabulary layout is derived and recorded.
    assert "vllm.vocab_layout" in actual["read_back"]


def test_engine_settings_are_read_back_from_vllm(s1_run: dict[str, Any]) -> None:
    cases = s1_run["cases"]
    knobs = json.loads(
        (cases["rollout.enforce_eager=false"]["attempt"] / "actual.json").read_text()
    )["knobs"]
    assert knobs["rollout.enforce_eager"]["actual"] is False
    knobs = json.loads(
        (cases["rollout.enable_prefix_caching=true"]["attempt"] / "actual.json").read_text()
    )["knobs"]
    assert knobs["rollout.enable_prefix_caching"]["actual"] is True
    knobs = json.loads((cases["rollout.dtype=bfloat16"]["attempt"] / "actual.json").read_text())[
        "knobs"
    ]
    assert knobs["rollout.dtype"]["actual"] == "bfloat16"
    fsdp = json.loads((cases["training.sharding=fsdp"]["attempt"] / "actual.json").read_text())
    assert fsdp["training_evidence"]["world_size"] == 2


def test_junitxml_carries_the_verdicts(s1_run: dict[str, Any], tmp_path: Path) -> None:
    proc = s1_run["proc"]
    assert proc.returncode == 0
    junit = Path(proc.args[proc.args.index("--junitxml") + 1]).read_text()
    assert 'name="drift_outcome" value="MISMATCH"' in junit


class _LyingAdapter(VllmHfAdapter):
    """Builds an fp32 engine whatever dtype the case requests (a silent fallback)."""

    def build_rollout(self, binding: Any, identity: Any) -> VllmRollout:
        settings = dataclasses.replace(binding.rollout_settings, dtype=DType.FLOAT32)
        return VllmRollout(
            dataclasses.replace(binding, rollout_settings=settings),
            identity,
            self.checkpoint(identity),
        )


def test_actual_that_disagrees_with_requested_is_strict_rejected(tmp_path: Path) -> None:
    execution_plan = plan_file(str(CONFIG))
    bf16 = [ec for ec in execution_plan.cases if ec.case.label == "rollout.dtype=bfloat16"]
    catalogs = assemble()
    with Runner(
        execution_plan,
        runtime="vllm-hf",
        runtimes=catalogs.runtimes,
        catalog=catalogs.operators,
        artifacts=tmp_path,
        adapter=_LyingAdapter(),
    ) as runner:
        (result,) = runner.run(bf16)
    assert result.outcome is Outcome.STRICT_REJECTED
    assert "rollout.dtype" in result.reason and "fallback" in result.reason
    records = {r["knob"]: r for r in result.comparison.to_json()["records"]}
    assert records["rollout.dtype"]["actual"] == "float32"
    assert records["rollout.dtype"]["requested"] == "bfloat16"
