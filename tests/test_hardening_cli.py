"""File-system faults and silent no-ops at the command line (issue 14, classes 3 and 7).

Every fault outside the per-case loop is one line on stderr with the documented exit code
(2: a location that cannot hold a run: not a directory, read-only, permission denied; 3: an
I/O failure such as a full disk), never a traceback. A run whose cases are all reusable
succeeds on a read-only store and changes nothing; ``verify`` works there too. An ``--expect``
selector that matches no case is a usage error. Read-only stores are real read-only bind
mounts (root) or directories without write permission (others); the full disk is a 64 KiB
tmpfs (root only; skipped otherwise, with the reason).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_processes import ForkServer
from drift_testing import OFFSET_EXPECT, S0, cli, run_s0
from tmpfs import fill

from pytest_logprob_drift.errors import ExitCode

EXPECT = OFFSET_EXPECT
EXPERIMENT = "s0-cpu-smoke"


def one_error_line(err: str) -> str:
    """The one ``error:`` line of stderr (notes may precede it); no traceback anywhere."""
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("logprob-drift: error: ")]
    assert len(errors) == 1, err
    return errors[0]


def snapshot(directory: Path) -> dict[str, tuple[str, int, int]]:
    return {
        str(p.relative_to(directory)): (
            hashlib.sha256(p.read_bytes()).hexdigest(),
            p.stat().st_mtime_ns,
            p.stat().st_ino,
        )
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    artifacts = tmp_path_factory.mktemp("sealed") / "runs"
    code, _, err = run_s0(artifacts)
    assert code == 0, err
    return artifacts


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[Path]:
    """``directory`` made read-only: a read-only bind mount of it as root (permissions do not
    stop root), else the same directory with every write permission removed."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [directory, *directory.rglob("*")]}
        for path, mode in modes.items():
            path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        try:
            yield directory
        finally:
            for path, mode in modes.items():
                path.chmod(mode)
        return
    target = directory.with_name(directory.name + "-ro")
    target.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(directory), str(target)], check=False)
    if mounted.returncode != 0:
        pytest.skip("cannot bind-mount here (no CAP_SYS_ADMIN)")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True)
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


# ----------------------------------------------------------------------------- class 3


def test_artifacts_naming_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    for artifacts in (tmp_path / "file", tmp_path / "file" / "below"):
        code, _, err = run_s0(artifacts)
        assert code == ExitCode.USAGE_ERROR
        assert str(tmp_path / "file") in one_error_line(err)
        assert "not a directory" in err.lower()


def test_a_fully_reusable_run_succeeds_on_a_read_only_store(sealed: Path, tmp_path: Path) -> None:
    shutil.copytree(sealed, tmp_path / "runs")
    before = snapshot(tmp_path / "runs")
    with read_only(tmp_path / "runs") as artifacts:
        code, out, err = run_s0(artifacts)
        assert code == 0, err
        assert all(r["reused"] for r in json.loads(out)["results"])
        assert "Traceback" not in err
        code, out, err = cli("verify", artifacts / EXPERIMENT)
        assert code == 0 and "0 invalid" in out, out + err
    assert snapshot(tmp_path / "runs") == before


def test_a_new_run_on_a_read_only_store_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    with read_only(tmp_path / "runs") as artifacts:
        code, _, err = run_s0(artifacts)
    assert code == ExitCode.USAGE_ERROR
    line = one_error_line(err)
    assert EXPERIMENT in line and ("Read-only" in line or "Permission denied" in line)


@pytest.mark.slow
def test_report_on_a_read_only_run_is_one_line(sealed: Path, tmp_path: Path) -> None:
    shutil.copytree(sealed, tmp_path / "runs")
    with read_only(tmp_path / "runs") as artifacts:
        code, out, err = cli("report", artifacts / EXPERIMENT)
    assert code == ExitCode.USAGE_ERROR, out + err
    line = one_error_line(err)
    assert "report" in line and ("Read-only" in line or "Permission denied" in line)


