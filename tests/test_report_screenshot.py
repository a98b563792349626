"""``scripts/report_screenshot.py`` (docs/report.png's source) runs: on a small imported run
it writes a PNG of the report's top. Its pixels are not checked. Slow: Chromium."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from production_dumps import make_samples, write_nemo_rl_step
from report_browser import require_chromium

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_screenshot_script_writes_a_png(tmp_path: Path) -> None:
    require_chromium()
    logs = tmp_path / "logs"
    logs.mkdir()
    rng = np.random.default_rng(39)
    write_nemo_rl_step(logs, 1, make_samples(rng, 3))
    write_nemo_rl_step(logs, 2, make_samples(rng, 3, planted=[(0, 1, 0.05)]))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    imported = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_logprob_drift",
            "import",
            "--format",
            "nemo-rl",
            str(logs),
            "--artifacts",
            str(tmp_path / "runs"),
            "--experiment-id",
            "shot",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert imported.returncode == 1, imported.stderr  # step 2 is a MISMATCH
    out = tmp_path / "report.png"
    shot = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "report_screenshot.py"),
            str(tmp_path / "runs" / "shot"),
            "--out",
            str(out),
            "--width",
            "800",
            "--height",
            "600",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert shot.returncode == 0, shot.stderr
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert not list((tmp_path / "runs" / "shot").glob("report-*.html"))  # the run is not written
