"""The ``plan`` command, run as users run it: a real subprocess, exit codes, stdout/stderr."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from drift_testing import EXPERIMENTS as EXPERIMENTS_DIR
from drift_testing import REPO, S0, S3

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.cli import main

EXPERIMENTS = sorted(EXPERIMENTS_DIR.glob("*.json"))


def run_cli(*args: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_logprob_drift", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        check=False,
    )


def run_main(*args: str | Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main([str(a) for a in args], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def s3_doc() -> dict[str, Any]:
    return json.loads(S3.read_text(encoding="utf-8"))


def write_config(tmp_path: Path, doc: Any, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- the S3 example


def test_s3_example_prints_baseline_and_one_case_per_intervention_value() -> None:
    result = run_cli("plan", S3)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].startswith(
        "experiment qwen3-8b-alignment  scenario qwen3-8b-tp4-cp4-bf16 (S3, cuda)  contract ws1/"
    )
    assert "threshold 0.001 nats" in lines[0]
    header = lines[1].split()
    assert header[:3] == ["case_id", "label", "changed"]
    assert set(lines[2]) <= {"-", " "}
    end = lines.index("3 case(s)")
    rows = [line.split() for line in lines[3:end]]
    # vllm-hf executes S3 on cuda, but not this context parallelism: one note says why.
    (note,) = lines[end + 1 :]
    assert note.startswith(
        "note: not executable by vllm-hf (baseline, batch.size=1, "
        "logp.backend=rlkernel.reference_logp): runtime 'vllm-hf' cannot run "
        "rollout.context_parallel_size=4: it becomes vLLM's prefill_context_parallel_size"
    ), note
    assert "only for MLA models" in note
    assert "/models/Qwen3-8B/config.json does not exist (yet)" in note
    assert "decode_context_parallel_size is a different setting" in note
    expected = plan_file(str(S3))
    assert [r[0] for r in rows] == [ec.case.case_id for ec in expected.cases]
    assert [r[1] for r in rows] == [
        "baseline",
        "batch.size=1",
        "logp.backend=rlkernel.reference_logp",
    ]
    assert rows[0][2:4] == ["-", "-"]
    assert rows[1][2:4] == ["batch.size", "request"]
    assert rows[2][2:4] == ["logp.backend", "engine_construction"]
    assert [r[4] for r in rows] == ["native", "native", "rlkernel.reference_logp"]
    assert all(r[-1] == "plan-only" for r in rows)  # no runtime runs its CP=4 on Qwen3-8B


def test_s3_json_has_the_same_case_ids() -> None:
    table = run_cli("plan", S3)
    result = run_cli("plan", S3, "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    ids = [c["case_id"] for c in document["cases"]]
    lines = table.stdout.splitlines()
    assert ids == [line.split()[0] for line in lines[3 : lines.index("3 case(s)")]]
    assert ids == [ec.case.case_id for ec in plan_file(str(S3)).cases]
    assert [c["label"] for c in document["cases"]] == [
        "baseline",
        "batch.size=1",
        "logp.backend=rlkernel.reference_logp",
    ]
    assert document["experiment_id"] == "qwen3-8b-alignment"
    assert document["scenario"] == {"level": "S3", "device": "cuda"}
    assert document["contract"]["version"] != "current"
    assert document["contract"]["threshold"] == 0.001
    assert document["strategy"] == "one_at_a_time"
    assert document["issues"] == []
    case = document["cases"][2]
    assert case["changed"] == ["logp.backend"]
    assert case["requested"]["rollout.tensor_parallel_size"] == 4
    assert [(b["target"], b["backend"]) for b in case["operators"]] == [
        ("rollout", "rlkernel.reference_logp"),
        ("training", "rlkernel.reference_logp"),
    ]
    assert case["executable_by"] == []
    (refusal,) = document["runtime_refusals"]
    assert refusal["runtime"] == "vllm-hf"
    assert refusal["case_ids"] == ids
    assert "prefill_context_parallel_size" in refusal["reason"]


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_every_shipped_experiment_plans(path: Path) -> None:
    code, out, err = run_main("plan", path, "--json")
    assert code == 0, out + err
    document = json.loads(out)
    assert document["cases"][0]["label"] == "baseline"
    assert not [i for i in document["issues"] if i["severity"] == "error"]


def test_s0_is_executable_by_the_cpu_runtimes() -> None:
    code, out, _ = run_main("plan", S0)
    assert code == 0
    assert "executable: cpu-smoke" in out
    assert "warning TEST_ONLY_OPERATOR at $.baseline.logp.backend" in out
    assert (
        "test-only backend: executing it needs authorization; pass --allow-smoke-operators" in out
    )


def test_plan_from_another_working_directory(tmp_path: Path) -> None:
    result = run_cli("plan", S3, "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "runs").exists()  # planning writes nothing


def test_console_script_is_the_same_program() -> None:
    script = Path(sys.executable).with_name("logprob-drift")
    assert script.exists(), "the logprob-drift console script is not installed next to python"
    result = subprocess.run(
        [str(script), "plan", str(S3), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert [c["case_id"] for c in json.loads(result.stdout)["cases"]] == [
        ec.case.case_id for ec in plan_file(str(S3)).cases
    ]


def test_pairwise_flag(tmp_path: Path) -> None:
    doc = s3_doc()
    doc["pairs"] = [["batch.size", "logp.backend"]]
    config = write_config(tmp_path, doc)
    code, out, _ = run_main("plan", config)
    assert code == 0
    assert "warning PAIRS_IGNORED at $.pairs" in out
    assert "pairwise planning was not asked for; no pairwise cases planned; pass --pairwise" in out
    assert "3 case(s)" in out.splitlines()
    code, out, _ = run_main("plan", config, "--pairwise")
    assert code == 0
    assert "batch.size=1,logp.backend=rlkernel.reference_logp" in out
    assert "4 case(s)" in out.splitlines()


# ----------------------------------------------------------------------------- bad configs


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d.update(foo=1), "$.foo"),
        (lambda d: d.update(strict_fallback="yes"), "$.strict_fallback"),
        (lambda d: d.update(mode="run"), "$.mode"),
        (lambda d: d["baseline"]["rollout"].update(threshold=0.5), "$.baseline.rollout.threshold"),
        (lambda d: d.pop("baseline"), "$.baseline"),
        (lambda d: d["identity"]["checkpoint"].pop("uri"), "$.identity.checkpoint.uri"),
        (lambda d: d.update(contract_version="nope"), "$.contract_version"),
    ],
)
def test_bad_config_exits_2_with_one_line_naming_the_path(
    tmp_path: Path, mutate: Any, path: str
) -> None:
    doc = s3_doc()
    mutate(doc)
    config = write_config(tmp_path, doc)
    code, out, err = run_main("plan", config)
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"logprob-drift: error: {config}: {path}: ")


def test_bad_config_subprocess_has_no_traceback(tmp_path: Path) -> None:
    doc = s3_doc()
    doc["scenario"]["expected"] = "PASS"
    config = write_config(tmp_path, doc)
    result = run_cli("plan", config, "--json")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f"logprob-drift: error: {config}: $.scenario.expected: not allowed in a config: "
        "expected outcomes belong to the CLI or the plugin's options (SELECTOR=OUTCOME)"
    ]


def test_several_faults_are_one_line(tmp_path: Path) -> None:
    doc = s3_doc()
    doc.update(mode="run", strict_fallback="yes", plan_only=True)
    code, out, err = run_main("plan", write_config(tmp_path, doc))
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1
    for path in ("$.mode", "$.strict_fallback", "$.plan_only"):
        assert f": {path}: " in err


def test_invalid_json_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "broken.json"
    config.write_text('{\n  "schema_version": \n}', encoding="utf-8")
    code, _, err = run_main("plan", config)
    assert code == 2
    assert err.strip() == (
        f"logprob-drift: error: {config}: $: invalid JSON at line 3 column 1: Expecting value"
    )


def test_duplicate_key_exit_2_names_the_path(tmp_path: Path) -> None:
    config = tmp_path / "dup.json"
    config.write_text(
        S3.read_text(encoding="utf-8").replace('"size": 8', '"size": 8, "size": 1'),
        encoding="utf-8",
    )
    code, _, err = run_main("plan", config)
    assert code == 2
    assert f"{config}: $.baseline.batch.size: invalid JSON: duplicate key 'size'" in err


def test_missing_config_file_exit_2(tmp_path: Path) -> None:
    code, out, err = run_main("plan", tmp_path / "absent.json")
    assert (code, out) == (2, "")
    assert err == f"logprob-drift: error: {tmp_path / 'absent.json'}: $: config file not found\n"


@pytest.mark.parametrize(
    "args",
    [
        ["plan"],
        ["frobnicate"],
        ["plan", "x.json", "--mode", "run"],
        ["plan", "x.json", "--allow-smoke-operators"],
    ],
)
def test_argument_errors_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "error:" in err


def test_planner_errors_exit_2_and_name_the_path(tmp_path: Path) -> None:
    doc = s3_doc()
    doc["baseline"]["rollout"]["foo"] = 1
    doc["baseline"]["batch"]["size"] = "8"
    config = write_config(tmp_path, doc)
    result = run_cli("plan", config)
    assert result.returncode == 2
    assert "Traceback" not in result.stdout + result.stderr
    assert "error UNKNOWN_KNOB at $.baseline.rollout.foo" in result.stdout
    assert "error INVALID_VALUE at $.baseline.batch.size" in result.stdout
    assert "0 case(s)" in result.stdout
    code, out, _ = run_main("plan", config, "--json")
    assert code == 2
    issues = json.loads(out)["issues"]
    assert {(i["code"], i["path"]) for i in issues} == {
        ("UNKNOWN_KNOB", "$.baseline.rollout.foo"),
        ("INVALID_VALUE", "$.baseline.batch.size"),
    }


def test_binding_errors_exit_2(tmp_path: Path) -> None:
    doc = s3_doc()
    doc["interventions"][1]["values"] = ["rlkernel.unknown_kernel"]
    code, out, _ = run_main("plan", write_config(tmp_path, doc))
    assert code == 2
    assert "error UNKNOWN_BACKEND at $.interventions[1].path" in out


def test_pairwise_without_pairs_exit_2() -> None:
    code, out, _ = run_main("plan", S3, "--pairwise")
    assert code == 2
    assert "error PAIRWISE_WITHOUT_PAIRS at $.pairs" in out


@pytest.mark.parametrize("args", [[], ["plan", "x.json", "--threshold", "1"]])
def test_usage_errors_exit_2_without_traceback(args: list[str]) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("logprob-drift")
    assert "error:" in result.stderr


# ----------------------------------------------------------------------------- no heavy imports

HEAVY = ("torch", "transformers", "vllm", "safetensors", "tokenizers", "numpy")


PLANNING_EVERY_EXPERIMENT = textwrap.dedent(f"""
        import contextlib, io, sys
        import pytest_logprob_drift
        from pytest_logprob_drift.cli import main
        heavy = {HEAVY!r}
        assert not [m for m in heavy if m in sys.modules], "imported by the package"
        assert main(["plan", {str(S3)!r}]) == 0
        for config in {[str(p) for p in EXPERIMENTS]!r}:
            for extra in ([], ["--json"]):
                with contextlib.redirect_stdout(io.StringIO()):
                    assert main(["plan", config, *extra]) == 0, config
        pytest_logprob_drift.default_catalog()
        loaded = [m for m in sys.modules if m.split(".")[0] in heavy]
        assert not loaded, loaded
        print("NO-HEAVY-IMPORTS")
    """)


@pytest.mark.process  # sys.modules of a fresh interpreter
def test_planning_never_imports_torch_transformers_or_vllm() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PLANNING_EVERY_EXPERIMENT],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 case(s)" in result.stdout
    assert result.stdout.strip().endswith("NO-HEAVY-IMPORTS")


def test_one_parser_serves_every_call_and_no_parse_leaks_into_the_next() -> None:
    """``main`` builds its parser once per process; a parse never changes what the next one
    reads (``--expect`` appended once, then absent; an argument error in between)."""
    from pytest_logprob_drift.cli import _parser

    parser = _parser()
    assert _parser() is parser
    run = ["run", str(S0), "--runtime", "cpu-smoke"]
    first = parser.parse_args([*run, "--expect", "a=PASS", "--expect", "b=PASS"])
    assert first.expect == ["a=PASS", "b=PASS"]
    with pytest.raises(SystemExit):
        parser.parse_args([*run, "--baseline-repeats", "x"])
    again = parser.parse_args(run)
    assert again.expect == [] and again.baseline_repeats == 1
    assert main(["plan", str(S0)], out=io.StringIO()) == 0
