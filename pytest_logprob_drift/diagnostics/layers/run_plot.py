"""The layers diagnostic's run-scope report section: where in the network the sides part, every
case on one plot.

Owns, from the sealed ``comparison.json`` figures of every case with layer diagnostics
(``numerics.comparison.LayerFigures``, already read and digest checked by the report's loader;
no tensor is read, so nothing here needs torch): the plot data (per case, per state, the
median and max over positions of the rollout-vs-training relative error), which cases share
the x axis (the state list most cases have: networks of other depths cannot share it and are
named as left out, as are cases whose layer figures are missing because a side did not
capture), and the figure: states on x, the relative error on a log y axis (0 drawn at
``HEAT_LOW``, above ``HEAT_HIGH`` at ``HEAT_HIGH``), one colour per case, the median solid and
the max dashed, a legend by case label (the first ``LEGEND_MAX`` cases; the page says so past
that). Also the log scale's fixed range (``HEAT_LOW`` .. ``HEAT_HIGH``) and the states' tick
names, which the per-case figures (``diagnostics.layers.plot``) share. Drawn with
``report.plots``' figure set-up (Agg, SVG); case labels are plain text, never mathtext. And the
page's section around it (``run_section``, the diagnostic's ``report_run_section``). Knows
nothing about the rest of the page, files or how the states were captured.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from pytest_logprob_drift.numerics.comparison import LayerFigures
from pytest_logprob_drift.report.markup import Markup, el
from pytest_logprob_drift.report.model import CaseView
from pytest_logprob_drift.report.plots import (
    LINE_COLOURS,
    PLAIN_TEXT,
    log_ticks,
    new_figure,
    to_svg,
    wrap_label,
)

HEAT_LOW, HEAT_HIGH = 1e-8, 1.0
"""The layer figures' log range, the same for every case (relative errors below are drawn at
the low end: bitwise equal states are 0; above, at the high end)."""
LEGEND_LINE: Final = 36
"""A case label in the legend: wrapped into at most two lines of this many characters."""
LEGEND_MAX: Final = 24
"""Cases named in the legend (the first ones drawn; the figure says so when there are more)."""
MEDIAN_GID, MAX_GID = "lpd-layer-median-{}", "lpd-layer-max-{}"
"""SVG group ids of the ``i``-th drawn case's two lines (``AllLayersPlot.lines`` order)."""


