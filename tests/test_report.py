"""The report: a real S0 run (cpu-smoke through the CLI) rendered and checked in headless
Chromium, a tampered attempt shown as invalid and never plotted, the terminal ranking, the
plugin's ``--drift-report``, and the aggregation that keeps large runs readable and small."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from drift_testing import S0, S0_HF, pytest_drift
from drift_testing import cli as in_process
from report_browser import PageCheck, open_page

from pytest_logprob_drift.report import plots
from pytest_logprob_drift.report.html import render_page
from pytest_logprob_drift.report.load import (
    PROFILE_MAX_BINS,
    PROFILE_MAX_LINES,
    SCATTER_GRID,
    SCATTER_MAX_POINTS,
    SCATTER_OVERLAY,
    histogram,
    load_report,
    position_profile,
    scatter,
)
from pytest_logprob_drift.store.run import iter_attempt_dirs

EXPECT = "logp.backend=smoke_only.logp_offset=MISMATCH"
OFFSET = "logp.backend=smoke_only.logp_offset"
CASE_PLOTS = ("histogram", "position", "scatter")
MIN_VARIANCE = 25.0
"""Grey-level variance above which a screenshot region is not blank (a blank one is 0)."""


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_logprob_drift", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=False,
    )


@pytest.fixture(scope="module")
def s0_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One real S0 run through the CLI, and its report (both in this process: the tests read
    them; the commands as processes are ``test_cli_run``'s)."""
    cwd = tmp_path_factory.mktemp("report-s0")
    artifacts = cwd / "runs"
    code, out, err = in_process(
        "run",
        S0,
        "--runtime",
        "cpu-smoke",
        "--allow-smoke-operators",
        "--artifacts",
        artifacts,
        "--expect",
        EXPECT,
    )
    assert code == 0, out + err
    run_dir = artifacts / "s0-cpu-smoke"
    page = cwd / "pages" / "s0.html"
    code, out, err = in_process("report", run_dir, "--html", page)
    assert code == 0, out + err
    return {"cwd": cwd, "run_dir": run_dir, "page": page, "report": out}


def assert_page_reads_well(check: PageCheck, page: Path, cases: int, detailed: int) -> None:
    assert check.console_errors == []
    assert check.external_requests(page) == []
    assert page.resolve().as_uri() in check.requests  # the browser's requests were seen
    kinds = [p["plot"] for p in check.plots]
    assert kinds.count("overview") == 1
    for kind in CASE_PLOTS:
        assert kinds.count(kind) == detailed, kinds
    for plot in check.plots:
        assert plot["svg"] and plot["drawn"] > 10, plot
        assert plot["width"] > 100 and plot["height"] > 100, plot
        assert plot["variance"] > MIN_VARIANCE, plot
    assert len(check.rows) == cases
    colours = {row["outcome"]: row["background"] for row in check.rows}
    assert colours["MISMATCH"] not in ("rgba(0, 0, 0, 0)", "rgb(255, 255, 255)")
    assert colours["MISMATCH"] != colours["PASS"]
    assert check.screenshot is not None and check.screenshot.stat().st_size > 10_000


@pytest.mark.slow
def test_s0_report_reads_well_in_chromium(s0_run: dict[str, Any]) -> None:
    page = s0_run["page"]
    check = open_page(page, "report-s0-cpu-smoke.png")
    assert_page_reads_well(check, page, cases=3, detailed=3)
    assert [p["plot"] for p in check.plots].count("attribution") == 1
    mismatch = next(r for r in check.rows if r["outcome"] == "MISMATCH")
    assert mismatch["label"] == OFFSET
    # The sort script ran: the max |diff| column ascending puts the mismatching case last.
    assert check.sorted_labels[-1] == OFFSET


