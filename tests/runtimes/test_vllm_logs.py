"""vLLM's own output: kept in a log file beside the artifacts by default, shown with ``-v``.

One real CLI run (slow: two vLLM engines, about a minute) of a reduced S1 experiment (the
baseline, ``batch.size=1`` on the same engine, ``rollout.dtype=bfloat16`` on a second one)
proves that a successful run's terminal carries the project's progress and results only, that
vLLM's INFO lines, its "Chat template warmup failed" traceback and the engine processes'
output are in ``runs/<experiment>/engine-logs/``, and renders the run's report in headless
Chromium (the S1 screenshot). The routing itself is checked without an engine.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from drift_testing import S1, skip_unless_installed
from report_browser import open_page

from pytest_logprob_drift.cli import build_parser
from pytest_logprob_drift.runtimes.vllm import logs

skip_unless_installed("vllm")

# the engine processes' output, in their log file; vLLM's loggers: imports vLLM
pytestmark = [pytest.mark.vllm_processes, pytest.mark.slow]

VLLM_LINE = re.compile(r"(^|\s)(INFO|WARNING|DEBUG)\s+\d\d-\d\d |\(EngineCore|\[vllm\.|vllm\.")


@pytest.fixture
def clean_routing(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Leave the process-wide policy, the environment and vLLM's logger as they were."""
    monkeypatch.setenv(logs.CONFIG_ENV, "")  # recorded, so the original comes back
    monkeypatch.delenv(logs.CONFIG_ENV)
    monkeypatch.setenv(logs.LEVEL_ENV, "INFO")
    logger = logging.getLogger(logs.VLLM_LOGGER)
    handlers, propagate, level = list(logger.handlers), logger.propagate, logger.level
    previous = logs.route_engine_logs(None)
    try:
        yield
    finally:
        logs.restore_engine_logs(previous)
        for handler in list(logger.handlers):
            if handler not in handlers:
                logger.removeHandler(handler)
                handler.close()
        logger.propagate, logger.level = propagate, level
        monkeypatch.setattr(logs, "_log_file", None)
        monkeypatch.setattr(logs, "_config_file", None)


def test_file_routing_sends_vllm_loggers_and_engine_processes_to_one_file(
    tmp_path: Path, clean_routing: None, capfd: pytest.CaptureFixture[str]
) -> None:
    logs.route_engine_logs(tmp_path / "engine-logs")
    logs.prepare_vllm_logging()
    logging.getLogger("vllm.some.module").info("an engine INFO line")
    with logs.engine_output() as path:  # what an engine process started here would print
        assert path is not None
        subprocess.run([sys.executable, "-c", "print('engine core output')"], check=True)
    log = logs.engine_log_file()
    assert log is not None and log.parent == (tmp_path / "engine-logs").resolve()
    text = log.read_text()
    assert "an engine INFO line" in text and "engine core output" in text
    out, err = capfd.readouterr()
    assert "an engine INFO line" not in out + err and "engine core output" not in out + err
    # Engine processes configure vLLM's logging from this file: the same log, at INFO.
    config = json.loads(Path(os.environ[logs.CONFIG_ENV]).read_text())
    assert config["handlers"]["file"]["filename"] == str(log)
    assert config["loggers"]["vllm"]["level"] == "INFO"


def test_show_routing_leaves_vllm_its_terminal(tmp_path: Path, clean_routing: None) -> None:
    logs.route_engine_logs(tmp_path / "engine-logs")
    logs.prepare_vllm_logging()
    assert logs.CONFIG_ENV in os.environ
    logs.route_engine_logs(None)  # -v / --drift-engine-logs
    logs.prepare_vllm_logging()
    assert logs.CONFIG_ENV not in os.environ
    with logs.engine_output() as path:
        assert path is None


def test_restoring_the_policy_takes_its_config_out_of_the_environment(
    tmp_path: Path, clean_routing: None
) -> None:
    """After a run routed vLLM's logs to its file, a process started later (a CLI run, an
    engine of another policy) must not inherit that run's logging config."""
    previous = logs.route_engine_logs(tmp_path / "engine-logs")
    logs.prepare_vllm_logging()
    assert Path(os.environ[logs.CONFIG_ENV]).is_file()
    logs.restore_engine_logs(previous)
    assert logs.CONFIG_ENV not in os.environ
    logs.route_engine_logs(tmp_path / "engine-logs")  # the next engine writes it again
    logs.prepare_vllm_logging()
    assert Path(os.environ[logs.CONFIG_ENV]).is_file()


