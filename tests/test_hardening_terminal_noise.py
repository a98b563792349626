"""Noise and wrong words on the terminal (issue 21, class 9).

transformers' multi-line, ANSI-coloured load report goes where vLLM's logs go (a file under
``engine-logs/`` unless ``-v``): checked on the ``transformers`` logger without an engine, and
once with a real ``run --runtime hf`` of a checkpoint that holds an unexpected weight (slow).
torch's warning while it refuses a foreign pickle stays off the terminal and the refusal is the
invalid attempt's reason. A dangling symbolic link given as ``--artifacts`` says so instead of
"File exists".
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from drift_testing import S0_HF, cli, copy_of_s0, run_s0

from pytest_logprob_drift.errors import ExitCode
from pytest_logprob_drift.runtimes.transformers import logs as transformers_logs
from pytest_logprob_drift.runtimes.vllm import logs as engine_logs
from pytest_logprob_drift.store.layout import COMPLETE, SCORE_ROLLOUT

REPORT = "\x1b[1mQwen3ForCausalLM LOAD REPORT\x1b[0m from: /ckpt\nKey | Status\nextra | UNEXPECTED"


def one_error_line(err: str) -> str:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("logprob-drift: error: ")]
    assert len(lines) == 1, err
    return lines[0]


# ----------------------------------------------------------------------------- the load report


@pytest.fixture
def transformers_terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """A terminal handler on the ``transformers`` logger (what transformers installs), the
    engine-log policy and this module's log file put back afterwards."""
    logger = logging.getLogger(transformers_logs.LOGGER)
    terminal = io.StringIO()
    handler = logging.StreamHandler(terminal)
    after = logging.NullHandler()  # a handler that stays, after the terminal one
    logger.addHandler(handler)
    logger.addHandler(after)
    level = logger.level
    logger.setLevel(logging.WARNING)  # transformers' default verbosity
    previous = engine_logs.route_engine_logs(None)
    monkeypatch.setattr(transformers_logs, "_log_file", None)
    monkeypatch.setattr(transformers_logs, "_written", None)
    try:
        yield terminal
    finally:
        engine_logs.restore_engine_logs(previous)
        logger.removeHandler(handler)
        logger.removeHandler(after)
        logger.setLevel(level)


def test_the_load_report_goes_to_the_engine_log_file_uncoloured(
    tmp_path: Path, transformers_terminal: io.StringIO
) -> None:
    logger = logging.getLogger(transformers_logs.LOGGER)
    handlers, propagate = list(logger.handlers), logger.propagate
    engine_logs.route_engine_logs(tmp_path / "engine-logs")
    with transformers_logs.transformers_output():
        logging.getLogger("transformers.modeling_utils").warning(REPORT)
    assert transformers_terminal.getvalue() == ""
    log = transformers_logs.transformers_log_file()
    assert log is not None and log.parent == (tmp_path / "engine-logs").resolve()
    assert log.name.startswith("transformers-") and log.name.endswith(f"-{os.getpid()}.log")
    text = log.read_text(encoding="utf-8")
    assert "Qwen3ForCausalLM LOAD REPORT from: /ckpt\nKey | Status\nextra | UNEXPECTED" in text
    assert "\x1b" not in text
    assert (logger.handlers, logger.propagate) == (handlers, propagate)  # put back, in order
    logging.getLogger("transformers.modeling_utils").warning("after the load")
    assert "after the load" in transformers_terminal.getvalue()


def test_with_engine_logs_shown_the_load_report_stays_on_the_terminal(
    tmp_path: Path, transformers_terminal: io.StringIO
) -> None:
    engine_logs.route_engine_logs(None)  # -v / --engine-logs / --drift-engine-logs
    with transformers_logs.transformers_output():
        logging.getLogger("transformers.modeling_utils").warning(REPORT)
    assert REPORT in transformers_terminal.getvalue()
    assert transformers_logs.transformers_log_file() is None


def test_a_load_that_logs_nothing_creates_no_log_file(
    tmp_path: Path, transformers_terminal: io.StringIO
) -> None:
    engine_logs.route_engine_logs(tmp_path / "engine-logs")
    with transformers_logs.transformers_output():
        logging.getLogger("transformers.modeling_utils").info("below the logger's level")
    assert not (tmp_path / "engine-logs").exists()
    assert transformers_logs.transformers_log_file() is None


