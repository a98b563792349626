"""The ``run``, ``verify`` and ``report`` commands: exit codes, messages, resume, tamper
detection per sealed file, and the HTML report.

Every command runs in this process (``drift_testing.cli``: its exit code and the streams
``main`` and argparse write): ``run`` exiting 0 (the shared run), 1 with ``--json`` leaving
stdout to the document, 2 with one error line; ``verify --json`` exiting 0 with stdout the
document only; a malformed ``--expect``, the HTML report, tamper detection and the run after
it. The real interpreter start of the CLI is ``tests/test_hardening_startup``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from drift_testing import ATTEMPT_FILES, OFFSET_LABEL, S0, cli_completed
from drift_testing import cli as in_process

from pytest_logprob_drift.check.resume import check_attempt
from pytest_logprob_drift.cli import main
from pytest_logprob_drift.store.layout import COMPLETE
from pytest_logprob_drift.store.run import iter_attempt_dirs
from pytest_logprob_drift.store.seal import SealError

EXPECT = "logp.backend=smoke_only.logp_offset=MISMATCH"
SEALED_FILES = tuple(sorted(ATTEMPT_FILES))


def run_args(artifacts: Path, *extra: str, config: Path = S0) -> list[str]:
    return ["run", str(config), "--runtime", "cpu-smoke", "--artifacts", str(artifacts), *extra]


def attempts(run_dir: Path) -> set[Path]:
    return set(iter_attempt_dirs(run_dir))


@pytest.fixture(scope="module")
def s0_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One S0 run through the CLI with the offset case expected to mismatch."""
    cwd = tmp_path_factory.mktemp("cli")
    artifacts = cwd / "runs"
    proc = cli_completed(
        *run_args(artifacts, "--allow-smoke-operators", "--expect", EXPECT), cwd=cwd
    )
    return {"cwd": cwd, "artifacts": artifacts, "run_dir": artifacts / "s0-cpu-smoke", "proc": proc}


def test_run_with_expectation_exits_0(s0_run: dict[str, Any]) -> None:
    proc = s0_run["proc"]
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Traceback" not in proc.stderr
    for label, outcome in (
        ("baseline", "PASS"),
        ("batch.size=1", "PASS"),
        (OFFSET_LABEL, "MISMATCH"),
    ):
        line = next(x for x in out.splitlines() if x.startswith("[") and f" {label} -> " in x)
        assert f"-> {outcome} (new)" in line
    table = out[out.index("case_id") :]
    assert "expected" not in table  # no case deviated from its expectation
    assert "engine constructions: rollout 2, training 2" in out
    assert len(attempts(s0_run["run_dir"])) == 3


def test_second_run_without_expectation_reuses_everything_and_exits_1(
    s0_run: dict[str, Any],
) -> None:
    before = attempts(s0_run["run_dir"])
    proc = cli_completed(
        *run_args(s0_run["artifacts"], "--allow-smoke-operators", "--json"), cwd=s0_run["cwd"]
    )
    assert proc.returncode == 1, proc.stderr
    document = json.loads(proc.stdout)  # with --json, stdout is the document only
    assert attempts(s0_run["run_dir"]) == before  # no new attempt directory
    results = {r["label"]: r for r in document["results"]}
    assert all(r["reused"] for r in results.values())
    assert {Path(r["attempt_dir"]) for r in results.values()} == before
    assert document["engine_constructions"] == {"rollout": 0, "training": 0}
    assert results[OFFSET_LABEL]["outcome"] == "MISMATCH"
    assert results[OFFSET_LABEL]["expected"] == "PASS"
    assert "(reused)" in proc.stderr  # live progress goes to stderr under --json


