"""The two frontends assemble a run one way (issue 20) and refuse what would run it wrong
(issue 21, classes 3, 6 and 7).

Both frontends build one ``RunSettings`` record and name each refused setting with their own
flag (or, in the plugin, the ini key it came from); the plugin's options and ini keys come from
one table; an installed plugin imports no engine in a session that executes nothing; an empty
seal-key option, and a key file that is not a regular file, are refused; the baseline repeats
are bounded; names and fields read from a run directory reach the terminal escaped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cli_processes import ForkServer
from drift_testing import EXPERIMENTS, S0, cli, copy_of_s0, run_s0

from pytest_logprob_drift.errors import ExitCode, UsageError
from pytest_logprob_drift.execute.settings import (
    MAX_BASELINE_REPEATS,
    Setting,
    run_settings,
)
from pytest_logprob_drift.plugin.options import OPTIONS
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.keys import load_seal_key

KEY = "k" * 32
CONFIG = S0.name
RUN = ("--drift-config", CONFIG, "--drift-runtime", "cpu-smoke", "--drift-allow-smoke-operators")
HEAVY = ("torch", "transformers", "vllm", "ray")

pytest_plugins = ["pytester"]


@pytest.fixture
def s0(pytester: pytest.Pytester) -> pytest.Pytester:
    shutil.copy(S0, pytester.path / CONFIG)
    return pytester


def one_error_line(text: str) -> bool:
    return len([line for line in text.splitlines() if "error" in line.lower()]) == 1


# ------------------------------------------------------------ no engine unless a case ran


def heavy_modules_at_exit(cwd: Path, *args: str) -> tuple[int, list[str], str]:
    """A pytest process in ``cwd`` with ``args``: its exit status and the engine modules
    loaded when it exits (checked in an ``atexit`` handler, after every hook ran)."""
    script = (
        "import atexit, sys\n"
        "def report():\n"
        f"    heavy = sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r})\n"
        "    sys.__stdout__.write(f'HEAVY {heavy}\\n')\n"
        "atexit.register(report)\n"
        "import pytest\n"
        f"rc = pytest.main({list(args)!r})\n"
        "sys.__stdout__.write(f'RC {int(rc)}\\n')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = proc.stdout.splitlines()
    rc = next(int(line.split()[1]) for line in lines if line.startswith("RC "))
    heavy = next(line for line in lines if line.startswith("HEAVY "))
    return rc, json.loads(heavy.split(" ", 1)[1].replace("'", '"')), proc.stdout + proc.stderr


@pytest.mark.process  # sys.modules of a fresh interpreter at exit
def test_a_session_without_a_drift_config_imports_no_engine(tmp_path: Path) -> None:
    """A pytest session of one trivial test, in a fresh interpreter."""
    (tmp_path / "test_trivial.py").write_text("def test_one():\n    assert True\n")
    rc, heavy, output = heavy_modules_at_exit(
        tmp_path, "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)
    )
    assert rc == 0 and "1 passed" in output, output
    assert heavy == [], output


@pytest.mark.process  # sys.modules of a fresh interpreter at exit
def test_collecting_every_shipped_config_imports_no_engine(tmp_path: Path) -> None:
    """``--collect-only`` with every shipped experiment as a drift config, in a fresh
    interpreter."""
    configs = [
        arg for path in sorted(EXPERIMENTS.glob("*.json")) for arg in ("--drift-config", str(path))
    ]
    rc, heavy, output = heavy_modules_at_exit(
        tmp_path,
        "-q",
        "--collect-only",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(tmp_path),
        *configs,
    )
    assert rc == 0 and "tests collected" in output, output
    assert heavy == [], output


# ------------------------------------------------------------------ one table of options


def test_every_option_has_a_flag_and_an_ini_key(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    text = result.stdout.str()
    for option in OPTIONS:
        assert option.flag in text and option.ini in text, option.name
    assert len({o.name for o in OPTIONS}) == len(OPTIONS) == 15


def test_an_ini_value_is_named_by_its_ini_key_and_a_flag_overrides_it(
    s0: pytest.Pytester,
) -> None:
    s0.makeini("[pytest]\ndrift_launcher = slurm\n")
    result = s0.runpytest(*RUN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*drift_launcher 'slurm': expected 'local' or 'ray'*"])
    assert "--drift-launcher" not in result.stderr.str()
    result = s0.runpytest(*RUN, "--drift-launcher", "local", "--drift-plan-only")
    assert result.ret == pytest.ExitCode.OK


def test_a_ray_address_without_the_ray_launcher_names_each_frontends_flags(
    s0: pytest.Pytester,
) -> None:
    result = s0.runpytest(*RUN, "--drift-ray-address", "h:1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--drift-ray-address needs --drift-launcher ray*"])
    code, _, err = run_s0(s0.path / "runs", "--ray-address", "h:1")
    assert code == ExitCode.USAGE_ERROR and "need --launcher ray" in err


# ------------------------------------------------------- issue 21 class 3: keyed or refused


@pytest.mark.parametrize("flag", ["--seal-key-file", "--seal-key-env"])
def test_an_empty_seal_key_option_is_a_usage_error_in_the_cli(tmp_path: Path, flag: str) -> None:
    code, out, err = run_s0(tmp_path / "runs", flag, "")
    assert code == ExitCode.USAGE_ERROR, out + err
    assert err.count("\n") == 1 and f"{flag} is empty" in err
    assert not (tmp_path / "runs").exists()
    (tmp_path / "runs").mkdir()
    code, _, err = cli("verify", tmp_path / "runs", flag, "")
    assert code == ExitCode.USAGE_ERROR and err.count("\n") == 1 and f"{flag} is empty" in err


@pytest.mark.parametrize(
    ("args", "ini", "named"),
    [
        (("--drift-seal-key-file", ""), "", "--drift-seal-key-file"),
        (("--drift-seal-key-env", ""), "", "--drift-seal-key-env"),
        ((), "drift_seal_key_file =\n", "drift_seal_key_file"),
        ((), "drift_seal_key_env =\n", "drift_seal_key_env"),
    ],
)
def test_an_empty_seal_key_option_is_a_usage_error_in_the_plugin(
    s0: pytest.Pytester, args: tuple[str, ...], ini: str, named: str
) -> None:
    if ini:
        s0.makeini(f"[pytest]\n{ini}")
    result = s0.runpytest(*RUN, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{named} is empty*"])
    assert not (s0.path / "runs").exists()


def test_a_key_file_that_is_not_a_regular_file_is_refused_without_blocking(
    tmp_path: Path, s0: pytest.Pytester
) -> None:
    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            load_seal_key(file=str(fifo), flags=("--f", "--e"))
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(timeout=20)
    if worker.is_alive():  # unblock the read the fix never starts, then fail
        with open(fifo, "wb"):
            pass
        worker.join(timeout=20)
        pytest.fail("loading a FIFO key file blocked")
    (error,) = outcome
    assert isinstance(error, UsageError) and "not a regular file" in str(error)
    with pytest.raises(UsageError, match=r"--f .*: not a regular file"):
        load_seal_key(file=str(tmp_path), flags=("--f", "--e"))

    # the command in this process (loading the key above did not block, so neither does it)
    code, _, err = cli("verify", tmp_path, "--seal-key-file", fifo)
    assert code == ExitCode.USAGE_ERROR and err.count("\n") == 1
    assert "--seal-key-file" in err and "not a regular file" in err
    result = s0.runpytest_subprocess(*RUN, "--drift-seal-key-file", str(fifo), timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--drift-seal-key-file*: not a regular file*"])


# ------------------------------------------------- issue 21 class 7: bounded baseline repeats


def test_baseline_repeats_are_bounded_in_the_settings() -> None:
    spelling = {setting: setting.value for setting in Setting}
    common = {"runtime": None, "runtimes": (), "artifacts": Path("runs")}
    assert (
        run_settings(spelling, baseline_repeats=MAX_BASELINE_REPEATS, **common).baseline_repeats
        == 100
    )
    for bad in (0, MAX_BASELINE_REPEATS + 1, 1_000_000_000, "x", -3):
        with pytest.raises(UsageError, match=f"baseline_repeats .*at most {MAX_BASELINE_REPEATS}"):
            run_settings(spelling, baseline_repeats=bad, **common)


@pytest.mark.process  # a CPU-time bound: unbounded, the command seals until the disk is full
def test_a_huge_baseline_repeats_is_refused_before_anything_is_sealed(
    tmp_path: Path, s0: pytest.Pytester, cli_process: ForkServer
) -> None:
    # in processes with a time bound (the command: a child of the session's fork server):
    # unbounded, each of these seals until the disk is full
    proc = cli_process(
        "run",
        S0,
        "--runtime",
        "cpu-smoke",
        "--allow-smoke-operators",
        "--artifacts",
        tmp_path / "runs",
        "--baseline-repeats",
        "1000000000",
        seconds=120,
    )
    assert proc.returncode == ExitCode.USAGE_ERROR and proc.stderr.count("\n") == 1
    assert (
        "--baseline-repeats '1000000000': expected a positive integer, at most 100" in proc.stderr
    )
    assert not (tmp_path / "runs").exists()
    result = s0.runpytest_subprocess(*RUN, "--drift-baseline-repeats", "101", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--drift-baseline-repeats '101': *at most 100*"])
    s0.makeini("[pytest]\ndrift_baseline_repeats = 1000000000\n")
    result = s0.runpytest_subprocess(*RUN, timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*drift_baseline_repeats '1000000000': *at most 100*"])
    assert not (s0.path / "runs").exists()


# ------------------------------------------------------ issue 21 class 6: terminal escapes

TITLE = "\x1b]0;title\x07"
CLEAR = "\x1b[2J"


@pytest.mark.slow
def test_names_and_fields_from_a_run_directory_reach_the_terminal_escaped(
    tmp_path: Path, sealed_s0: Path
) -> None:
    artifacts = copy_of_s0(sealed_s0, tmp_path)
    run_dir = artifacts / "s0-cpu-smoke"
    attempts = sorted((run_dir / layout.CASES).glob("*/*"))
    forged = attempts[0].parent / f"{TITLE}{CLEAR}"
    shutil.copytree(attempts[0], forged)
    comparison = forged / layout.COMPARISON
    comparison.write_text(comparison.read_text() + " ")  # the seal no longer matches
    (attribution,) = sorted((run_dir / layout.ATTRIBUTIONS).iterdir())
    shutil.copytree(attribution, attribution.parent / f"{CLEAR}{TITLE}")

    outputs = []
    code, out, err = cli(
        "run",
        S0,
        "--runtime",
        "cpu-smoke",
        "--allow-smoke-operators",
        "--expect",
        "logp.backend=smoke_only.logp_offset=MISMATCH",
        "--artifacts",
        artifacts,
    )
    assert code == 0, out + err  # resume: every case reused, the forged attempt skipped
    assert "skipped attempt \\x1b]0;title\\x07\\x1b[2J: " in out
    outputs += [out, err]
    code, out, err = cli("verify", run_dir)
    assert code == 1 and "attribution \\x1b[2J\\x1b]0;title\\x07: " in out
    outputs += [out, err]
    code, out, err = cli("report", run_dir, "--html", tmp_path / "page.html")
    assert code == 0 and "invalid attempt (not shown): " in out
    assert "/\\x1b]0;title\\x07\\x1b[2J: " in out
    outputs += [out, err]
    for text in outputs:
        assert "\x1b" not in text and "\x07" not in text
