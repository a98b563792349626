"""The scenario device on the transformers side: models placed on it and read back live.

Both ``hf`` sides (the rollout and the unsharded trainer) load their model on the scenario's
device and report the device the live parameters are on (``rollout.device`` and
``training.device`` in ``actual``); a device this torch build or machine cannot offer is
refused in one line (exit code 2), never a traceback and never CPU numbers recorded as cuda
ones. The ``hf`` runtime declares S0 on cuda (one GPU, no FSDP), and its shipped experiment
plans without torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from drift_testing import EXPERIMENTS, REPO, S0_HF, cli

CUDA_EXPERIMENT = EXPERIMENTS / "cross_config_s0_hf_cuda_bf16.json"


def _torch_has_cuda() -> bool:
    torch = pytest.importorskip("torch")
    return bool(torch.cuda.is_available())


def test_the_cuda_experiment_plans_torch_free_and_executes_on_hf() -> None:
    code = (
        "import json, sys\n"
        "from pytest_logprob_drift import plan_file\n"
        "from pytest_logprob_drift.policy import assemble\n"
        f"plan = plan_file({str(CUDA_EXPERIMENT)!r})\n"
        "runtimes = assemble().runtimes\n"
        "print(json.dumps({'labels': [ec.case.label for ec in plan.cases],\n"
        "  'device': plan.plan.scenario.device, 'level': plan.plan.scenario.level.value,\n"
        "  'executing': runtimes.executing(plan.plan.scenario),\n"
        "  'loaded': sorted(m for m in ('torch', 'transformers', 'vllm', 'ray')\n"
        "                   if m in sys.modules)}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    result = json.loads(done.stdout)
    assert result["loaded"] == []
    assert (result["level"], result["device"]) == ("S0", "cuda")
    assert "hf" in result["executing"]
    assert result["labels"] == [
        "baseline",
        "batch.size=1",
        "training.attention_backend=eager",
        "training.compute_dtype=float32",
        "rollout.dtype=float32",
        "training.lm_head_dtype=float32",
    ]
    document = json.loads(CUDA_EXPERIMENT.read_text())
    baseline = document["baseline"]
    assert baseline["rollout"]["dtype"] == baseline["training"]["compute_dtype"] == "bfloat16"
    assert baseline["training"]["sharding"] == "none"  # one GPU: no FSDP


def test_check_device_names_what_this_build_cannot_offer() -> None:
    torch = pytest.importorskip("torch")
    from pytest_logprob_drift.runtimes.transformers.engine import DeviceUnavailable, check_device

    assert check_device("cpu") == torch.device("cpu")
    with pytest.raises(DeviceUnavailable, match=r"device 'tpu' is not supported|unknown device"):
        check_device("tpu")
    if torch.cuda.is_available():
        assert check_device("cuda").type == "cuda"
    else:
        with pytest.raises(DeviceUnavailable, match=r"^device 'cuda' (needs a CUDA build|: torch)"):
            check_device("cuda")


def test_a_cuda_run_without_a_gpu_is_refused_in_one_line(tmp_path: Path) -> None:
    if _torch_has_cuda():
        pytest.skip("this machine has a GPU: the cuda experiment runs (scripts/gpu_check.py)")
    code, out, err = cli("run", "--runtime", "hf", "--artifacts", tmp_path, CUDA_EXPERIMENT)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    # the machine check, before any engine: every case needs a GPU this machine lacks
    assert lines[0].startswith(
        "logprob-drift: error: this machine cannot run scenario S0 on cuda: cases need more "
        "GPUs than this machine shows: baseline needs 1; "
    ), lines[0]
    assert "this machine has no CUDA device (torch " in lines[0]
    assert "Traceback" not in err + out
    # nothing was written, let alone sealed as a cuda result
    assert not list(tmp_path.rglob("*"))


@pytest.mark.slow
def test_both_hf_sides_load_on_the_scenario_device_and_read_it_back() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from pytest_logprob_drift import plan_file
    from pytest_logprob_drift.execute.protocol import bind_case
    from pytest_logprob_drift.runtimes.transformers.adapter import HfAdapter

    execution_plan = plan_file(str(S0_HF))
    plan = execution_plan.plan
    (ec,) = [ec for ec in execution_plan.cases if ec.case.label == "baseline"]
    adapter = HfAdapter()
    binding = bind_case(ec, runtime_kind="hf", identity=plan.identity, device="cpu")
    rollout = adapter.build_rollout(binding, plan.identity)
    scorer = adapter.build_training(binding, plan.identity)
    try:
        # the live parameters, read here with plain torch
        assert next(rollout.model.parameters()).device == torch.device("cpu")
        assert next(scorer.model.parameters()).device == torch.device("cpu")
        assert rollout.read_back()["rollout.device"] == "cpu"
        assert scorer.read_back()["training.device"] == "cpu"
    finally:
        rollout.close()
        scorer.close()
        adapter.close()
    if not torch.cuda.is_available():
        cuda = bind_case(ec, runtime_kind="hf", identity=plan.identity, device="cuda")
        from pytest_logprob_drift.errors import UsageError

        with pytest.raises(UsageError, match=r"^scenario\.device: device 'cuda' "):
            HfAdapter().build_rollout(cuda, plan.identity)
        with pytest.raises(UsageError, match=r"^scenario\.device: device 'cuda' "):
            HfAdapter().build_training(cuda, plan.identity)
