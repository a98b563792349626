"""The run-level views of the layer diagnostics without an engine: the run table's two layer
cells (``diagnostics.layers.text``), the report's all-cases plot data, its left-out cases and
its figure (``diagnostics.layers.run_plot``), the page's section, and a real ``cpu-smoke`` run
with layers on (neither side can capture: every cell ``n/a``, nothing drawn, the cases
named)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from drift_testing import S0, cli

from pytest_logprob_drift.diagnostics.layers import run_plot as layer_lines
from pytest_logprob_drift.diagnostics.layers import text as layer_text
from pytest_logprob_drift.numerics.comparison import (
    STATISTICS_KEYS,
    Diagnostics,
    LayerDiagnostics,
    Statistics,
    from_builtins,
)
from pytest_logprob_drift.report.html import render_page
from pytest_logprob_drift.report.model import CaseView, Header, ReportData

CAPTURED = {"status": "layers_captured", "evidence": {"decoder_layers": 2}}
UNAVAILABLE = {"status": "layers_unavailable", "reason": "the engine (X) has no layer capture"}
REDUCTION = {"projection_dim": 64, "projection_seed": 1, "digest_bytes": 16}


def _states(depth: int) -> list[str]:
    return [*(str(k) for k in range(depth + 1)), "final_norm", "logits"]


def _layers(
    depth: int = 2,
    first: str | None = "1",
    medians: list[float] | None = None,
    maxima: list[float] | None = None,
    rollout: dict[str, Any] = CAPTURED,
) -> LayerDiagnostics:
    names = _states(depth)
    medians = medians or [0.0] * len(names)
    maxima = maxima or [0.0] * len(names)
    figures = {
        "positions": 5,
        "states": [
            {
                "state": name,
                "bitwise_equal_share": 1.0 if high == 0 else 0.0,
                "median_rel_error": low,
                "max_rel_error": high,
                "median_cosine": 1.0,
            }
            for name, low, high in zip(names, medians, maxima, strict=True)
        ],
        "first_unequal_state": first,
    }
    return from_builtins(
        {
            "training": CAPTURED,
            "rollout": rollout,
            "reduction": REDUCTION,
            "figures": figures if rollout is CAPTURED else None,
        },
        LayerDiagnostics,
    )


def _view(label: str, i: int, layers: LayerDiagnostics | None) -> CaseView:
    return CaseView(
        case_id=f"c{i}",
        label=label,
        changed=("knob",),
        outcome="PASS",
        reason="",
        attempt_id="a",
        active_tokens=5,
        mismatches=0,
        threshold=1e-3,
        diagnostics=Diagnostics.of(
            Statistics(**dict.fromkeys(STATISTICS_KEYS, 1e-6)), layers=layers
        ),
        records=(),
        identity_violations=(),
        files=(),
        attribution=None,
        detail=None,
    )


# ---------------------------------------------------------------- the run table's cells


MOVED = [0.0, 0.5, 0.5, 0.5, 2.5]


@pytest.mark.parametrize(
    ("first", "maxima", "words", "logits"),
    [
        ("0", [0.25, *MOVED[1:]], "embeddings", "2.5"),
        ("1", MOVED, "layer 1", "2.5"),
        ("2", [0.0, 0.0, 0.5, 0.5, 2.5], "layer 2", "2.5"),
        ("final_norm", [0.0, 0.0, 0.0, 0.5, 2.5], "final norm", "2.5"),
        ("logits", [0.0, 0.0, 0.0, 0.0, 0.0123456], "logits", "0.0123"),
        (None, [0.0] * 5, "-", "0"),
    ],
)
def test_the_cells_name_the_first_unequal_state_in_words(
    first: str | None, maxima: list[float], words: str, logits: str
) -> None:
    diagnostics = Diagnostics(layers=_layers(first=first, maxima=maxima))
    assert layer_text.cells(diagnostics) == [words, logits]


def test_the_cells_say_n_a_with_a_side_unavailable_and_nothing_without_layers() -> None:
    unavailable = Diagnostics(layers=_layers(rollout=UNAVAILABLE))
    assert unavailable.layers is not None and unavailable.layers.figures is None
    assert layer_text.cells(unavailable) == ["n/a", "n/a"]
    assert layer_text.cells(Diagnostics()) == ["", ""]
    assert layer_text.cells(None) == ["", ""]
    assert layer_text.has_layers([None, Diagnostics(), unavailable])
    assert not layer_text.has_layers([None, Diagnostics()])
    assert len(layer_text.HEADERS) == len(layer_text.cells(None)) == 2


# ---------------------------------------------------------------- the all-cases plot data


def test_the_plot_draws_the_majority_depth_and_names_the_others() -> None:
    deep = [0.0, *(1e-3 * k for k in range(1, 9)), 2e-2, 3e-2]
    cases = [
        _view("a", 0, _layers(8, medians=deep, maxima=[2 * v for v in deep])),
        _view("shallow", 1, _layers(2)),
        _view("b", 2, _layers(8, first=None)),
        _view("off", 3, None),
        _view("no capture", 4, _layers(8, rollout=UNAVAILABLE)),
    ]
    plot = layer_lines.all_layers_plot(cases)
    assert plot is not None
    assert plot.states == tuple(_states(8)) and plot.decoder_layers == 8
    assert [(line.case_id, line.label) for line in plot.lines] == [("c0", "a"), ("c2", "b")]
    assert plot.lines[0].median == tuple(deep)
    assert plot.lines[0].max == tuple(2 * v for v in deep)
    assert plot.lines[1].median == plot.lines[1].max == (0.0,) * 11
    assert [(c.label, c.decoder_layers) for c in plot.left_out] == [
        ("shallow", 2),
        ("no capture", None),
    ]
    assert layer_lines.left_out_text(plot) == [
        "Not drawn, another network depth than the 8 decoder layers of the 2 case(s) drawn: "
        "shallow (2 decoder layers).",
        "Not drawn, no layer figures (a side did not capture its layers): no capture.",
    ]
    assert list(layer_lines.drawn([0.0, 1e-12, 0.5])) == [layer_lines.HEAT_LOW] * 2 + [0.5]


def test_a_tie_draws_the_deeper_network_and_no_layers_is_no_plot() -> None:
    plot = layer_lines.all_layers_plot([_view("s", 0, _layers(2)), _view("d", 1, _layers(4))])
    assert plot is not None and plot.decoder_layers == 4
    assert [c.label for c in plot.left_out] == ["s"]
    assert layer_lines.all_layers_plot([_view("x", 0, None)]) is None
    assert layer_lines.all_layers_plot([]) is None
    only_unavailable = layer_lines.all_layers_plot([_view("u", 0, _layers(rollout=UNAVAILABLE))])
    assert only_unavailable is not None and only_unavailable.lines == ()
    assert layer_lines.all_layers_svg(only_unavailable) is None
    assert layer_lines.left_out_text(only_unavailable) == [
        "Not drawn, no layer figures (a side did not capture its layers): u."
    ]


MATHTEXT = [r"$\frac{1}{0}$", "a=$x$ b=$", r"$\alpha$", "<b>&x</b>"]


def _texts(svg: str) -> list[str]:
    return [
        t.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
        for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    ]


@pytest.mark.slow
def test_the_figure_has_two_lines_per_case_and_plain_text_labels() -> None:
    pytest.importorskip("matplotlib")
    cases = [
        _view(label, i, _layers(2, maxima=[0, 1e-3, 1e-2, 1e-1, 1]))
        for i, label in enumerate(MATHTEXT)
    ]
    plot = layer_lines.all_layers_plot(cases)
    assert plot is not None
    svg = str(layer_lines.all_layers_svg(plot))
    for i in range(len(MATHTEXT)):
        assert svg.count(f'id="{layer_lines.MEDIAN_GID.format(i)}"') == 1
        assert svg.count(f'id="{layer_lines.MAX_GID.format(i)}"') == 1
    assert f'id="{layer_lines.MEDIAN_GID.format(len(MATHTEXT))}"' not in svg
    texts = _texts(svg)
    assert all(label in texts for label in MATHTEXT), texts
    assert "<b>" not in svg
    assert f"relative error (0 drawn at {layer_lines.HEAT_LOW:g})" in texts
    assert ["embed", "1", "2", "norm", "logits"] == [
        t for t in texts if t in ("embed", "1", "2", "norm", "logits")
    ]


@pytest.mark.slow
def test_past_the_legend_s_limit_every_line_is_drawn_and_the_legend_says_how_many() -> None:
    pytest.importorskip("matplotlib")
    many = layer_lines.LEGEND_MAX + 6
    labels = ["_starts_with_an_underscore", *(f"knob={i}" for i in range(1, many))]
    plot = layer_lines.all_layers_plot(
        [_view(label, i, _layers(2)) for i, label in enumerate(labels)]
    )
    assert plot is not None and len(plot.lines) == many
    svg = str(layer_lines.all_layers_svg(plot))
    assert svg.count('<g id="lpd-layer-median-') == svg.count('<g id="lpd-layer-max-') == many
    texts = _texts(svg)
    named = [label for label in labels if label in texts]
    assert named == labels[: layer_lines.LEGEND_MAX]  # the underscore label is named too
    assert layer_lines.legend_text(plot) == (
        f"The legend names the first {layer_lines.LEGEND_MAX} of the {many} cases drawn "
        "(colours repeat every 12); each case's own section and row give its figures."
    )
    few = layer_lines.all_layers_plot([_view("a", 0, _layers(2))])
    assert few is not None and layer_lines.legend_text(few) is None


# ---------------------------------------------------------------- the page


def _data(cases: list[CaseView]) -> ReportData:
    header = Header(
        experiment_id="e",
        scenario_id="s",
        scenario={},
        strategy="cross",
        contract={},
        runtimes=(),
        environments=(),
        first_attempt=None,
        last_attempt=None,
        run_dir="run",
    )
    return ReportData(
        header=header, cases=tuple(cases), statuses=(), attribution=None, detailed_limit=0
    )


@pytest.mark.slow
def test_the_page_has_the_section_only_with_layers_and_escapes_the_left_out_labels() -> None:
    pytest.importorskip("matplotlib")
    hostile = "<script>alert(1)</script>"
    page = render_page(
        _data([_view("a", 0, _layers(4)), _view("b", 1, _layers(4)), _view(hostile, 2, _layers(2))])
    )
    assert page.count("data-plot='layers-all'") == 1
    assert page.count("id='lpd-layer-median-") == 0  # ids are in the SVG, double quoted
    assert page.count('id="lpd-layer-median-') == 2
    assert "&lt;script&gt;alert(1)&lt;/script&gt; (2 decoder layers)." in page
    assert "<script>alert(1)" not in page
    assert page.index("id='cases'") < page.index("id='layers'")
    assert "The legend names" not in page
    crowded = render_page(
        _data([_view(f"k={i}", i, _layers(2)) for i in range(layer_lines.LEGEND_MAX + 1)])
    )
    assert crowded.count(f"The legend names the first {layer_lines.LEGEND_MAX} of the ") == 1
    none = render_page(_data([_view("a", 0, None)]))
    assert "id='layers'" not in none and "layers-all" not in none


# ---------------------------------------------------------------- a real run, no capture


@pytest.mark.slow
def test_a_run_whose_sides_cannot_capture_says_n_a_and_draws_nothing(tmp_path: Path) -> None:
    config = json.loads(S0.read_text())
    config["diagnostics"] = {"layers": True}
    path = tmp_path / "s0.json"
    path.write_text(json.dumps(config))
    artifacts = tmp_path / "runs"
    run = (
        "run",
        path,
        "--runtime",
        "cpu-smoke",
        "--artifacts",
        artifacts,
        "--allow-smoke-operators",
    )
    code, stdout, stderr = cli(*run)  # in this process: the test reads what it prints and seals
    assert code == 1, stderr[-2000:]  # the offset case MISMATCHes unexpectedly
    lines = stdout.splitlines()
    header = next(ln for ln in lines if ln.startswith("case_id "))
    assert header.rstrip().endswith("layers differ at  max rel (logits)")
    run_dir = artifacts / config["experiment_id"]
    sealed = {
        (c := json.loads(p.read_text()))["label"]: c
        for p in run_dir.glob("cases/*/*/comparison.json")
    }
    assert len(sealed) == 3
    for comparison in sealed.values():
        layers = comparison["diagnostics"]["layers"]
        assert layers["figures"] is None
        assert {layers[s]["status"] for s in ("training", "rollout")} == {"layers_unavailable"}
        row = next(ln for ln in lines if ln.startswith(comparison["case_id"] + " "))
        assert row.split()[-2:] == ["n/a", "n/a"], row
    _, as_json, _ = cli(*run, "--json")
    results = json.loads(as_json)["results"]
    assert {r["label"]: r["layers"] for r in results} == {
        label: c["diagnostics"]["layers"] for label, c in sealed.items()
    }
    page = tmp_path / "report.html"
    code, _, stderr = cli("report", run_dir, "--html", page)
    assert code == 0, stderr[-2000:]
    html = page.read_text()
    assert "id='layers'" in html and "data-plot='layers-all'" not in html
    note = "Not drawn, no layer figures (a side did not capture its layers): "
    assert html.count(note) == 1
    named = html.split(note, 1)[1].split("</p>", 1)[0].rstrip(".").split("; ")
    assert sorted(named) == sorted(sealed)
