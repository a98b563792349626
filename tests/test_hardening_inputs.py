"""Special files as inputs (issue 21, class 5).

A config (``plan``/``run`` CONFIG, the plugin's ``--drift-config``) and an
``identity.prompts.file`` are read only as regular files within their size limit
(``CONFIG_FILE_LIMIT``, ``PROMPT_FILE_LIMIT``), checked before a byte is read: a FIFO, a
device such as ``/dev/zero``, a directory or a huge sparse file is one line and exit 2 (in the
plugin, a usage error or a collection error), never a hang or a whole-file read. Whatever
could hang or exhaust memory if it regressed runs as a process (``process`` tests) with a time
bound (and, where it could read without end, an address-space bound): a command is a child
forked from the session's server that imported the CLI once (the ``cli_process`` fixture,
``tests/cli_processes.py``; its timers end a hang), the plugin a ``pytest`` subprocess.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_processes import ForkServer
from drift_testing import S0

import pytest_logprob_drift
from pytest_logprob_drift import load_config
from pytest_logprob_drift.config.loader import CONFIG_FILE_LIMIT, PROMPT_FILE_LIMIT
from pytest_logprob_drift.errors import ConfigError, ExitCode

pytest_plugins = ["pytester"]

TIMEOUT = 10.0
"""CPU seconds a command may take on a special file before the test calls it a hang (planning
takes a fraction of one; a command blocked on a FIFO ends at the fork server's wall-time
backstop, ten times this)."""
MEMORY = 512 << 20
"""Address space (bytes) a ``plan`` process may add to the fork server's: planning needs far
less; an unbounded read of /dev/zero or of a 1 GiB sparse file does not fit."""


def document() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(S0.read_text())
    return loaded


def with_prompt_file(directory: Path, name: str) -> Path:
    doc = document()
    doc["identity"]["prompts"] = {"file": name}
    config = directory / "config.json"
    config.write_text(json.dumps(doc), encoding="utf-8")
    return config


PACKAGE_ROOT = str(Path(pytest_logprob_drift.__file__).resolve().parents[1])
"""Where the package under test lives: subprocesses import it from there, whatever their
working directory (a relative PYTHONPATH would resolve elsewhere in a pytester directory)."""


@pytest.fixture(autouse=True)
def _subprocesses_import_this_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", PACKAGE_ROOT)


Command = Callable[..., tuple[int | None, str]]


@pytest.fixture
def logprob_drift(cli_process: ForkServer) -> Command:
    """``logprob-drift ARGS`` as a forked child (``cli_process``) ending within ``TIMEOUT``
    (``memory_limit``: its address space grows by at most ``MEMORY``): exit code (None:
    killed) and stderr."""

    def run(*args: str | Path, memory_limit: bool = False) -> tuple[int | None, str]:
        finished = cli_process(
            *args, seconds=TIMEOUT, memory_bytes=MEMORY if memory_limit else None
        )
        return finished.code, finished.stderr

    return run


def one_error_line(err: str) -> str:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("logprob-drift: error: ")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo.json"
    os.mkfifo(path)
    return path


def sparse(path: Path, size: int) -> Path:
    with path.open("wb") as handle:
        handle.truncate(size)
    return path


# ----------------------------------------------------------------------------- plan and run


@pytest.mark.process  # a timer ends a hang
def test_plan_of_a_fifo_config_is_one_line_not_a_hang(logprob_drift: Command, fifo: Path) -> None:
    code, err = logprob_drift("plan", fifo)
    assert code == ExitCode.USAGE_ERROR
    assert one_error_line(err) == (
        f"logprob-drift: error: {fifo}: $: cannot read config file: not a regular file (a FIFO)"
    )


@pytest.mark.process  # a timer ends a hang
def test_run_of_a_fifo_config_is_one_line_not_a_hang(
    logprob_drift: Command, fifo: Path, tmp_path: Path
) -> None:
    code, err = logprob_drift(
        "run", fifo, "--runtime", "cpu-smoke", "--artifacts", tmp_path / "runs"
    )
    assert code == ExitCode.USAGE_ERROR
    assert "not a regular file (a FIFO)" in one_error_line(err)
    assert not (tmp_path / "runs").exists()


@pytest.mark.process  # RLIMIT_AS ends an unbounded read
def test_plan_of_dev_zero_is_refused_before_reading(
    logprob_drift: Command,
) -> None:
    code, err = logprob_drift("plan", "/dev/zero", memory_limit=True)
    assert code == ExitCode.USAGE_ERROR
    assert one_error_line(err).endswith(
        "/dev/zero: $: cannot read config file: not a regular file (a character device)"
    )


@pytest.mark.process  # RLIMIT_AS ends an unbounded read
def test_a_huge_sparse_config_is_refused_before_reading(
    logprob_drift: Command, tmp_path: Path
) -> None:
    config = sparse(tmp_path / "huge.json", 1 << 30)
    code, err = logprob_drift("plan", config, memory_limit=True)
    assert code == ExitCode.USAGE_ERROR
    assert f"{1 << 30} bytes, larger than the limit of 16 MiB" in one_error_line(err)


@pytest.mark.process  # a timer ends a hang, RLIMIT_AS an unbounded read
@pytest.mark.parametrize(
    ("target", "kind"), [("fifo", "a FIFO"), ("/dev/zero", "a character device")]
)
def test_a_prompt_file_that_is_a_special_file_is_one_line(
    logprob_drift: Command, tmp_path: Path, target: str, kind: str
) -> None:
    if target == "fifo":
        os.mkfifo(tmp_path / "prompts.json")
        target = "prompts.json"
    config = with_prompt_file(tmp_path, target)
    code, err = logprob_drift("plan", config, memory_limit=True)
    assert code == ExitCode.USAGE_ERROR
    line = one_error_line(err)
    assert f"{config}: $.identity.prompts.file: cannot read prompt file " in line
    assert line.endswith(f": not a regular file ({kind})")


@pytest.mark.process  # RLIMIT_AS ends an unbounded read
def test_a_1_gib_sparse_prompt_file_is_refused_before_reading(
    logprob_drift: Command, tmp_path: Path
) -> None:
    sparse(tmp_path / "prompts.json", 1 << 30)
    code, err = logprob_drift("plan", with_prompt_file(tmp_path, "prompts.json"), memory_limit=True)
    assert code == ExitCode.USAGE_ERROR
    assert f"{1 << 30} bytes, larger than the limit of 64 MiB" in one_error_line(err)


# ----------------------------------------------------------------------------- the limits


def test_a_config_at_its_limit_loads_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    text = json.dumps(document())
    config = tmp_path / "padded.json"
    config.write_text(text + " " * (CONFIG_FILE_LIMIT - len(text)), encoding="utf-8")
    assert load_config(config).experiment_id == document()["experiment_id"]
    with config.open("a") as handle:
        handle.write(" ")
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert (caught.value.path, caught.value.message) == (
        "$",
        f"cannot read config file: {CONFIG_FILE_LIMIT + 1} bytes, larger than the limit of 16 MiB",
    )


def test_a_prompt_file_one_byte_over_its_limit_is_refused(tmp_path: Path) -> None:
    sparse(tmp_path / "prompts.json", PROMPT_FILE_LIMIT + 1)
    with pytest.raises(ConfigError) as caught:
        load_config(with_prompt_file(tmp_path, "prompts.json"))
    assert caught.value.path == "$.identity.prompts.file"
    assert caught.value.message.endswith(
        f": {PROMPT_FILE_LIMIT + 1} bytes, larger than the limit of 64 MiB"
    )


def test_a_directory_as_config_or_prompt_file_says_so(tmp_path: Path) -> None:
    (tmp_path / "prompts").mkdir()
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "prompts")
    assert caught.value.message == "cannot read config file: not a regular file (a directory)"
    with pytest.raises(ConfigError) as caught:
        load_config(with_prompt_file(tmp_path, "prompts"))
    assert caught.value.message.endswith(": not a regular file (a directory)")


def test_a_config_reached_through_a_symlink_still_loads(tmp_path: Path) -> None:
    (tmp_path / "link.json").symlink_to(S0)
    assert load_config(tmp_path / "link.json").experiment_id == document()["experiment_id"]


# ----------------------------------------------------------------------------- the plugin


@pytest.mark.process  # a pytest process under a timeout ends a hang
def test_the_plugin_says_not_a_regular_file_for_a_fifo_or_directory(
    pytester: pytest.Pytester,
) -> None:
    os.mkfifo(pytester.path / "fifo.json")
    (pytester.path / "dir.json").mkdir()
    for name in ("fifo.json", "dir.json"):
        result = pytester.runpytest_subprocess(
            "--drift-config", name, "--drift-plan-only", timeout=TIMEOUT
        )
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"*--drift-config */{name}: not a regular file"])
        assert "file not found" not in result.stderr.str()


@pytest.mark.process  # a pytest process under a timeout ends a hang
def test_the_plugin_collects_a_config_with_a_fifo_prompt_file_as_one_error(
    pytester: pytest.Pytester,
) -> None:
    os.mkfifo(pytester.path / "prompts.json")
    with_prompt_file(pytester.path, "prompts.json")
    result = pytester.runpytest_subprocess(
        "--drift-config", "config.json", "--drift-plan-only", timeout=TIMEOUT
    )
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        [
            "*config.json: $.identity.prompts.file: cannot read prompt file *: not a regular file"
            " (a FIFO)*"
        ]
    )
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