def test_verify_or_report_of_a_missing_run_is_one_line(tmp_path: Path) -> None:
    for command in ("verify", "report"):
        code, _, err = cli(command, tmp_path / "nothing")
        assert code == ExitCode.USAGE_ERROR
        assert "not a run directory" in one_error_line(err)


@pytest.mark.parametrize("leave", [0, 2048, 6144])
def test_a_full_disk_while_the_run_directory_is_set_up(tiny_tmpfs: Path, leave: int) -> None:
    fill(tiny_tmpfs, leave)
    code, _, err = run_s0(tiny_tmpfs / "runs")
    assert code == ExitCode.RUNTIME_FAILURE, err
    assert "No space left on device" in one_error_line(err)
    plan = tiny_tmpfs / "runs" / EXPERIMENT / "plan.jsonl"
    assert not plan.exists() or plan.read_bytes().endswith(b"\n") or not plan.read_bytes()
    leftovers = [p for p in tiny_tmpfs.rglob("*.tmp")]
    assert leftovers == []


@pytest.mark.process  # the real command, its streams flushed at a fresh interpreter's exit
def test_a_full_disk_in_a_subprocess_has_no_traceback(tiny_tmpfs: Path) -> None:
    """The real command (``python -m pytest_logprob_drift``, a fresh interpreter) running S0
    onto a full 64 KiB tmpfs: one line, exit 3."""
    fill(tiny_tmpfs)
    command = [sys.executable, "-m", "pytest_logprob_drift", "run", str(S0), "--runtime"]
    options = ["cpu-smoke", "--allow-smoke-operators", "--artifacts", str(tiny_tmpfs / "runs")]
    result = subprocess.run(
        [*command, *options], capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == ExitCode.RUNTIME_FAILURE
    assert "No space left on device" in one_error_line(result.stderr)


# ----------------------------------------------------------------------------- class 7


@pytest.mark.parametrize("selector", ["batch.size=2", "nope", "ffff", "baseline,x"])
def test_an_expectation_that_selects_no_case_is_a_usage_error(
    tmp_path: Path, selector: str
) -> None:
    code, _, err = run_s0(tmp_path / "runs", "--expect", f"{selector}=PASS")
    assert code == ExitCode.USAGE_ERROR
    line = one_error_line(err)
    assert f"--expect {selector}=PASS" in line and "matches no planned case" in line
    assert not (tmp_path / "runs").exists()  # refused before anything was written


def test_expectations_that_select_cases_are_accepted(sealed: Path, tmp_path: Path) -> None:
    shutil.copytree(sealed, tmp_path / "runs")
    code, _, err = run_s0(tmp_path / "runs", "--expect", "*=PASS", "--expect", EXPECT)
    assert code == 0, err


@pytest.mark.process  # RLIMIT_AS
def test_running_out_of_memory_is_one_line_and_exit_3(
    tmp_path: Path, cli_process: ForkServer
) -> None:
    """An exception no module turns into a typed error (here MemoryError: a 16 MB prompt file,
    within its cap, planned with 64 MiB of address space to spare) is one line and exit 3,
    never a traceback and exit 1. The command is a child forked from the session's server that
    imported the CLI (``cli_process``), its address space capped at 64 MiB above the server's."""
    config = json.loads(S0.read_text())
    config["identity"]["prompts"] = {"file": "prompts.json"}
    (tmp_path / "exp.json").write_text(json.dumps(config))
    rows = ",".join("[" + ",".join(["7"] * 1000) + "]" for _ in range(8000))
    (tmp_path / "prompts.json").write_text(f"[{rows}]")
    result = cli_process("plan", "exp.json", cwd=tmp_path, memory_bytes=64 << 20)
    assert result.returncode == ExitCode.RUNTIME_FAILURE, result.describe()
    assert result.stderr == "logprob-drift: error: out of memory\n"
    assert result.stdout == ""
