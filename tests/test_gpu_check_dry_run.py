"""``scripts/gpu_check.py``, the GPU kit, kept from rotting by its CPU dry run.

``--device cpu --quick`` runs the same code path as the GPU run on tiny shapes: every section
is present with its keys (``SECTION_KEYS``, one table for both devices), each
``selected_logprob`` backend has its row, the experiment ran through the CLI with three
baseline repeats; a section the deadline does not reach is ``not_run``, never dropped; a
machine without CUDA records every section ``not_run`` with the reason. The kit never imports
vLLM. Its ulp measure is checked against numpy's float32 spacing.

The kit runs as the script it is (``python scripts/gpu_check.py``, a process) in the dry run
and in the deadline test, which runs on every machine; the no-CUDA test calls its ``main`` in
this process (an interpreter start saved), with the same check of stdout against the file.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from drift_testing import REPO

KIT = REPO / "scripts" / "gpu_check.py"
EXPERIMENT = REPO / "experiments" / "cross_config_s0_hf_cuda_bf16.json"


def _kit() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", KIT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    out = tmp_path / "summary.json"
    done = subprocess.run(
        [sys.executable, str(KIT), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        check=False,
    )
    summary = json.loads(out.read_text())
    assert json.loads(done.stdout) == summary  # printed and written: the same document
    return done.returncode, summary, done.stderr


def _run_in_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, dict[str, Any]]:
    """``_run`` through the kit's ``main`` in this process."""
    out = tmp_path / "summary.json"
    capsys.readouterr()
    code = _kit().main(["--out", str(out), *args])
    summary = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == summary  # printed and written: the same
    return code, summary


def _assert_every_section_recorded(summary: dict[str, Any], kit: ModuleType) -> None:
    assert set(summary["sections"]) == set(kit.SECTIONS)  # none dropped
    for name, section in summary["sections"].items():
        assert section["status"] in ("ok", "failed", "not_run"), name
        if section["status"] == "ok":
            missing = set(kit.SECTION_KEYS[name]) - set(section)
            assert not missing, f"{name} lacks {sorted(missing)}"
        elif section["status"] == "not_run":
            assert section["reason"]
        else:
            assert section["error"]


