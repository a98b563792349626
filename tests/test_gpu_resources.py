"""What a case's engines declare to the Ray launcher on cuda: the in-process GPU included.

Under ``--launcher ray`` the runner packs engine groups side by side while their declared
resources fit. An engine that runs in this process on a GPU (the ``hf`` rollout and unsharded
trainer, a TP-1 vLLM engine) holds that GPU too, so it is declared: otherwise FSDP rank actors
could be packed onto it. On cpu nothing changes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from drift_testing import EXPERIMENTS

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.execute.launch import Launch
from pytest_logprob_drift.execute.protocol import RuntimeBinding, bind_case
from pytest_logprob_drift.runtimes.transformers.adapter import HfAdapter
from pytest_logprob_drift.runtimes.vllm.adapter import IN_PROCESS_ENGINE, VllmHfAdapter


def _bindings(tmp_path: Path, device: str, runtime: str) -> dict[str, RuntimeBinding]:
    document = json.loads((EXPERIMENTS / "cross_config_s0_hf_cuda_bf16.json").read_text())
    document["interventions"] = [{"path": "training.sharding", "values": ["fsdp"]}]
    document["scenario"]["device"] = device
    config = tmp_path / f"{device}.json"
    config.write_text(json.dumps(document))
    plan = plan_file(str(config))
    return {
        ec.case.label: bind_case(
            ec, runtime_kind=runtime, identity=plan.plan.identity, device=device
        )
        for ec in plan.cases
    }


def test_hf_on_cuda_declares_the_gpu_its_in_process_models_hold(tmp_path: Path) -> None:
    adapter = HfAdapter()
    adapter.launch = Launch(launcher="ray")  # the policy only: no cluster is started here
    cuda = _bindings(tmp_path, "cuda", "hf")
    assert adapter.engine_resources(cuda["baseline"]) == {"GPU": 1.0}
    # FSDP: one GPU per rank actor, plus the rollout's in this process
    assert adapter.engine_resources(cuda["training.sharding=fsdp"]) == {"GPU": 3.0}
    cpu = _bindings(tmp_path, "cpu", "hf")
    assert adapter.engine_resources(cpu["baseline"]) == {}
    assert adapter.engine_resources(cpu["training.sharding=fsdp"]) == {"CPU": 2.0}
    adapter.launch = Launch()
    assert adapter.engine_resources(cuda["baseline"]) == {}  # local launcher: nothing to declare


def test_a_tp1_vllm_engine_on_cuda_declares_its_gpu(tmp_path: Path) -> None:
    adapter = VllmHfAdapter()
    adapter.launch = Launch(launcher="ray")
    cuda = _bindings(tmp_path, "cuda", "vllm-hf")
    assert adapter.engine_resources(cuda["baseline"]) == {IN_PROCESS_ENGINE: 1.0, "GPU": 1.0}
    cpu = _bindings(tmp_path, "cpu", "vllm-hf")
    assert adapter.engine_resources(cpu["baseline"]) == {IN_PROCESS_ENGINE: 1.0}