def test_a_users_own_vllm_logging_config_wins(
    tmp_path: Path, clean_routing: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = tmp_path / "mine.json"
    monkeypatch.setenv(logs.CONFIG_ENV, str(mine))
    logs.route_engine_logs(tmp_path / "engine-logs")
    logs.prepare_vllm_logging()
    assert os.environ[logs.CONFIG_ENV] == str(mine)


def test_cli_flag() -> None:
    parser = build_parser()
    assert parser.parse_args(["run", "c.json", "--runtime", "vllm-hf", "-v"]).engine_logs
    assert parser.parse_args(["run", "c.json", "--runtime", "vllm-hf", "--engine-logs"]).engine_logs
    assert not parser.parse_args(["run", "c.json", "--runtime", "vllm-hf"]).engine_logs


@pytest.fixture(scope="module")
def s1_small(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    workdir = tmp_path_factory.mktemp("s1-logs")
    config = json.loads(S1.read_text())
    config["experiment_id"] = "s1-vllm-logs"
    config["interventions"] = [
        {"path": "rollout.dtype", "values": ["bfloat16"]},
        {"path": "batch.size", "values": [1]},
    ]
    path = workdir / "s1_small.json"
    path.write_text(json.dumps(config))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_logprob_drift",
            "run",
            str(path),
            "--runtime",
            "vllm-hf",
            "--artifacts",
            str(workdir / "runs"),
            "--expect",
            "rollout.dtype=bfloat16=MISMATCH",
        ],
        cwd=workdir,
        # a fresh CLI process, as a user starts it: no logging level or logging config file
        # left in this worker's environment by earlier in-process vLLM tests (a config file of
        # theirs would be honoured as the user's own and route the engine's logs elsewhere)
        env={k: v for k, v in os.environ.items() if k not in (logs.LEVEL_ENV, logs.CONFIG_ENV)},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    return {"workdir": workdir, "proc": proc, "run_dir": workdir / "runs" / "s1-vllm-logs"}


def test_successful_vllm_run_keeps_its_terminal_clean(s1_small: dict[str, Any]) -> None:
    proc = s1_small["proc"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    terminal = proc.stdout + proc.stderr
    for noise in ("Chat template", "Traceback", "Triton", "EngineCore", "FutureWarning"):
        assert noise not in terminal
    assert not [line for line in terminal.splitlines() if VLLM_LINE.search(line)], terminal
    (pointer,) = [line for line in proc.stderr.splitlines() if line.startswith("vLLM logs: ")]
    log = Path(pointer.split()[2])
    assert log.parent == (s1_small["run_dir"] / "engine-logs").resolve()
    text = log.read_text()
    assert "INFO" in text and "[vllm." in text
    pids = {int(m) for m in re.findall(r"^(?:INFO|WARNING) \S+ \S+ (\d+) \[vllm", text, re.M)}
    assert len(pids) >= 2  # this process and the engine processes
    assert "rollout.dtype=bfloat16 -> MISMATCH" in proc.stdout


def test_s1_report_reads_well_in_chromium(s1_small: dict[str, Any]) -> None:
    assert s1_small["proc"].returncode == 0
    page = s1_small["workdir"] / "s1-report.html"
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_logprob_drift",
            "report",
            str(s1_small["run_dir"]),
            "--html",
            str(page),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert report.returncode == 0, report.stderr
    # batch.size=1 passes far inside the contract: listed apart, never ranked as a cause.
    assert "ranked by effect on the drift: rollout.dtype=bfloat16 (rollout)." in report.stdout
    assert "not ranked): batch.size=1." in report.stdout
    assert "decoded with the checkpoint's tokenizer" in page.read_text()
    check = open_page(page, "report-s1-vllm.png")
    assert check.console_errors == [] and check.external_requests(page) == []
    assert len(check.rows) == 3
    kinds = [p["plot"] for p in check.plots]
    assert kinds.count("histogram") == kinds.count("position") == kinds.count("scatter") == 3
    assert "attribution" in kinds and "overview" in kinds
    assert all(p["variance"] > 25.0 for p in check.plots), check.plots
    colours = {r["outcome"]: r["background"] for r in check.rows}
    assert colours["MISMATCH"] != colours["PASS"]