@pytest.mark.slow
def test_the_cpu_dry_run_fills_every_section(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    kit = _kit()
    code, summary, err = _run(tmp_path, "--device", "cpu", "--quick", "--deadline-s", "400")
    _assert_every_section_recorded(summary, kit)
    sections = summary["sections"]
    assert {name: s["status"] for name, s in sections.items()} == {
        **dict.fromkeys(kit.SECTIONS, "ok"),
        "vllm": "not_run",  # vLLM's CUDA build only: recorded with the reason, no failure
    }, err
    assert sections["vllm"]["reason"].startswith("the vLLM section runs on cuda only")
    assert sections["vllm"]["not_applicable"] is True
    assert code == 0 and summary["ok"] is True
    assert sections["environment"]["device"] == "cpu"
    assert sections["environment"]["vllm_imported"] is False
    for name in kit.PROJECT_DEPENDENCIES:  # what the CLI needs beyond a CUDA image's packages
        assert sections["environment"]["versions"][name] == importlib.metadata.version(name)
    slp = sections["selected_logprob"]
    assert (slp["tokens"], slp["vocab"]) == kit.QUICK_SHAPE
    assert set(slp["backends"]) == {"native", "naive_float32", "reference", "chunked"}
    for name, row in slp["backends"].items():
        assert set(row) == set(kit.BACKEND_KEYS), name
        assert row["seconds"] > 0 and row["x_logsumexp"] > 0 and row["x_floor"] > 0
    # float32 backends are within a few float32 ulps of float64; log-softmax in bf16 is not
    for name in ("naive_float32", "reference", "chunked"):
        assert slp["backends"][name]["max_error_ulps"] < 8, name
    assert slp["backends"]["native"]["max_error_ulps"] > 8
    assert sections["full_vocabulary"]["max_kl_error"] < 1e-4
    run = sections["experiment"]
    assert run["baseline_repeats"] == 3 and run["device"] == "cpu"
    labels = [v["label"] for v in run["verdicts"]]
    shipped = json.loads(EXPERIMENT.read_text())
    for intervention in shipped["interventions"]:
        for value in intervention["values"]:
            assert f"{intervention['path']}={value}" in labels
    assert "baseline" in labels
    assert run["attribution"] is not None
    assert run["noise_floor"]["measured"] is True and run["noise_floor"]["repeats"] == 2
    assert set(run["moved"]) == set(labels) - {"baseline"}
    head = summary["headline"]
    assert head["noise_floor"] == run["noise_floor"] and head["moved"] == run["moved"]
    assert set(head["selected_logprob"]) == set(slp["backends"])
    assert set(head["full_vocabulary"]) == {"x_logsumexp", "x_floor"}
    assert all(v["outcome"] in ("PASS", "MISMATCH") for v in run["verdicts"])


def test_a_deadline_too_short_records_every_section_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # in this process: the kit as a process is test_the_cpu_dry_run_fills_every_section's
    pytest.importorskip("torch")
    kit = _kit()
    code, summary = _run_in_process(
        tmp_path, capsys, "--device", "cpu", "--quick", "--deadline-s", "0"
    )
    _assert_every_section_recorded(summary, kit)
    assert {s["status"] for s in summary["sections"].values()} == {"not_run"}
    assert all(s["reason"].startswith("deadline: ") for s in summary["sections"].values())
    assert summary["headline"] == {
        "noise_floor": None,
        "moved": None,
        "selected_logprob": None,
        "full_vocabulary": None,
    }
    assert code == 1 and summary["ok"] is False


def test_without_cuda_the_gpu_run_says_so_for_every_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    kit = _kit()
    code, summary = _run_in_process(tmp_path, capsys, "--device", "cuda")
    _assert_every_section_recorded(summary, kit)
    assert {s["status"] for s in summary["sections"].values()} == {"not_run"}
    assert all("no CUDA device" in s["reason"] for s in summary["sections"].values())
    assert code == 1


def test_the_experiment_names_a_missing_project_dependency(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lent GPU image had no msgspec: the section says which package, not a CLI traceback."""
    kit = _kit()
    monkeypatch.setattr(kit, "PROJECT_DEPENDENCIES", ("msgspec", "no-such-dependency-here"))
    with pytest.raises(RuntimeError) as raised:
        kit.experiment("cpu", True, kit.Deadline(60.0), tmp_path)
    assert str(raised.value).startswith(
        "the project's own dependencies are not installed here: no-such-dependency-here;"
    )
    assert not (tmp_path / "artifacts").exists()  # refused before any run


def test_the_vllm_section_says_why_it_cannot_run_here() -> None:
    kit = _kit()
    assert kit.vllm_applicable("cpu") == (
        "the vLLM section runs on cuda only (vLLM's CUDA build); --device is cpu"
    )
    reason = kit.vllm_applicable("cuda")
    if importlib.util.find_spec("vllm") is None:
        assert reason == "vLLM's CUDA build is not installed: vllm is not installed"
    else:  # this machine: vLLM's CPU wheel
        assert reason is not None
        assert reason.startswith("vLLM's CUDA build is not installed: installed is vllm")


@pytest.mark.parametrize("gpus", [1, 2])
def test_the_vllm_section_plans_the_s2_cases_the_gpus_hold(tmp_path: Path, gpus: int) -> None:
    kit = _kit()
    config, skipped = kit._vllm_config(gpus, True, tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "pytest_logprob_drift", "plan", str(config), "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    planned = json.loads(done.stdout)
    labels = [c["label"] for c in planned["cases"]]
    assert all(c["executable_by"] == ["vllm-hf"] for c in planned["cases"])
    assert all(c["requested"]["training.attention_backend"] == "sdpa" for c in planned["cases"])
    shipped = json.loads(kit.VLLM_EXPERIMENT.read_text())
    every = {f"{i['path']}={str(v).lower()}" for i in shipped["interventions"] for v in i["values"]}
    if gpus == 1:  # TP 1, no FSDP: the baseline fits, and the values that need two GPUs do not
        base = planned["cases"][0]["requested"]
        assert (base["rollout.tensor_parallel_size"], base["training.sharding"]) == (1, "none")
        # S2's own TP 2 and FSDP need two GPUs: skipped, with their need
        assert skipped == {
            "rollout.tensor_parallel_size=2": "needs 2 GPUs; 1 visible",
            "training.sharding=fsdp": "needs 2 GPUs; 1 visible",
        }
        assert set(labels) == {"baseline"} | (
            every - {"rollout.tensor_parallel_size=1", "training.sharding=none"}
        )
    else:
        base = planned["cases"][0]["requested"]
        assert (base["rollout.tensor_parallel_size"], base["training.sharding"]) == (2, "fsdp")
        assert skipped == {}
        assert set(labels) == {"baseline"} | every


def test_ulps_are_float32_spacings_at_the_reference() -> None:
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    kit = _kit()
    reference = torch.tensor([-0.5, -3.0, -11.25, -1e-3], dtype=torch.float64)
    spacing = np.spacing(np.abs(reference.numpy().astype(np.float32))).astype(np.float64)
    for k in (0.0, 1.0, 2.5, 40.0):
        values = (reference + torch.tensor(spacing) * k).float()
        expected = float(np.max(np.abs(values.double().numpy() - reference.numpy()) / spacing))
        assert kit.max_ulps(values, reference) == pytest.approx(expected, rel=1e-9, abs=1e-9)