def state_tick(state: str) -> str:
    """A state's tick label: ``embed``, ``1`` .. ``L``, ``norm``, ``logits``."""
    return {"0": "embed", "final_norm": "norm", "logits": "logits"}.get(state, state)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerLine:
    """One case's per-state figures, as sealed (not clipped to the axis)."""

    case_id: str
    label: str
    median: tuple[float, ...]
    max: tuple[float, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class LeftOut:
    """A case with layer diagnostics that the plot does not draw, and why."""

    label: str
    decoder_layers: int | None
    """The case's depth when it has figures of another state list; None: no figures."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AllLayersPlot:
    """The drawn cases (all with the same ``states``) and the left-out ones, in case order."""

    states: tuple[str, ...]
    lines: tuple[LayerLine, ...]
    left_out: tuple[LeftOut, ...]

    @property
    def decoder_layers(self) -> int:
        return len(self.states) - 3


def _figures(view: CaseView) -> LayerFigures | None:
    layers = view.diagnostics.layers
    return None if layers is None else layers.figures


def all_layers_plot(cases: Sequence[CaseView]) -> AllLayersPlot | None:
    """The plot data of every case with layer diagnostics; None when no case has any. The
    drawn state list is the one most cases with figures have (ties: the deeper network)."""
    with_layers = [v for v in cases if v.diagnostics.layers is not None]
    if not with_layers:
        return None
    shapes = Counter(
        tuple(s.state for s in f.states) for v in with_layers if (f := _figures(v)) is not None
    )
    states = max(shapes, key=lambda s: (shapes[s], len(s))) if shapes else ()
    lines: list[LayerLine] = []
    left_out: list[LeftOut] = []
    for view in with_layers:
        figures = _figures(view)
        if figures is None:
            left_out.append(LeftOut(label=view.label, decoder_layers=None))
        elif tuple(s.state for s in figures.states) != states:
            left_out.append(LeftOut(label=view.label, decoder_layers=len(figures.states) - 3))
        else:
            lines.append(
                LayerLine(
                    case_id=view.case_id,
                    label=view.label,
                    median=tuple(s.median_rel_error for s in figures.states),
                    max=tuple(s.max_rel_error for s in figures.states),
                )
            )
    return AllLayersPlot(states=states, lines=tuple(lines), left_out=tuple(left_out))


def drawn(values: Sequence[float]) -> np.ndarray:
    """A line's y values as plotted: the sealed values within the fixed range, 0 (and anything
    below) at ``HEAT_LOW``, anything above at ``HEAT_HIGH`` (a reference state of norm 0 makes
    a relative error of about 1e300: matplotlib's log axis overflows on such a value)."""
    return np.clip(np.asarray(values, dtype=np.float64), HEAT_LOW, HEAT_HIGH)


def left_out_text(plot: AllLayersPlot) -> list[str]:
    """The sentences under the figure naming the cases it does not draw (none: empty)."""
    out = []
    deeper = [c for c in plot.left_out if c.decoder_layers is not None]
    if deeper:
        names = "; ".join(f"{c.label} ({c.decoder_layers} decoder layers)" for c in deeper)
        out.append(
            f"Not drawn, another network depth than the {plot.decoder_layers} decoder layers "
            f"of the {len(plot.lines)} case(s) drawn: {names}."
        )
    missing = [c.label for c in plot.left_out if c.decoder_layers is None]
    if missing:
        out.append(
            "Not drawn, no layer figures (a side did not capture its layers): "
            + "; ".join(missing)
            + "."
        )
    return out


def legend_text(plot: AllLayersPlot) -> str | None:
    """The sentence under the figure when its legend does not name every drawn case."""
    if len(plot.lines) <= LEGEND_MAX:
        return None
    return (
        f"The legend names the first {LEGEND_MAX} of the {len(plot.lines)} cases drawn "
        f"(colours repeat every {len(LINE_COLOURS)}); each case's own section and row give "
        "its figures."
    )


def all_layers_svg(plot: AllLayersPlot) -> Markup | None:
    """Every drawn case's per-state median (solid) and max (dashed); None: no case to draw."""
    if not plot.lines:
        return None
    entries = min(len(plot.lines), LEGEND_MAX)
    height = max(2.8, 0.7 + 0.24 * entries)
    width = max(4.2, 2.0 + 0.22 * len(plot.states))
    with new_figure(width + 2.0, height, right=2.1) as (figure, axes):
        x = np.arange(len(plot.states))
        named: list[Any] = []
        for i, line in enumerate(plot.lines):
            colour = LINE_COLOURS[i % len(LINE_COLOURS)]
            (median,) = axes.plot(
                x,
                drawn(line.median),
                color=colour,
                linewidth=1.0,
                marker="o",
                markersize=2,
            )
            (most,) = axes.plot(
                x, drawn(line.max), color=colour, linewidth=0.8, linestyle="--", alpha=0.8
            )
            median.set_gid(MEDIAN_GID.format(i))
            most.set_gid(MAX_GID.format(i))
            if i < LEGEND_MAX:
                named.append(median)
        axes.set_yscale("log")
        log_ticks(axes.yaxis)
        axes.set_ylim(HEAT_LOW / 2, HEAT_HIGH * 2)
        axes.set_xticks(x, [state_tick(s) for s in plot.states], fontsize=5.5)
        axes.set_xlabel("state (embeddings, after each decoder layer, final norm, logits)")
        axes.set_ylabel(f"relative error (0 drawn at {HEAT_LOW:g})")
        axes.set_title("rollout vs training by layer, every case (solid: median, dashed: max)")
        legend = axes.legend(  # explicit labels: a label starting with "_" is shown too
            named,
            [wrap_label(line.label, LEGEND_LINE, 2) for line in plot.lines[:LEGEND_MAX]],
            fontsize=5.5,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            frameon=False,
        )
        for text in legend.get_texts():
            text.set(**PLAIN_TEXT)
        return to_svg(figure)


def run_section(cases: Sequence[CaseView], draw: bool) -> Markup | None:
    """The per-layer relative error of every case with layer diagnostics on one plot
    (``all_layers_plot``), and the cases it leaves out; nothing when no case has them."""
    plot = all_layers_plot(cases) if draw else None
    if plot is None:
        return None
    svg = all_layers_svg(plot)
    figure = None if svg is None else el("figure", svg, class_="plot wide", data_plot="layers-all")
    legend = legend_text(plot) if svg is not None else None
    notes = (el("p", text, class_="muted left-out") for text in left_out_text(plot))
    return el(
        "section",
        el("h2", "Where in the network: per-layer relative error, every case"),
        el(
            "p",
            "Rollout vs training states at the same positions, per state: the median (solid) "
            "and max (dashed) over positions of the relative error, from each case's sealed "
            "layer figures.",
            class_="muted",
        ),
        figure,
        None if legend is None else el("p", legend, class_="muted"),
        notes,
        id="layers",
    )