def test_refusals_exit_2_with_one_clear_line(tmp_path: Path) -> None:
    """Without --allow-smoke-operators, and with a malformed --expect: exit 2 and one line."""
    unauthorized = cli_completed(*run_args(tmp_path / "a"), cwd=tmp_path)
    bad_expect = cli_completed(
        *run_args(tmp_path / "b", "--allow-smoke-operators", "--expect", "no-outcome-here")
    )

    assert unauthorized.returncode == 2
    assert "Traceback" not in unauthorized.stderr + unauthorized.stdout
    errors = [line for line in unauthorized.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, unauthorized.stderr
    assert errors[0].startswith("logprob-drift: error: ")
    assert "smoke" in errors[0] and "--allow-smoke-operators" in errors[0]
    assert not (tmp_path / "a").exists()  # refused before anything was written

    assert bad_expect.returncode == 2
    assert "Traceback" not in bad_expect.stderr
    assert bad_expect.stderr.strip().splitlines() == [
        "logprob-drift: error: --expect 'no-outcome-here': expected SELECTOR=OUTCOME, e.g. "
        "'rollout.dtype=bfloat16=MISMATCH'"
    ]
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("text", ["baseline=MAYBE", "=PASS", "baseline="])
def test_bad_expect_values_exit_2_in_process(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(run_args(tmp_path / "runs", "--allow-smoke-operators", "--expect", text))
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("logprob-drift: error: --expect")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_verify_agrees_with_every_comparison_and_report_writes_html(
    s0_run: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = s0_run["run_dir"]
    target = s0_run["cwd"] / "report" / "s0.html"
    verify = cli_completed("verify", str(run_dir), "--json", cwd=s0_run["cwd"])
    report = cli_completed("report", str(run_dir), "--html", str(target))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    document = json.loads(verify.stdout)
    assert document["invalid"] == 0
    assert len(document["attempts"]) == 3
    for entry in document["attempts"]:
        attempt = run_dir / "cases" / entry["case_id"] / entry["attempt_id"]
        comparison = json.loads((attempt / "comparison.json").read_text())
        assert entry["status"] == "ok"
        assert entry["outcome"] == comparison["outcome"] == comparison["numerical"]["outcome"]
    assert main(["verify", str(run_dir)]) == 0
    assert "3 attempt(s), 1 attribution(s), 0 invalid" in capsys.readouterr().out

    assert report.returncode == 0, report.stderr
    assert f"HTML report: {target}" in report.stdout
    html = target.read_text()
    assert html.startswith("<!doctype html>")
    for word in ("baseline", "batch.size=1", OFFSET_LABEL, "MISMATCH", "PASS"):
        assert word in html
        assert word in report.stdout
    assert main(["report", str(run_dir), "--html", str(target)]) == 0
    assert "already exists; not overwritten" in capsys.readouterr().out
    assert target.read_text() == html


def test_verify_and_report_refuse_a_non_run_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in ("verify", "report"):
        assert main([command, str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert "not a run directory" in err and "Traceback" not in err


# --- tampering: one byte in each kind of sealed file ----------------------------------------


def _flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x01
    path.write_bytes(bytes(data))


def _flip_position(name: str, data: bytes) -> int:
    if name == COMPLETE:  # inside the execution key: the seal still parses, digests match
        return data.index(b'"execution_key": "') + len(b'"execution_key": "') + 10
    return len(data) // 2


def test_flipping_one_byte_in_each_sealed_file(tmp_path: Path) -> None:
    """Ten cases (baseline, eight batch sizes, the offset); one byte flipped in one sealed
    file of each of nine of them: ``verify`` names every file, a following run re-executes
    exactly those nine cases and leaves every tampered file as it was."""
    config = json.loads(S0.read_text())
    config["interventions"][0]["values"] = [1, 2, 3, 5, 6, 7, 8, 9]
    config_path = tmp_path / "ten_cases.json"
    config_path.write_text(json.dumps(config))
    artifacts = tmp_path / "runs"
    args = run_args(
        artifacts, "--allow-smoke-operators", "--expect", EXPECT, "--json", config=config_path
    )
    # the first run only prepares the directory: in process, to save an interpreter start
    with open(os.devnull, "w") as sink:
        assert main(args, out=sink, err=sink) == 0
    run_dir = artifacts / "s0-cpu-smoke"
    by_case = {a.parent.name: a for a in iter_attempt_dirs(run_dir)}
    assert len(by_case) == 10
    labels = {
        c: json.loads((a / "requested.json").read_text())["label"] for c, a in by_case.items()
    }
    cases = sorted(by_case, key=lambda c: labels[c])
    untouched_case = cases[-1]
    tampered: dict[str, tuple[str, Path, bytes]] = {}
    for case_id, name in zip(cases, SEALED_FILES, strict=False):
        path = by_case[case_id] / name
        _flip(path, _flip_position(name, path.read_bytes()))
        tampered[case_id] = (name, path, path.read_bytes())
    assert untouched_case not in tampered and len(tampered) == len(SEALED_FILES)

    # verify names each tampered file (check_attempt first, then the command)
    for case_id, (name, _, _) in tampered.items():
        with pytest.raises(SealError) as info:
            check_attempt(by_case[case_id], expected_key=None)
        assert info.value.file == name, (name, str(info.value))
    code, out, err = in_process("verify", str(run_dir), "--json")
    assert code == 1, out + err
    document = json.loads(out)
    report = {e["case_id"]: e for e in document["attempts"]}
    # ...and the run's sealed attribution, computed from attempts that were since tampered with
    assert [bool(a["problems"]) for a in document["attributions"]] == [True]
    assert document["invalid"] == len(SEALED_FILES) + 1
    for case_id, (name, _, _) in tampered.items():
        assert report[case_id]["status"] == "invalid"
        assert report[case_id]["file"] == name
    assert report[untouched_case]["status"] == "ok"

    # a following run ignores each tampered attempt, makes a new one, and touches nothing
    code, out, err = in_process(*args)
    assert code == 0, err
    results = {r["case_id"]: r for r in json.loads(out)["results"]}
    for case_id, (name, path, data) in tampered.items():
        result = results[case_id]
        assert not result["reused"]
        assert Path(result["attempt_dir"]) != by_case[case_id]
        check_attempt(Path(result["attempt_dir"]), expected_key=None)
        assert path.read_bytes() == data  # left untouched, byte for byte
        assert f"skipped attempt {by_case[case_id].name}: {name}:" in err
    assert results[untouched_case]["reused"]
    assert len(attempts(run_dir)) == 10 + len(SEALED_FILES)
