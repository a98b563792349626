"""Draw a run's report in headless Chromium and save the top of the page as a PNG.

    python scripts/report_screenshot.py RUN_DIR [--out docs/report.png] [--width 1280]
                                        [--height 1000]

Writes the report with ``logprob-drift report RUN_DIR --html`` into a temporary directory
(the run directory is not written), loads it from disk in headless Chromium (the helpers of
``tests/report_browser.py``: Debian's ``chromium``, or ``$CHROMIUM``) at a ``width`` CSS-pixel
viewport and saves its top ``width`` x ``height`` pixels to ``--out``. docs/report.png is this
script's output on the main job's run:

    logprob-drift run experiments/cross_config_s1_vllm_cpu_tiny.json --runtime vllm-hf \\
        --expect rollout.dtype=bfloat16=MISMATCH --artifacts runs
    python scripts/report_screenshot.py runs/s1-vllm-cpu-tiny --height 1200

``tests/test_report_screenshot.py`` runs it on a small run (slow: it needs the browser).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory")
    parser.add_argument("--out", default=str(ROOT / "docs" / "report.png"), help="the PNG")
    parser.add_argument("--width", type=int, default=1280, help="viewport width (CSS px)")
    parser.add_argument("--height", type=int, default=1000, help="height of the picture")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT / "tests"))
    from report_browser import find_chromium, live_page

    if find_chromium() is None:
        print("report_screenshot: chromium is not installed (apt-get install -y chromium)")
        return 2
    with tempfile.TemporaryDirectory(prefix="report-screenshot-") as tmp:
        page = Path(tmp) / "report.html"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest_logprob_drift",
                "report",
                args.run_dir,
                "--html",
                str(page),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            print(f"report_screenshot: report failed: {result.stderr.strip()}", file=sys.stderr)
            return result.returncode
        with live_page(page, width=args.width, height=args.height) as live:
            live.wait_until("document.readyState === 'complete'")
            png = live.viewport_png(args.width, args.height)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(png)
    print(f"wrote {out} ({len(png)} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
