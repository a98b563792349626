"""What the runtimes declare they execute on which device, and what the machine must offer.

``RuntimeInfo.executes_on`` pairs levels with devices: ``vllm-hf`` executes S0/S1 on cpu and
S0-S3 on cuda, so S2 on cpu stays PLAN_ONLY while the shipped S2 experiment (cuda) lists
``vllm-hf`` for every case. ``rollout.context_parallel_size`` > 1 is refused at planning with
vLLM's rule and what the checkpoint's config.json says (a GQA Qwen3-8B, the tiny models), and
executable for an MLA config on cuda. ``run`` of a cuda scenario on this machine (no GPU,
vLLM's CPU build) exits 2 in one line before anything is imported or written. No engine starts
here; planning stays torch-free (checked in a subprocess).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.execute.machine_fit import MachineFacts, case_gpus, machine_refusal
from pytest_logprob_drift.policy import runtime_catalog
from pytest_logprob_drift.records import Scenario, ScenarioLevel
from pytest_logprob_drift.runtimes import HF, TINY_CHECKPOINTS, VLLM_HF
from pytest_logprob_drift.runtimes.machine import cuda_build
from tests.drift_testing import cli

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"
S2 = EXPERIMENTS / "cross_config_s2_vllm_tp_vs_fsdp.json"
S3 = EXPERIMENTS / "cross_config_s3_qwen3_8b_tp4_cp4_bf16.json"

QWEN3_8B_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 36,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
}
"""The attention fields of Qwen3-8B's config.json as published (GQA: 32 query heads over 8
KV heads, no latent attention)."""

MLA_CONFIG = {  # DeepSeek-V2-Lite's attention fields, the vocabulary widened to hold S3's ids
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "kv_lora_rank": 512,
    "vocab_size": 152064,
    "max_position_embeddings": 163840,
}


def _plan_json(config: Path) -> dict[str, Any]:
    code, out, err = cli("plan", config, "--json")
    assert code == 0, err
    document: dict[str, Any] = json.loads(out)
    return document


def _with(tmp_path: Path, source: Path, **changes: Any) -> Path:
    doc = json.loads(source.read_text())
    for dotted, value in changes.items():
        target = doc
        *parents, leaf = dotted.split("__")
        for part in parents:
            target = target[part]
        target[leaf] = value
    path = tmp_path / "experiment.json"
    path.write_text(json.dumps(doc))
    return path


def _checkpoint(tmp_path: Path, config: dict[str, Any]) -> Path:
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return directory


# ------------------------------------------------------------------ declarations by pair


def test_levels_are_declared_per_device() -> None:
    on = {(level, device) for device, levels in VLLM_HF.executes_on for level in levels}
    assert on == {
        (ScenarioLevel.S0, "cpu"),
        (ScenarioLevel.S1, "cpu"),
        *((level, "cuda") for level in ScenarioLevel),
    }
    for level in ScenarioLevel:
        for device in ("cpu", "cuda"):
            scenario = Scenario(level=level, device=device)
            assert VLLM_HF.executes(scenario) is ((level, device) in on), (level, device)
    assert not VLLM_HF.executes(Scenario(level=ScenarioLevel.S2, device="cpu"))
    assert VLLM_HF.executes(Scenario(level=ScenarioLevel.S2, device="cuda"))
    assert VLLM_HF.where() == "S0/S1 on cpu; S0/S1/S2/S3 on cuda"
    assert HF.where() == "S0 on cpu; S0 on cuda"
    reason = VLLM_HF.plan_only_reason(Scenario(level=ScenarioLevel.S2, device="cpu"))
    assert reason == (
        "scenario S2 on cpu is plan-only for runtime 'vllm-hf' (it executes S0/S1 on cpu; "
        "S0/S1/S2/S3 on cuda)"
    )


def test_the_shipped_s2_experiment_is_executable_by_vllm_on_cuda_only() -> None:
    document = _plan_json(S2)
    assert document["scenario"] == {"level": "S2", "device": "cuda"}
    assert len(document["cases"]) == 6
    assert all(c["executable_by"] == ["vllm-hf"] for c in document["cases"])
    assert document["runtime_refusals"] == []


def test_s2_on_cpu_is_plan_only(tmp_path: Path) -> None:
    config = _with(
        tmp_path,
        S2,
        scenario={"level": "S2", "device": "cpu"},
        baseline__training__attention_backend="sdpa",
    )
    document = _plan_json(config)
    assert all(c["executable_by"] == [] for c in document["cases"])
    code, out, _ = cli("plan", config)
    assert code == 0
    assert all(line.rstrip().endswith("plan-only") for line in out.splitlines()[3:9])


def test_planning_stays_torch_free() -> None:
    script = (
        "import sys\n"
        "from pytest_logprob_drift.cli import main\n"
        "import io, contextlib\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    code = main(['plan', {str(S3)!r}, '--json'])\n"
        "heavy = sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules)\n"
        "print(code, heavy)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert done.stdout.strip() == "0 []", done.stderr[-2000:]


# ------------------------------------------------------------------ context parallelism


def test_tiny_checkpoints_declare_the_attention_they_are_built_with() -> None:
    from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint

    for declared in TINY_CHECKPOINTS:
        built = resolve_checkpoint(declared.uri, expected_digest=None).path
        config = json.loads((built / "config.json").read_text())
        assert (declared.model_type, declared.attention_heads, declared.kv_heads) == (
            config["model_type"],
            config["num_attention_heads"],
            config["num_key_value_heads"],
        ), declared.uri
        assert "kv_lora_rank" not in config


def test_s3_is_refused_for_vllm_with_its_rule_when_the_checkpoint_is_absent() -> None:
    document = _plan_json(S3)
    assert all(c["executable_by"] == [] for c in document["cases"])
    (refusal,) = document["runtime_refusals"]
    assert refusal["runtime"] == "vllm-hf"
    assert refusal["labels"] == [c["label"] for c in document["cases"]]
    reason = refusal["reason"]
    assert reason.startswith(
        "runtime 'vllm-hf' cannot run rollout.context_parallel_size=4: it becomes vLLM's "
        "prefill_context_parallel_size, which vLLM 0.32 runs only on CUDA, on model runner V2"
    )
    assert "the checkpoint's attention cannot be read: /models/Qwen3-8B/config.json" in reason
    assert "decode_context_parallel_size is a different setting" in reason


def test_s3_on_qwen3_8b_restates_its_config(tmp_path: Path) -> None:
    model = _checkpoint(tmp_path, QWEN3_8B_CONFIG)
    config = _with(tmp_path, S3, identity__checkpoint__uri=str(model))
    document = _plan_json(config)
    assert all(c["executable_by"] == [] for c in document["cases"])
    (refusal,) = document["runtime_refusals"]
    assert (
        f"{model}/config.json: model_type 'qwen3', 32 attention heads, 8 KV heads (GQA), "
        "no kv_lora_rank (not MLA)" in refusal["reason"]
    )
    code, out, _ = cli("plan", config)
    assert code == 0
    (note,) = [line for line in out.splitlines() if line.startswith("note:")]
    assert note.startswith("note: not executable by vllm-hf (baseline, batch.size=1, ")
    assert "8 KV heads (GQA)" in note


def test_an_mla_checkpoint_on_cuda_is_executable(tmp_path: Path) -> None:
    model = _checkpoint(tmp_path, MLA_CONFIG)
    config = _with(tmp_path, S3, identity__checkpoint__uri=str(model))
    document = _plan_json(config)
    assert all(c["executable_by"] == ["vllm-hf"] for c in document["cases"])
    assert document["runtime_refusals"] == []
    # the same plan and checkpoint: the runner's check (before any engine) agrees
    plan = plan_file(str(config))
    (ec, *_) = plan.cases
    assert ec.runtime_refusals(VLLM_HF, "cuda", str(model)) == []
    rule = VLLM_HF.context_parallel
    assert rule is not None
    assert ec.runtime_refusals(VLLM_HF, "cpu", str(model)) == [
        "runtime 'vllm-hf' cannot run rollout.context_parallel_size=4 on cpu: it becomes "
        f"vLLM's prefill_context_parallel_size only on cuda ({rule.rule})"
    ]


def test_a_tiny_checkpoint_with_context_parallelism_is_refused_on_both_devices(
    tmp_path: Path,
) -> None:
    doc = json.loads((EXPERIMENTS / "cross_config_s1_vllm_cpu_tiny.json").read_text())
    doc = copy.deepcopy(doc)
    doc["baseline"].setdefault("rollout", {})["context_parallel_size"] = 1
    doc["interventions"] = [{"path": "rollout.context_parallel_size", "values": [2]}]
    for device, needle in (
        (
            "cuda",
            "tiny://qwen3-h64-v1 (declared): model_type 'qwen3', 2 attention heads, "
            "1 KV heads (MQA), no kv_lora_rank (not MLA)",
        ),
        (
            "cpu",
            "rollout.context_parallel_size=2 on cpu: it becomes vLLM's "
            "prefill_context_parallel_size only on cuda",
        ),
    ):
        doc["scenario"] = {"level": "S1", "device": device}
        path = tmp_path / f"{device}.json"
        path.write_text(json.dumps(doc))
        document = _plan_json(path)
        baseline, cp = document["cases"]
        assert baseline["executable_by"] == ["vllm-hf"]
        assert cp["executable_by"] == []
        (refusal,) = document["runtime_refusals"]
        assert refusal["labels"] == ["rollout.context_parallel_size=2"]
        assert needle in refusal["reason"], refusal["reason"]


def test_unreadable_configs_are_named(tmp_path: Path) -> None:
    from pytest_logprob_drift.config.attention_layout import attention_layout

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("[1, 2]")
    assert attention_layout(str(bad), {}) == f"{bad}/config.json is not a JSON object"
    (bad / "config.json").write_text("{")
    assert attention_layout(str(bad), {}) == f"{bad}/config.json cannot be read (JSONDecodeError)"
    assert attention_layout("hub://x", {}) == (
        "'hub://x' is no local checkpoint directory and no built-in checkpoint"
    )
    nested = _checkpoint(tmp_path, {"model_type": "wrapper", "text_config": MLA_CONFIG})
    layout = attention_layout(str(nested), {})
    assert not isinstance(layout, str)
    assert layout.mla and layout.kv_lora_rank == 512 and layout.model_type == "deepseek_v2"


# ------------------------------------------------------------------ the machine


def test_case_needs_are_the_larger_side() -> None:
    plan = plan_file(str(S2))
    needs = {ec.case.label: case_gpus(ec.case.requested, VLLM_HF) for ec in plan.cases}
    assert needs == {
        "baseline": 2,  # TP 2, FSDP 2
        "rollout.tensor_parallel_size=1": 2,  # FSDP 2
        "rollout.enforce_eager=true": 2,
        "rollout.enable_prefix_caching=false": 2,
        "training.sharding=none": 2,  # TP 2
        "logp.backend=rlkernel.reference_logp": 2,
    }
    s3 = plan_file(str(S3))
    assert {case_gpus(ec.case.requested, VLLM_HF) for ec in s3.cases} == {16}  # TP 4 x CP 4
    assert {case_gpus(ec.case.requested, HF) for ec in s3.cases} == {2}  # FSDP only


def test_machine_refusal_names_each_case_and_the_machine() -> None:
    plan = plan_file(str(S2))
    one = MachineFacts(gpus=1, gpus_read="counted", cuda_builds={"vllm": None})
    refusal = machine_refusal(plan, VLLM_HF, one, ray=False)
    assert refusal == (
        "this machine cannot run scenario S2 on cuda: cases need more GPUs than this machine "
        "shows: baseline needs 2; rollout.tensor_parallel_size=1 needs 2; "
        "rollout.enforce_eager=true needs 2; rollout.enable_prefix_caching=false needs 2; "
        "training.sharding=none needs 2; logp.backend=rlkernel.reference_logp needs 2; this "
        "machine has 1 visible GPU(s) (counted)"
    )
    two = MachineFacts(gpus=2, gpus_read="counted", cuda_builds={"vllm": None})
    assert machine_refusal(plan, VLLM_HF, two, ray=False) is None
    cpu_build = MachineFacts(gpus=8, gpus_read="counted", cuda_builds={"vllm": "installed is X"})
    assert machine_refusal(plan, VLLM_HF, cpu_build, ray=True) == (
        "this machine cannot run scenario S2 on cuda: runtime 'vllm-hf' needs vllm's CUDA "
        "build; installed is X"
    )
    # Ray places GPUs itself: only the build is checked
    assert machine_refusal(plan, VLLM_HF, one, ray=True) is None
    # a runtime that does not execute the scenario plans it only: nothing to check
    assert machine_refusal(plan, HF, one, ray=False) is None


def test_cuda_build_is_read_from_the_installed_distribution() -> None:
    assert cuda_build("vllm", {}) == "vllm is not installed"
    assert cuda_build("vllm", {"vllm": ["vllm"]}) is None
    here = cuda_build("vllm")  # this machine: vLLM's CPU wheel
    assert here is not None and here.startswith("installed is vllm") and "(cpu build)" in here


@pytest.mark.process  # sys.modules of a fresh interpreter
def test_run_of_s2_here_is_refused_before_any_engine(tmp_path: Path) -> None:
    """``run`` of S2 with vllm-hf in a fresh interpreter, reporting whether it imported vllm;
    the artifacts directory does not exist afterwards."""
    artifacts = tmp_path / "runs"
    script = (
        "import sys\n"
        "from pytest_logprob_drift.cli import main\n"
        f"code = main(['run', {str(S2)!r}, '--runtime', 'vllm-hf', '--artifacts', "
        f"{str(artifacts)!r}])\n"
        "print('EXIT', code, 'vllm' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        check=False,
    )
    sealed_something = artifacts.exists()
    assert done.stdout.strip().splitlines()[-1] == "EXIT 2 False", done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("logprob-drift: error: this machine cannot run scenario S2 on cuda: ")
    assert "runtime 'vllm-hf' needs vllm's CUDA build; installed is vllm" in line
    assert "baseline needs 2" in line and "this machine has no CUDA device (torch " in line
    assert not sealed_something


def test_the_catalog_hands_the_runtimes_their_pairs() -> None:
    catalog = runtime_catalog()
    assert catalog.get("vllm-hf").executes_on == VLLM_HF.executes_on
    scenario = Scenario(level=ScenarioLevel.S3, device="cuda")
    assert catalog.executing(scenario) == ["vllm-hf"]


@pytest.mark.parametrize("level", list(ScenarioLevel))
def test_no_runtime_declares_s2_or_s3_on_cpu(level: ScenarioLevel) -> None:
    scenario = Scenario(level=level, device="cpu")
    expected = {"S0": {"cpu-smoke", "hf", "vllm-hf"}, "S1": {"vllm-hf"}}.get(level.value, set())
    assert set(runtime_catalog().executing(scenario)) & {"hf", "vllm-hf"} == expected - {
        "cpu-smoke"
    }


def test_the_plugin_refuses_the_same_machine_before_any_engine(pytester: pytest.Pytester) -> None:
    """A real pytest session (in this process: vLLM is imported here already) of the S2
    experiment on vllm-hf: every case is an error item naming the machine, nothing is sealed."""
    config = pytester.path / S2.name
    config.write_text(S2.read_text())
    artifacts = pytester.path / "runs"
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "-q", "-rA", "--drift-config", config,
        "--drift-runtime", "vllm-hf", "--drift-artifacts", artifacts,
    )  # fmt: skip
    out = "\n".join(result.outlines)
    assert result.ret == 1, out[-3000:]
    errors = [line for line in result.outlines if line.startswith("ERROR ")]
    assert len(errors) == 6, out[-3000:]
    assert "this machine cannot run scenario S2 on cuda: " in out
    assert "no CUDA device" in out and "Traceback" not in out
    assert not list(artifacts.glob("*/cases/*/*/comparison.json"))


def test_ray_gives_a_context_parallel_engine_one_gpu_per_worker(tmp_path: Path) -> None:
    from pytest_logprob_drift.execute.launch import Launch
    from pytest_logprob_drift.execute.protocol import bind_case
    from pytest_logprob_drift.runtimes.vllm.adapter import IN_PROCESS_ENGINE, VllmHfAdapter

    model = _checkpoint(tmp_path, MLA_CONFIG)
    plan = plan_file(str(_with(tmp_path, S3, identity__checkpoint__uri=str(model))))
    baseline = bind_case(
        plan.cases[0], runtime_kind="vllm-hf", identity=plan.plan.identity, device="cuda"
    )
    adapter = VllmHfAdapter()
    adapter.launch = Launch(launcher="ray")  # the policy only: no cluster is started here
    assert adapter.rollout_resources(baseline) == {IN_PROCESS_ENGINE: 1.0, "GPU": 16.0}
