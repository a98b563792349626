"""The report's overview of every case (issue 60): no two case labels overlap, the largest
|diff| first (an imported run's steps in their order), and the detailed sections lead with the
cases that did not pass.

The labels' boxes are read from the SVG itself: each tick label is a group of ``<text>``
lines, each drawn upright (rotated -90 degrees) from its baseline point; on the page a line
covers, across, its font's ascent to the left of that point and its descent to the right
(DejaVu Sans, the font matplotlib writes first: ascent 0.928 em, descent 0.236 em). Two labels
overlap when those spans do.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
from pathlib import Path

import pytest
from drift_testing import cli

from pytest_logprob_drift.numerics.comparison import STATISTICS_KEYS, Diagnostics, Statistics
from pytest_logprob_drift.report import plots
from pytest_logprob_drift.report.model import CaseView

ASCENT, DESCENT = 0.928, 0.236
MAIN_JOB = (
    "baseline",
    "batch.size=1",
    "training.sharding=fsdp",
    "rollout.dtype=bfloat16",
    "rollout.tensor_parallel_size=2",
    "rollout.enforce_eager=false",
    "rollout.enable_prefix_caching=true",
)
DATA = Path(__file__).parent / "data" / "pre_issue20" / "runs"


def _view(label: str, max_diff: float, outcome: str = "PASS") -> CaseView:
    return CaseView(
        case_id=f"c-{label}",
        label=label,
        changed=("knob",),
        outcome=outcome,
        reason="",
        attempt_id="a",
        active_tokens=1,
        mismatches=0,
        threshold=1e-3,
        diagnostics=Diagnostics.of(
            Statistics(**{**dict.fromkeys(STATISTICS_KEYS, 1e-7), "max_abs_diff": max_diff})
        ),
        records=(),
        identity_violations=(),
        files=(),
        attribution=None,
        detail=None,
    )


def label_spans(svg: str) -> list[tuple[str, float, float]]:
    """``(full label, left, right)`` of each tick label, in the SVG's user units."""
    spans = []
    for group in re.finditer(r'<g id="lpd-label-\d+"><title>([^<]*)</title>(.*?)</g>', svg, re.S):
        left, right = float("inf"), float("-inf")
        for text in re.finditer(r"<text ([^>]*)>", group.group(2)):
            attributes = text.group(1)
            size = float(re.search(r"font-size: ([\d.]+)px", attributes).group(1))  # type: ignore[union-attr]
            moved = re.search(r"translate\(([-\d.]+) ([-\d.]+)\) rotate\(([-\d.]+)\)", attributes)
            if moved is not None:
                x, angle = float(moved.group(1)), float(moved.group(3))
            else:
                x = float(re.search(r' x="([-\d.]+)"', attributes).group(1))  # type: ignore[union-attr]
                turned = re.search(r"rotate\(([-\d.]+)", attributes)
                angle = float(turned.group(1)) if turned is not None else 0.0
            assert angle == -90, f"a label not drawn upright: {attributes}"
            left, right = min(left, x - ASCENT * size), max(right, x + DESCENT * size)
        spans.append((group.group(1), left, right))
    return spans


def _overlaps(spans: list[tuple[str, float, float]]) -> list[tuple[str, str]]:
    ordered = sorted(spans, key=lambda s: s[1])
    return [(a[0], b[0]) for a, b in itertools.pairwise(ordered) if a[2] > b[1]]


@pytest.mark.parametrize(
    "labels",
    [
        MAIN_JOB,
        tuple(f"training.attention_backend=flash_attention_{i}_" + "x" * 50 for i in range(12)),
        tuple(f"batch.size={i}" for i in range(30)),
        ("baseline", "b"),
    ],
    ids=["main-job", "long-labels", "thirty-cases", "two-cases"],
)
@pytest.mark.slow
def test_no_two_overview_labels_overlap(labels: tuple[str, ...]) -> None:
    pytest.importorskip("matplotlib")
    svg = plots.overview_svg([_view(x, 1e-6 * (i + 1)) for i, x in enumerate(labels)], 1e-3)
    assert svg is not None
    spans = label_spans(str(svg))
    assert sorted(s[0] for s in spans) == sorted(labels)  # every label drawn, with its title
    assert _overlaps(spans) == []


def test_the_span_reading_finds_an_overlap_when_labels_touch() -> None:
    """The check can fail: two upright labels 3 units apart at 7.5 px overlap."""
    svg = (
        '<g id="lpd-label-0"><title>a</title><text style="font-size: 7.5px" '
        'transform="translate(10 5) rotate(-90)">a</text></g>'
        '<g id="lpd-label-1"><title>b</title><text style="font-size: 7.5px" x="13" y="5" '
        'transform="rotate(-90 13 5)">b</text></g>'
    )
    assert _overlaps(label_spans(svg)) == [("a", "b")]


@pytest.mark.slow
def test_the_overview_leads_with_the_largest_or_keeps_the_steps_in_order() -> None:
    pytest.importorskip("matplotlib")
    views = [_view(f"step={i}", d) for i, d in enumerate([1e-6, 2e-6, 5e-2, 9e-2, 3e-2], 1)]
    ranked = plots.overview_svg(views, 1e-3)
    in_order = plots.overview_svg(views, 1e-3, in_order=True)
    assert ranked is not None and in_order is not None
    titles = [
        re.findall(r'<g id="lpd-label-\d+"><title>([^<]*)', str(s)) for s in (ranked, in_order)
    ]
    assert titles[0] == ["step=4", "step=3", "step=5", "step=2", "step=1"]
    assert titles[1] == [v.label for v in views]


@pytest.mark.slow
def test_the_detailed_sections_lead_with_the_cases_that_did_not_pass(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(DATA / "fixture-pre20-hf", run_dir)
    page = tmp_path / "page.html"
    code, _, err = cli("report", run_dir, "--html", page)
    assert code == 0, err
    html = page.read_text()
    # the tiny model's samples read as noise: the page says why, beside its decoded tokens
    assert "a built-in tiny checkpoint: its weights are seeded, not trained" in html
    order = re.findall(r"<article class='case' id='case-[^']*' data-case='([^']*)'", html)
    code, out, err = cli("report", run_dir, "--no-html", "--json")
    assert code == 0, err
    cases = {c["case_id"]: c for c in json.loads(out)["cases"]}
    assert cases[order[0]]["outcome"] == "MISMATCH"
    passing = [cases[c]["diagnostics"]["max_abs_diff"] for c in order[1:]]
    assert passing == sorted(passing, reverse=True)
