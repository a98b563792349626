"""Paths whose bytes are not UTF-8 (a directory named ``b"drift-\\xff"``, which Python holds as
the lone surrogate ``\\udcff``): the real commands show every such path escaped (``\\udcff``,
as ``errors.one_line`` writes it) in their lines, their error messages and the HTML page, link
to the files by their bytes (``%FF``), and never end in an internal error or a traceback.

``run`` and one ``report`` (the page outside the run) run as processes whose standard output
is strict UTF-8 (what a UTF-8 terminal gets, ``PYTHONIOENCODING=utf-8:strict``): an unescaped
path there is an encoding error, where the C locale would write the raw byte; the test also
reads the bytes. Those two are children forked from the session's server that imported the CLI
once (the ``cli_process`` fixture: their argv is what ``sys.argv`` holds for the path's bytes,
their streams are set up from ``PYTHONIOENCODING`` as an interpreter's start does);
``plan``'s error lines come from real ``python -m pytest_logprob_drift`` processes (a fresh
interpreter decoding the bytes of its argv; ``plan`` never imports torch). The other
commands (the report beside the run, ``verify``, ``report`` of a directory that is not a run)
run in this process (``drift_testing.cli``), an interpreter start each saved: what they write
must encode as strict UTF-8 and hold no lone surrogate, the same check the strict stream makes
for stdout and a stricter one for stderr (a process's stderr is ``backslashreplace`` whatever
``PYTHONIOENCODING`` says, which writes a lone ``\\udcff`` exactly as the escape looks)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

import pytest
from cli_processes import ForkServer
from drift_testing import OFFSET_EXPECT, S0, cli

pytestmark = pytest.mark.process  # non-UTF-8 argv and strict streams of real processes

BAD = os.fsdecode(b"drift-\xff")
"""A file name whose bytes are not UTF-8."""
SHOWN = "drift-\\udcff"
"""How the terminal and the page show it."""


STRICT = {"OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8:strict"}
"""The environment of each command: its standard streams strict UTF-8."""


def command(*args: str | Path, cwd: Path) -> tuple[int, bytes, bytes]:
    """``python -m pytest_logprob_drift ARGS`` (the arguments as bytes) run to its end: exit
    code, stdout and stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_logprob_drift", *map(os.fsencode, args)],
        cwd=cwd,
        capture_output=True,
        env={**os.environ, **STRICT},
        timeout=180,
        check=False,
    )
    return proc.returncode, proc.stdout, proc.stderr


def forked(cli_process: ForkServer, *args: str | Path, cwd: Path) -> tuple[int, bytes, bytes]:
    """``logprob-drift ARGS`` as a child of the session's fork server, like ``command``."""
    done = cli_process(*args, cwd=cwd, env=STRICT, seconds=180)
    assert done.code is not None, done.describe()
    return done.code, done.stdout_bytes, done.stderr_bytes


def finished(done: tuple[int, bytes, bytes]) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of a command; neither holds the raw byte, nor a
    traceback, nor an internal error."""
    code, stdout, stderr = done
    assert b"\xff" not in stdout + stderr
    out, err = stdout.decode(), stderr.decode()
    assert "Traceback" not in out + err and "internal error" not in err, err[-2000:]
    return code, out, err


def in_process(*args: str | Path, capfd: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``logprob-drift ARGS`` in this process (``drift_testing.cli``): exit code, stdout and
    stderr; like ``finished``, neither holds the raw byte (here the lone surrogate that stands
    for it), each encodes as strict UTF-8, no traceback, no internal error; nor does anything
    the command wrote to this process's own streams."""
    capfd.readouterr()
    code, out, err = cli(*args)
    stray = capfd.readouterr()
    for text in (out, err, stray.out, stray.err):
        assert "\udcff" not in text
        text.encode("utf-8")  # strict: a lone surrogate anywhere raises
    assert "Traceback" not in out + err + stray.err and "internal error" not in err, err[-2000:]
    return code, out, err