def _checkpoint_with_an_unexpected_weight(directory: Path) -> Path:
    import torch
    from safetensors.torch import load_file, save_file

    from pytest_logprob_drift.runtimes.tiny_model import build_tiny_checkpoint

    build_tiny_checkpoint(directory)
    weights = load_file(directory / "model.safetensors")
    weights["extra.weight"] = torch.zeros(2)
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


@pytest.mark.slow
def test_run_hf_keeps_the_load_report_off_the_terminal(tmp_path: Path) -> None:
    config: dict[str, Any] = json.loads(S0_HF.read_text())
    checkpoint = _checkpoint_with_an_unexpected_weight(tmp_path / "checkpoint")
    config["identity"]["checkpoint"] = {"uri": str(checkpoint), "model_version": "extra"}
    config["identity"]["sampling"]["max_new_tokens"] = 4
    config["interventions"] = []
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")

    def run(artifacts: Path, *flags: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "pytest_logprob_drift", "run", str(path)]
        return subprocess.run(
            [*command, "--runtime", "hf", "--artifacts", str(artifacts), *flags],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    # the model never loads extra.weight: the weight check names it (INVALID_IDENTITY, exit 1)
    quiet = run(tmp_path / "runs")
    assert quiet.returncode == 1, quiet.stderr
    assert "INVALID_IDENTITY" in quiet.stdout and "extra.weight" in quiet.stdout, quiet.stdout
    terminal = quiet.stdout + quiet.stderr
    assert "LOAD REPORT" not in terminal and "\x1b" not in terminal
    (log,) = (tmp_path / "runs" / config["experiment_id"] / "engine-logs").glob("transformers-*")
    assert f"transformers logs: {log} (-v shows them here)" in quiet.stderr
    text = log.read_text(encoding="utf-8")
    assert f"Qwen3ForCausalLM LOAD REPORT from: {checkpoint}" in text
    assert "extra.weight" in text and "\x1b" not in text

    shown = run(tmp_path / "shown", "-v")
    assert shown.returncode == 1, shown.stderr
    assert "LOAD REPORT" in shown.stderr and "extra.weight" in shown.stderr
    assert not (tmp_path / "shown" / config["experiment_id"] / "engine-logs").exists()


# ----------------------------------------------------------------------------- a foreign pickle


class _Plant:
    """Unpickling this runs ``open(path, "w")``: proof that pickle code ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def test_a_refused_pickle_is_the_reason_and_torch_warns_nothing(
    tmp_path: Path, sealed_s0: Path
) -> None:
    from test_hardening_store import reseal

    artifacts = copy_of_s0(sealed_s0, tmp_path)
    attempt = next((artifacts / "s0-cpu-smoke" / "cases").glob("*/*"))
    planted = tmp_path / "planted"
    # A plain pickle (protocol 4, not torch's zip format): torch warns about its protocol.
    (attempt / SCORE_ROLLOUT).write_bytes(pickle.dumps({"logprobs": _Plant(planted)}, 4))
    files = json.loads((attempt / COMPLETE).read_text())["files"]
    files[SCORE_ROLLOUT] = hashlib.sha256((attempt / SCORE_ROLLOUT).read_bytes()).hexdigest()
    reseal(attempt, files)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, err = cli("verify", artifacts / "s0-cpu-smoke", "--json")
    assert [str(w.message) for w in caught] == []
    assert code == ExitCode.UNEXPECTED_OUTCOME, err
    assert not planted.exists()
    reasons = [
        json.dumps(entry) for entry in json.loads(out)["attempts"] if entry["status"] == "invalid"
    ]
    assert len(reasons) == 1 and "not a weights-only tensor file" in reasons[0], out


# ----------------------------------------------------------------------------- --artifacts


@pytest.mark.parametrize("below", ["", "runs"])
def test_a_dangling_symlink_as_artifacts_says_so(tmp_path: Path, below: str) -> None:
    link = tmp_path / "artifacts"
    link.symlink_to(tmp_path / "gone")
    code, _, err = run_s0(link / below if below else link)
    assert code == ExitCode.USAGE_ERROR
    assert one_error_line(err) == (
        f"logprob-drift: error: {link}: cannot hold runs: it is a dangling symbolic link"
    )
    assert not (tmp_path / "gone").exists()
