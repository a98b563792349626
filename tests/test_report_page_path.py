"""Where ``report --html`` may write its page (issue 21, class 8): never inside the run's
sealed tree (``cases/``, ``attributions/``, ``seals/``: an unsealed file there makes ``verify``
reject the attempt or attribution it lands in), links followed; and a path that is a directory
is refused as one, not as "already exists"; ``--no-html`` writes none and prints the same."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from drift_testing import OFFSET_EXPECT, S0, cli, copy_of_s0, pytest_drift

from pytest_logprob_drift.attribution.sealed import attribution_dirs
from pytest_logprob_drift.store.run import iter_attempt_dirs


@pytest.fixture(scope="module")
def clean_run(sealed_s0: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_of_s0(sealed_s0, tmp_path_factory.mktemp("report-page-path")) / "s0-cpu-smoke"


def _sealed_places(run_dir: Path) -> list[Path]:
    attempt = next(iter_attempt_dirs(run_dir))
    return [
        attempt / "page.html",
        attempt.parent / "page.html",
        run_dir / "cases" / "page.html",
        attribution_dirs(run_dir)[0] / "page.html",
        run_dir / "attributions" / "page.html",
        run_dir / "seals" / "page.html",
        run_dir / "cases" / "new" / "deeper" / "page.html",
    ]


@pytest.mark.parametrize("place", range(7))
def test_a_page_inside_the_sealed_tree_is_refused(
    clean_run: Path, tmp_path: Path, place: int
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(clean_run, run_dir)
    target = _sealed_places(run_dir)[place]
    code, out, err = cli("report", run_dir, "--html", target)
    assert code == 2, out + err
    assert err.startswith("logprob-drift: error: report page ") and "sealed tree" in err
    assert len(err.strip().splitlines()) == 1
    assert not target.exists() and not (run_dir / "cases" / "new").exists()
    code, out, _ = cli("verify", run_dir)
    assert code == 0, out


def test_a_page_reached_through_a_link_into_the_sealed_tree_is_refused(
    clean_run: Path, tmp_path: Path
) -> None:
    attempt = next(iter_attempt_dirs(clean_run))
    link = tmp_path / "looks-harmless"
    os.symlink(attempt, link)
    code, _, err = cli("report", clean_run, "--html", link / "page.html")
    assert code == 2 and "sealed tree" in err
    assert not (attempt / "page.html").exists()


def test_a_page_path_that_is_a_directory_says_so(clean_run: Path, tmp_path: Path) -> None:
    code, out, err = cli("report", clean_run, "--html", tmp_path)
    assert code == 2, out + err
    expected = f"logprob-drift: error: report page {tmp_path} is a directory; name a file"
    assert err.strip() == expected
    assert "already exists" not in out + err


@pytest.mark.slow
def test_no_html_prints_the_same_report_and_writes_no_page(clean_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(clean_run, run_dir)
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    code, text, err = cli("report", run_dir, "--no-html")
    assert code == 0, err
    code, document, err = cli("report", run_dir, "--no-html", "--json")
    assert code == 0, err
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before
    assert "HTML report" not in text
    assert text.splitlines()[-1].endswith("the HTML page (without --no-html)")
    assert json.loads(document)["html"] is None
    # The same report as with the page, the page's own line aside.
    code, with_page, err = cli("report", run_dir)
    assert code == 0, err
    (page,) = run_dir.glob("report-*.html")
    assert f"HTML report: {page} (" in with_page
    shown = [line for line in with_page.splitlines() if not line.startswith("HTML report: ")]
    assert shown[:-1] == text.splitlines()[:-1]
    code, again, err = cli("report", run_dir, "--json")
    assert code == 0, err
    assert json.loads(again) == json.loads(document) | {"html": str(page)}
    # Both at once is a usage error that writes nothing.
    target = tmp_path / "page.html"
    code, out, err = cli("report", run_dir, "--no-html", "--html", target)
    assert code == 2, out + err
    assert (
        err == "logprob-drift report: error: argument --html: not allowed with argument --no-html\n"
    )
    assert out == "" and not target.exists()


@pytest.mark.slow
def test_the_plugin_refuses_a_page_inside_the_sealed_tree_with_one_line(tmp_path: Path) -> None:
    shutil.copy(S0, tmp_path / S0.name)
    target = tmp_path / "runs" / "s0-cpu-smoke" / "cases" / "drift.html"
    proc = pytest_drift(
        tmp_path,
        "--drift-config",
        S0.name,
        "--drift-runtime",
        "cpu-smoke",
        "--drift-allow-smoke-operators",
        "--drift-expect",
        OFFSET_EXPECT,
        "--drift-artifacts",
        "runs",
        "--drift-report",
        str(target),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if "drift report" in x)
    line = line[line.index("drift report") :]  # after the progress line's [100%]
    assert line.startswith(f"drift report not written: report page {target} is inside")
    assert "INTERNALERROR" not in proc.stdout + proc.stderr
    assert not target.exists()