@pytest.fixture(scope="module")
def bad_run(cli_process: ForkServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The S0 run made by the ``run`` command (a forked child) with its artifacts under
    ``drift-\\xff``."""
    root = tmp_path_factory.mktemp("non-utf8")
    base = root / BAD
    base.mkdir()
    config = base / S0.name
    shutil.copy(S0, config)
    run = forked(
        cli_process,
        "run",
        config,
        "--runtime",
        "cpu-smoke",
        "--allow-smoke-operators",
        "--expect",
        OFFSET_EXPECT,
        "--artifacts",
        base / "runs",
        cwd=root,
    )
    return {"root": root, "base": base, "run_dir": base / "runs" / "s0-cpu-smoke", "run": run}


def test_run_prints_the_artifacts_path_escaped(bad_run: dict[str, Any]) -> None:
    code, out, _ = finished(bad_run["run"])
    assert code == 0
    (line,) = [ln for ln in out.splitlines() if ln.startswith("drift attribution (")]
    shown = str(bad_run["run_dir"]).replace(BAD, SHOWN)
    assert line.startswith(f"drift attribution (sealed: {shown}/attributions/"), line


def test_report_writes_the_page_and_one_line_with_the_paths_escaped(
    bad_run: dict[str, Any], cli_process: ForkServer, capfd: pytest.CaptureFixture[str]
) -> None:
    finished(bad_run["run"])
    root, run_dir = bad_run["root"], bad_run["run_dir"]
    # the page outside the run (its links pass through drift-\xff): a process; the page in the
    # run's default place: in this process
    outside = root / "pages" / "s0.html"
    elsewhere = forked(cli_process, "report", run_dir, "--html", outside, cwd=root)
    code, out, _ = in_process("report", run_dir, capfd=capfd)
    assert code == 0
    (line,) = [ln for ln in out.splitlines() if ln.startswith("HTML report: ")]
    (inside,) = run_dir.glob("report-*.html")
    assert line.startswith(f"HTML report: {str(inside).replace(BAD, SHOWN)} (")
    code, out, _ = finished(elsewhere)
    assert code == 0
    assert re.search(rf"^HTML report: {re.escape(str(outside))} \(\d+\.\d\d MB\)$", out, re.M)

    for page in (outside, inside):
        html = page.read_text(encoding="utf-8")  # strict: the page is UTF-8
        assert f"<code>{str(run_dir).replace(BAD, SHOWN)}</code>" in html
        links = re.findall(r"href='(\.{1,2}/[^']*)'", html)
        assert len(links) > 3
        for link in links:  # each names the file by its bytes, %FF for the byte 0xff
            assert (page.parent / os.fsdecode(unquote_to_bytes(link))).is_file(), link
    assert any("/drift-%FF/" in link for link in re.findall(r"href='([^']*)'", outside.read_text()))


def test_verify_and_report_errors_show_the_path_escaped(
    bad_run: dict[str, Any], capfd: pytest.CaptureFixture[str]
) -> None:
    finished(bad_run["run"])
    base, run_dir = bad_run["base"], bad_run["run_dir"]
    code, out, _ = in_process("verify", run_dir, capfd=capfd)
    assert code == 0 and out.splitlines()[-1] == "3 attempt(s), 1 attribution(s), 0 invalid"
    code, out, err = in_process("report", base, capfd=capfd)
    assert code == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith("logprob-drift: error: ") and f"{SHOWN}" in line, line


def test_plan_errors_show_the_config_path_escaped(tmp_path: Path) -> None:
    """A config refused when loaded, and one whose plan has an error (a knob given twice)."""
    base = tmp_path / BAD
    base.mkdir()
    refused, duplicated = json.loads(S0.read_text()), json.loads(S0.read_text())
    refused["scenario"]["expected"] = "PASS"
    duplicated["interventions"].append(duplicated["interventions"][0])
    for name, document in (("refused.json", refused), ("duplicated.json", duplicated)):
        config = base / name
        config.write_text(json.dumps(document))
        code, out, err = finished(command("plan", config, cwd=tmp_path))
        assert code == 2, out + err
        (line,) = err.splitlines()
        assert line.startswith(f"logprob-drift: error: {str(config).replace(BAD, SHOWN)}: "), line
