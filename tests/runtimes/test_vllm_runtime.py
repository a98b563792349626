"""The ``vllm-hf`` runtime: the S1 experiment through the pytest plugin with the real vLLM engine.

One real pytest run (pytester, in a subprocess) executes every S1 case; the tests then read the
sealed artifacts it left. (The lying adapter, an fp32 engine handed to a bf16 case, runs on
the shared engine of ``test_vllm_engine.py``.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from drift_testing import plugin_run, skip_unless_installed

skip_unless_installed("vllm")

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