@pytest.mark.slow
def test_hf_s0_report_reads_well_in_chromium(tmp_path: Path) -> None:
    """The real transformers runtime on the tiny Qwen3: token text from its tokenizer."""
    artifacts = tmp_path / "runs"
    run = cli(
        "run",
        str(S0_HF),
        "--runtime",
        "hf",
        "--artifacts",
        str(artifacts),
        "--expect",
        "rollout.dtype=bfloat16=MISMATCH",
        "--expect",
        "training.compute_dtype=bfloat16=MISMATCH",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    page = tmp_path / "s0-hf.html"
    report = cli("report", str(artifacts / "s0-hf-tiny"), "--html", str(page), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "ranked by effect on the drift: " in report.stdout
    html = page.read_text()
    assert "decoded with the checkpoint's tokenizer" in html
    assert "token ids (no tokenizer)" not in html
    check = open_page(page, "report-s0-hf.png")
    assert_page_reads_well(check, page, cases=6, detailed=6)
    assert {r["outcome"] for r in check.rows} == {"PASS", "MISMATCH"}


@pytest.mark.slow
def test_page_is_self_contained(s0_run: dict[str, Any]) -> None:
    html = s0_run["page"].read_text()
    assert html.startswith("<!doctype html>")
    external = (r"<script[^>]+src", r"<link", r"<img", r"@import", r"url\((?!#)", r"@font-face")
    for pattern in external:
        assert not re.search(pattern, html, re.IGNORECASE), pattern
    for url in re.findall(r"(?:href|src)\s*=\s*['\"]([^'\"]+)", html):
        assert not re.match(r"(?i)[a-z]+://", url) or url.startswith("data:"), url
    # Links to the sealed files are relative to the page and point at real files.
    page_dir = s0_run["page"].parent
    links = re.findall(r"href='([^'#][^']*)'", html)
    assert any(link.endswith("token_diffs.pt") for link in links)
    for link in links:
        assert (page_dir / link).is_file(), link


@pytest.mark.slow
def test_terminal_report_shows_table_ranking_and_json(s0_run: dict[str, Any]) -> None:
    out = s0_run["report"]
    for word in ("baseline", "batch.size=1", OFFSET, "MISMATCH", "PASS"):
        assert word in out
    assert f"ranked by effect on the drift: {OFFSET}\n" in out  # batch.size=1: within
    assert "Within the contract (PASS, max |diff| below 0.0001; not ranked): batch.size=1." in out
    assert f"HTML report: {s0_run['page']}" in out
    code, stdout, _ = in_process("report", s0_run["run_dir"], "--html", s0_run["page"], "--json")
    assert code == 0
    document = json.loads(stdout)
    assert document["ranking"] == [OFFSET]
    assert document["findings"]["within_contract"] == ["batch.size=1"]
    assert {c["label"]: c["outcome"] for c in document["cases"]} == {
        "baseline": "PASS",
        "batch.size=1": "PASS",
        OFFSET: "MISMATCH",
    }
    assert document["invalid"] == 0
    # The page existed: it is left as it was.
    code, stdout, _ = in_process("report", s0_run["run_dir"], "--html", s0_run["page"])
    assert code == 0 and "already exists; not overwritten" in stdout


class _Figures(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.figures: list[dict[str, str | None]] = []
        self.rows: dict[str, str | None] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "figure":
            self.figures.append(a)
        if tag == "tr" and a.get("data-case"):
            self.rows[str(a["data-case"])] = a.get("data-outcome")


@pytest.mark.slow
def test_tampered_attempt_is_shown_invalid_and_never_plotted(
    s0_run: dict[str, Any], tmp_path: Path
) -> None:
    run_dir = tmp_path / "s0-cpu-smoke"
    shutil.copytree(s0_run["run_dir"], run_dir)
    offset = next(
        a
        for a in iter_attempt_dirs(run_dir)
        if json.loads((a / "comparison.json").read_text())["label"] == OFFSET
    )
    target = offset / "token_diffs.pt"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01  # flip one bit in the middle of the sealed tensor file
    target.write_bytes(bytes(data))
    page = tmp_path / "tampered.html"
    report = cli("report", str(run_dir), "--html", str(page), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert f"invalid attempt (not shown): {offset.parent.name}/{offset.name}" in report.stdout
    html = page.read_text()
    parser = _Figures()
    parser.feed(html)
    case_id = offset.parent.name
    assert parser.rows[case_id] == "NO_VALID_ATTEMPT"
    assert not [f for f in parser.figures if f.get("data-case") == case_id]
    assert f"id='case-{case_id}'" not in html
    assert "Invalid attempts (1)" in html
    assert "token_diffs.pt" in html[html.index("id='invalid'") :]
    # The sealed attribution still names the tampered attempt: its entry is left out.
    assert "Left out of the attribution" in html
    assert "<b>Ranked by effect on the drift:</b> batch.size=1</p>" in html
    # The others are still plotted, and the page still reads well.
    assert len([f for f in parser.figures if f.get("data-case")]) == 2 * len(CASE_PLOTS)
    check = open_page(page, "report-s0-tampered.png")
    assert check.console_errors == [] and check.external_requests(page) == []
    assert {r["outcome"] for r in check.rows} == {"PASS", "NO_VALID_ATTEMPT"}
    assert all(p["variance"] > MIN_VARIANCE for p in check.plots)


@pytest.mark.slow
def test_plugin_writes_the_report_at_session_end(tmp_path: Path) -> None:
    shutil.copy(S0, tmp_path / S0.name)
    page = tmp_path / "drift.html"
    proc = pytest_drift(
        tmp_path,
        "--drift-config",
        S0.name,
        "--drift-runtime",
        "cpu-smoke",
        "--drift-allow-smoke-operators",
        "--drift-expect",
        EXPECT,
        "--drift-artifacts",
        "runs",
        "--drift-report",
        page.name,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert f"drift report: {page}" in proc.stdout
    html = page.read_text()
    parser = _Figures()
    parser.feed(html)
    assert sorted(parser.rows.values()) == ["MISMATCH", "PASS", "PASS"]
    assert "Attribution: which change moves the drift" in html
    # The findings first, naming the intervention that moved a side (issue 26).
    assert html.index("id='findings'") < html.index("id='cases'")
    assert f"data-label='{OFFSET}' data-side='training'" in html


# --------------------------------------------------------------------------- aggregation


def _large_case(samples: int, response: int, prompt: int = 8) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    width = prompt + response
    columns = torch.arange(width).expand(samples, width)
    lengths = response - torch.randint(0, response // 4, (samples,), generator=generator)
    active = (columns >= prompt) & (columns < prompt + lengths.view(-1, 1))
    rollout = -torch.rand((samples, width), generator=generator, dtype=torch.float64) * 6
    training = (
        rollout + torch.randn((samples, width), generator=generator, dtype=torch.float64) * 1e-3
    )
    return {
        "rollout": rollout,
        "training": training,
        "active": active,
        "starts": torch.full((samples,), prompt, dtype=torch.int64),
    }


@pytest.mark.slow
def test_large_cases_are_binned_and_downsampled() -> None:
    case = _large_case(samples=100, response=1200)
    diff_grid = (case["training"] - case["rollout"]).abs()
    active = case["active"]
    diff = diff_grid[active]
    assert diff.numel() > 90_000
    hist = histogram(diff)
    assert int(hist.counts.sum()) + hist.zeros == diff.numel()
    profile = position_profile(diff_grid, active, case["starts"])
    assert profile.starts.size <= PROFILE_MAX_BINS
    assert profile.samples.size == PROFILE_MAX_LINES
    assert profile.total_samples == 100
    # Each drawn line is its sample's max |diff| per bin: its peak is the sample's peak.
    for sample, line in zip(profile.samples, profile.lines, strict=True):
        assert np.nanmax(line) == float(diff_grid[sample][active[sample]].max())
    assert np.all(profile.band_low <= profile.median + 0) and np.all(
        profile.median <= profile.band_high
    )
    data = scatter(case["rollout"][active], case["training"][active], diff, 1e-3)
    assert not data.points and data.grid is not None
    assert data.grid.shape == (SCATTER_GRID, SCATTER_GRID)
    assert int(data.grid.sum()) == diff.numel() > SCATTER_MAX_POINTS
    assert data.rollout.size == SCATTER_OVERLAY
    assert float(np.min(np.abs(data.training - data.rollout))) == float(
        torch.sort(diff, descending=True).values[SCATTER_OVERLAY - 1]
    )
    sizes = [
        len(plots.histogram_svg(hist, 1e-3, plots.histogram_decades([hist], [1e-3]))),
        len(plots.profile_svg(profile, 1e-3)),
        len(plots.scatter_svg(data, 1e-3)),
    ]
    assert sum(sizes) < 150_000, sizes  # 24 detailed cases stay well under 10 MB


@pytest.mark.slow
def test_a_case_whose_diffs_are_all_zero_still_draws(s0_run: dict[str, Any]) -> None:
    zeros = torch.zeros(40, dtype=torch.float64)
    hist = histogram(zeros)
    assert hist.zeros == 40 and int(hist.counts.sum()) == 0
    svg = plots.histogram_svg(hist, 1e-3, plots.histogram_decades([hist], [1e-3]))
    assert "every |diff| is exactly 0" in svg
    active = torch.ones((2, 20), dtype=torch.bool)
    profile = position_profile(
        torch.zeros((2, 20), dtype=torch.float64), active, torch.zeros(2, dtype=torch.int64)
    )
    assert "every |diff| is exactly 0" in plots.profile_svg(profile, 1e-3)


@pytest.mark.process  # sys.modules of a fresh interpreter
def test_rendering_is_torch_free() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, pytest_logprob_drift.report.html, pytest_logprob_drift.report.plots; "
            "print(sorted(m for m in ('torch', 'transformers', 'vllm', 'tokenizers') "
            "if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.slow  # its run's report drew the page
def test_page_without_matplotlib_says_so(
    s0_run: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = load_report(s0_run["run_dir"], page_dir=s0_run["run_dir"])
    monkeypatch.setattr(plots, "available", lambda: False)
    html = render_page(data)
    assert "matplotlib is not installed" in html and "<svg" not in html
    assert html.count("<tr class='o-") == 3
