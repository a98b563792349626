"""The report's plots, drawn with matplotlib's Agg/SVG backends into inline SVG strings.

Owns drawing, from the report's already aggregated data (``model``): the overview of every
case's max/p99/mean |diff|, the attribution chart (one row per intervention: effect on mean
|diff| relative to the baseline with its bootstrap interval on a log axis, and how far each
side moved against the noise floor), drift over the training steps of an imported run
(``steps_svg``), and per case the |diff| histogram on a log axis, |diff| by
response position, and the rollout vs training logprob scatter, each with the contract
threshold where it applies. Every figure is small, uses the browser's own sans-serif font
(``svg.fonttype`` ``none``: text stays text, no font is embedded or fetched; a label from a
run is plain text, never mathtext or TeX; a log axis labels its decades as plain text too,
``10⁻³``, since parsing mathtext for every tick cost more than drawing the figure), a distinct
``svg.hashsalt`` so that ids never collide between the figures of one page, and no date
metadata; the SVG is returned as trusted ``markup.Markup`` (matplotlib escapes the text it
writes). Dense point layers are rasterized into the SVG as an inline PNG. Uses pyplot
nowhere (no global figure state). Knows nothing about files, seals, torch or the page around
the figures.
"""

from __future__ import annotations

import io
import itertools
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
from msgspec import UNSET

from pytest_logprob_drift.attribution.document import Attribution
from pytest_logprob_drift.report.markup import Markup, el
from pytest_logprob_drift.report.model import (
    HIST_BINS_PER_DECADE,
    HIST_LOG10_LOW,
    CaseView,
    FloatArray,
    Histogram,
    PositionProfile,
    Scatter,
)

if TYPE_CHECKING:
    from pytest_logprob_drift.report.steps import StepsView

RASTERIZE_ABOVE = 400
"""Scatter layers with more points than this are embedded as a PNG inside the SVG."""
ATTRIBUTION_MAX_ROWS = 40
COLOURS = {"ok": "#3465a4", "bad": "#cc0000", "threshold": "#cc0000", "band": "#bbbbbb"}
LINE_COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#d62728",
    "#393b79",
    "#637939",
)
_salts = itertools.count()
PLAIN_TEXT: dict[str, Any] = {"parse_math": False}
"""Text properties of every label that comes from a run (case labels): drawn as the plain
text it is, never parsed as mathtext (``$...$``) or TeX."""
_SUPERSCRIPT = str.maketrans(
    "-0123456789", "\u207b\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079"
)


def decade_label(value: float, _position: object = None) -> str:
    """A log axis's tick label: ``10⁻³`` for a decade, in plain Unicode superscripts (no
    mathtext); a value that is not a power of ten (not ticked by ``log_ticks``) as ``%g``."""
    if value <= 0 or not math.isfinite(value):
        return ""
    exponent = round(math.log10(value))
    if not math.isclose(value, 10.0**exponent, rel_tol=1e-9):
        return f"{value:g}"
    return "10" + str(exponent).translate(_SUPERSCRIPT)


def available() -> bool:
    """Whether matplotlib is installed (the ``report`` extra); without it the page has no
    plots and says so."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


@contextmanager
def new_figure(
    width: float,
    height: float,
    ncols: int = 1,
    margins: tuple[float, float] = (0.55, 0.42),
    right: float = 0.12,
    nrows: int = 1,
) -> Iterator[tuple[Any, Any]]:
    """A figure of ``width`` x ``height`` inches; ``margins`` (left, bottom) and ``right`` in
    inches; ``nrows`` rows of axes share their x axis."""
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context(
        {
            "svg.fonttype": "none",
            "svg.hashsalt": f"lpd{next(_salts)}",
            "font.family": "sans-serif",
            "font.size": 7.5,
            "axes.titlesize": 8.5,
            "axes.titley": 1.0,
            "axes.linewidth": 0.6,
            "xtick.major.width": 0.6,
            "ytick.major.width": 0.6,
            "path.simplify": True,
            "text.usetex": False,
        }
    ):
        figure = Figure(figsize=(width, height))
        axes = figure.subplots(nrows, ncols, sharey=ncols > 1, sharex=nrows > 1)
        # Fixed margins (in inches): a layout engine costs more than the drawing itself.
        left = margins[0] / width
        figure.subplots_adjust(
            left=left,
            right=1 - right / width,
            bottom=margins[1] / height,
            top=1 - 0.28 / height,
            wspace=0.08 if ncols > 1 else 0.2,
            hspace=0.12,
        )
        yield figure, axes


def log_ticks(axis: Any) -> None:
    """At most a handful of labelled decades, in plain text, and no minor labels on a log
    axis."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, numticks=6))
    axis.set_major_formatter(FuncFormatter(decade_label))
    axis.set_minor_locator(LogLocator(base=10, subs=(), numticks=1))
    axis.set_minor_formatter(NullFormatter())


def to_svg(figure: Any) -> Markup:
    """The figure as inline SVG: trusted markup (matplotlib's SVG writer escapes every text it
    draws, and the labels are plain text, never mathtext)."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None}, dpi=110)
    text = buffer.getvalue()
    return Markup(text[text.index("<svg") :])


def empty_note(axes: Any, text: str) -> None:
    axes.text(0.5, 0.5, text, transform=axes.transAxes, ha="center", va="center", color="#555")


# --------------------------------------------------------------------------- per case


def histogram_decades(
    histograms: Sequence[Histogram], thresholds: Sequence[float]
) -> tuple[int, int]:
    """The decades ``(low, high)`` all histograms of a page share: every non-empty bin and
    one decade either side of the threshold."""
    low, high = math.inf, -math.inf
    for hist in histograms:
        nonzero = np.nonzero(hist.counts)[0]
        if nonzero.size:
            low = min(low, HIST_LOG10_LOW + nonzero[0] / HIST_BINS_PER_DECADE)
            high = max(high, HIST_LOG10_LOW + (nonzero[-1] + 1) / HIST_BINS_PER_DECADE)
    for threshold in thresholds:
        if threshold > 0:
            low = min(low, math.log10(threshold) - 1)
            high = max(high, math.log10(threshold) + 1)
    if not math.isfinite(low):
        low, high = -9.0, 0.0
    return math.floor(low), math.ceil(high)


def histogram_svg(hist: Histogram, threshold: float, decades: tuple[int, int]) -> Markup:
    low, high = decades
    first = round((low - HIST_LOG10_LOW) * HIST_BINS_PER_DECADE)
    last = round((high - HIST_LOG10_LOW) * HIST_BINS_PER_DECADE)
    first, last = max(first, 0), min(last, hist.counts.size)
    counts = hist.counts[first:last]
    edges = 10.0 ** (HIST_LOG10_LOW + np.arange(first, last + 1) / HIST_BINS_PER_DECADE)
    with new_figure(3.3, 2.3) as (figure, axes):
        axes.stairs(counts, edges, fill=True, color=COLOURS["ok"], alpha=0.85)
        axes.set_xscale("log")
        log_ticks(axes.xaxis)
        axes.set_xlim(10.0**low, 10.0**high)
        axes.axvline(threshold, color=COLOURS["threshold"], linewidth=1.2)
        top = max(int(counts.max()) if counts.size else 0, 1)
        axes.set_ylim(0, top * 1.12)
        axes.text(
            threshold,
            top * 1.06,
            f" threshold {threshold:g}",
            color=COLOURS["threshold"],
            fontsize=6.5,
            va="center",
        )
        if hist.zeros:
            axes.text(
                0.02,
                0.9,
                f"+{hist.zeros} exactly 0",
                transform=axes.transAxes,
                fontsize=6.5,
                color="#555",
            )
        if not counts.any() and not hist.zeros:
            empty_note(axes, "no active tokens")
        elif not counts.any():
            empty_note(axes, "every |diff| is exactly 0")
        axes.set_xlabel("|training - rollout| (nats)")
        axes.set_ylabel("active tokens")
        axes.set_title("|diff| histogram")
        return to_svg(figure)


def _band_edge(edge: FloatArray, floor: float) -> FloatArray:
    """A band's edge on the log axis: at least ``floor`` (a column no sample reaches, NaN,
    too), an infinite |diff| left undrawn (NaN: an axis cannot reach it)."""
    return np.where(np.isinf(edge), np.nan, np.maximum(np.nan_to_num(edge, nan=floor), floor))


def profile_svg(profile: PositionProfile, threshold: float) -> Markup:
    x = profile.starts.astype(np.float64) + (profile.bin_width - 1) / 2
    floor = 1e-12
    with new_figure(3.3, 2.3) as (figure, axes):
        positive = [a[np.isfinite(a) & (a > 0)] for a in (profile.band_high, profile.band_low)]
        has_positive = any(p.size for p in positive)
        if profile.total_samples > profile.samples.size:
            axes.fill_between(
                x,
                _band_edge(profile.band_low, floor),
                _band_edge(profile.band_high, floor),
                color=COLOURS["band"],
                alpha=0.6,
                linewidth=0,
                label=f"range, {profile.total_samples} samples",
            )
            axes.plot(
                x,
                np.where(np.isfinite(profile.median), np.maximum(profile.median, floor), np.nan),
                color="black",
                linewidth=0.9,
                label="median",
            )
        for i, (sample, line) in enumerate(zip(profile.samples, profile.lines, strict=True)):
            axes.plot(
                x,
                np.where(np.isfinite(line), np.maximum(line, floor), np.nan),
                color=LINE_COLOURS[i % len(LINE_COLOURS)],
                linewidth=0.8,
                label=f"sample {int(sample)}" if profile.samples.size <= 6 else None,
            )
        axes.axhline(threshold, color=COLOURS["threshold"], linewidth=1.0, linestyle="--")
        axes.set_yscale("log")
        log_ticks(axes.yaxis)
        if has_positive:
            smallest = min(float(p.min()) for p in positive if p.size)
            largest = max(float(p.max()) for p in positive if p.size)
            axes.set_ylim(max(smallest / 3, floor), max(largest, threshold) * 3)
        else:
            axes.set_ylim(threshold / 1e6, threshold * 10)
            empty_note(axes, "every |diff| is exactly 0")
        axes.set_xlim(0, x[-1] + profile.bin_width / 2 if x.size else 1)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize=5.5, loc="lower right", frameon=False, ncols=2)
        unit = "" if profile.bin_width == 1 else f" (bins of {profile.bin_width})"
        axes.set_xlabel(f"response position{unit}")
        axes.set_ylabel("max |diff| in bin" if profile.bin_width > 1 else "|diff|")
        drawn = profile.samples.size
        axes.set_title(
            f"|diff| by position, {drawn} of {profile.total_samples} samples"
            if drawn < profile.total_samples
            else "|diff| by position, one line per sample"
        )
        return to_svg(figure)


def scatter_svg(data: Scatter, threshold: float) -> Markup:
    with new_figure(3.0, 2.3) as (figure, axes):
        low = high = 0.0
        if data.grid is not None and data.extent is not None:
            low, high = data.extent[0], data.extent[1]
            axes.imshow(
                np.log1p(data.grid),
                origin="lower",
                extent=data.extent,
                cmap="Blues",
                aspect="auto",
                interpolation="nearest",
            )
        elif data.rollout.size:
            drawn = np.concatenate((data.rollout, data.training))
            drawn = drawn[np.isfinite(drawn)]
            low, high = (float(drawn.min()), float(drawn.max())) if drawn.size else (0.0, 0.0)
        if data.rollout.size:
            raster = data.rollout.size > RASTERIZE_ABOVE
            ok = ~data.mismatch
            axes.scatter(
                data.rollout[ok],
                data.training[ok],
                s=3 if data.points else 5,
                color=COLOURS["ok"],
                linewidths=0,
                rasterized=raster,
                label=f"|diff| <= {threshold:g}",
            )
            axes.scatter(
                data.rollout[data.mismatch],
                data.training[data.mismatch],
                s=4 if data.points else 6,
                color=COLOURS["bad"],
                linewidths=0,
                rasterized=raster,
                label="mismatch",
            )
            pad = (high - low) * 0.04 or 0.5
            axes.plot(
                [low - pad, high + pad],
                [low - pad, high + pad],
                color="#888",
                linewidth=0.6,
                linestyle=":",
            )
            axes.set_xlim(low - pad, high + pad)
            axes.set_ylim(low - pad, high + pad)
            axes.legend(fontsize=5.5, loc="upper left", frameon=False, markerscale=2)
        else:
            empty_note(
                axes,
                f"{data.nonfinite} non-finite, nothing to draw"
                if data.total
                else "no active tokens",
            )
        axes.set_xlabel("rollout logprob")
        axes.set_ylabel("training logprob")
        axes.set_title(
            (
                f"logprobs, {data.total} tokens"
                if data.points
                else f"logprobs, 2-D histogram of {data.total}; worst {data.rollout.size} as points"
            )
            + (f"; {data.nonfinite} non-finite not drawn" if data.nonfinite else "")
        )
        return to_svg(figure)


# --------------------------------------------------------------------------- the run


def overview_svg(
    cases: Sequence[CaseView], threshold: float | None, *, in_order: bool = False
) -> Markup | None:
    """Every case's max / p99 / mean |diff|, the largest max |diff| first (``in_order``: in
    the given order, an imported run's steps), each label upright and clear of the next."""
    rows = [c for c in cases if c.diagnostics.statistics is not None]
    if not rows:
        return None
    if not in_order:
        rows.sort(key=lambda c: -float(c.diagnostics.statistic("max_abs_diff") or 0.0))
    x = np.arange(len(rows))
    floor = 1e-12
    values = {
        key: np.maximum(np.array([float(c.diagnostics.statistic(key) or 0.0) for c in rows]), floor)
        for key in ("max_abs_diff", "p99_abs_diff", "mean_abs_diff")
    }
    bad = np.array([c.outcome != "PASS" for c in rows])
    width = min(9.0, max(4.0, 2.5 + 0.1 * len(rows)))
    labelled = len(rows) <= 30
    with new_figure(
        width + 1.0,
        3.2 if labelled else 2.4,
        margins=(0.6, 0.7 if labelled else 0.42),
        right=1.1,
    ) as (figure, axes):
        axes.vlines(x, values["mean_abs_diff"], values["max_abs_diff"], color="#ccc", lw=0.8)
        axes.scatter(x, values["mean_abs_diff"], s=8, marker="_", color="#555", label="mean")
        axes.scatter(x, values["p99_abs_diff"], s=8, marker="x", color="#555", lw=0.7, label="p99")
        axes.scatter(
            x[~bad], values["max_abs_diff"][~bad], s=14, color=COLOURS["ok"], label="max (PASS)"
        )
        axes.scatter(
            x[bad], values["max_abs_diff"][bad], s=14, color=COLOURS["bad"], label="max (other)"
        )
        if threshold:
            axes.axhline(threshold, color=COLOURS["threshold"], linewidth=1.0, linestyle="--")
        axes.set_yscale("log")
        log_ticks(axes.yaxis)
        titled: list[tuple[str, str]] = []
        if labelled:
            axes.set_xticks(
                x,
                [wrap_label(c.label) for c in rows],
                rotation=90,
                ha="right",
                va="center",
                rotation_mode="anchor",
                **PLAIN_TEXT,
            )
            titled = _titled(axes.get_xticklabels(), [c.label for c in rows])
        else:
            axes.set_xlabel(
                f"{len(rows)} steps in order" if in_order else f"{len(rows)} cases, largest first"
            )
        axes.set_ylabel("|diff| (nats)")
        axes.set_title("every case: max, p99 and mean |diff| (dashed: threshold)")
        axes.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        if labelled:
            _spread_labels(figure, axes, axes.get_xticklabels())
            # upright labels run long: room for a browser font a few percent wider
            _fit_labels(figure, axes.get_xticklabels(), pad=0.2)
        return _with_titles(to_svg(figure), titled)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


LABEL_LINE = 24
LABEL_LINES = 3
"""A case label on the overview's x axis: wrapped after a knob separator into at most
``LABEL_LINES`` lines of at most ``LABEL_LINE`` characters (the last ending in an ellipsis
when the label is longer); the full label is the tick's hover text (an SVG ``<title>``)."""
_BREAK_AFTER = ".=,/ "
_BREAK_INSIDE = "_"


def wrap_label(text: str, width: int = LABEL_LINE, lines: int = LABEL_LINES) -> str:
    """``text`` in at most ``lines`` lines of at most ``width`` characters, broken after a
    separator where there is one (a part longer than a line is cut), ellipsized past that."""
    parts: list[str] = []
    current = ""
    for char in text:
        current += char
        if char in _BREAK_AFTER:
            parts.append(current)
            current = ""
    if current:
        parts.append(current)
    parts = [piece for part in parts for piece in _pieces(part, width)]
    out: list[str] = []
    line = ""
    for part in parts:
        while len(part) > width:
            if line:
                out.append(line)
                line = ""
            out.append(part[:width])
            part = part[width:]
        if len(line) + len(part) > width:
            out.append(line)
            line = part
        else:
            line += part
    if line:
        out.append(line)
    if len(out) > lines:
        out = out[:lines]
        out[-1] = out[-1][: width - 1] + "\u2026"
    return "\n".join(out)


def _pieces(part: str, width: int) -> list[str]:
    """A part longer than a line, broken after its underscores."""
    if len(part) <= width:
        return [part]
    pieces, current = [], ""
    for char in part:
        current += char
        if char in _BREAK_INSIDE:
            pieces.append(current)
            current = ""
    return [*pieces, current] if current else pieces


_gids = itertools.count()


def _titled(labels: Sequence[Any], texts: Sequence[str]) -> list[tuple[str, str]]:
    """Give each tick label artist an SVG group id; ``(id, full text)`` for ``_with_titles``."""
    titled = []
    for label, text in zip(labels, texts, strict=True):
        gid = f"lpd-label-{next(_gids)}"
        label.set_gid(gid)
        titled.append((gid, text))
    return titled


def _with_titles(svg: Markup, titled: Sequence[tuple[str, str]]) -> Markup:
    """The SVG with each titled group's full text as its first child (``<title>``: the text a
    browser shows on hover), escaped by the element builder."""
    text = str(svg)
    for gid, full in titled:
        opening = f'<g id="{gid}">'
        text = text.replace(opening, opening + str(el("title", full)), 1)
    return Markup(text)


def _spread_labels(figure: Any, axes: Any, labels: Sequence[Any], gap: float = 0.05) -> None:
    """Widen the axes (and the figure by as much, its margins kept) until the tick labels,
    measured as drawn, are at least ``gap`` inches apart: no label overlaps the next."""
    figure.draw_without_rendering()
    widths = [label.get_window_extent().width for label in labels if label.get_text()]
    if not widths:
        return
    need = max(widths) / figure.dpi + gap
    low, high = axes.get_xlim()
    width, height = figure.get_size_inches()
    p = figure.subplotpars
    axes_width = (p.right - p.left) * width
    if axes_width / (high - low) >= need:
        return
    grow = need * (high - low) - axes_width
    left, right = p.left * width, (1 - p.right) * width
    width += grow
    figure.set_size_inches(width, height)
    figure.subplots_adjust(left=left / width, right=1 - right / width)


def _fit_labels(figure: Any, labels: Sequence[Any], pad: float = 0.06) -> None:
    """Grow the figure's left and bottom margins (keeping the axes' size) until every label
    lies inside it: measured from the drawn text, never clipped by the SVG's viewport."""
    figure.draw_without_rendering()
    dpi = figure.dpi
    boxes = [label.get_window_extent() for label in labels if label.get_text()]
    if not boxes:
        return
    left = max(0.0, pad - min(b.x0 for b in boxes) / dpi)
    bottom = max(0.0, pad - min(b.y0 for b in boxes) / dpi)
    if left == 0.0 and bottom == 0.0:
        return
    width, height = figure.get_size_inches()
    p = figure.subplotpars
    margins = (p.left * width, (1 - p.right) * width, p.bottom * height, (1 - p.top) * height)
    width, height = width + left, height + bottom
    figure.set_size_inches(width, height)
    figure.subplots_adjust(
        left=(margins[0] + left) / width,
        right=1 - margins[1] / width,
        bottom=(margins[2] + bottom) / height,
        top=1 - margins[3] / height,
    )


def attribution_svg(document: Attribution) -> Markup | None:
    """One row per intervention in ranking order: the effect on mean |diff| relative to the
    baseline with its bootstrap interval (log axis), and each side's movement."""
    entries = document.ranked()[:ATTRIBUTION_MAX_ROWS]
    if not entries:
        return None
    labels = [entry.label for entry in entries]
    y = np.arange(len(entries))[::-1].astype(np.float64)
    floor = 1e-12
    height = 0.9 + 0.24 * len(entries)
    with new_figure(8.5, height, ncols=2, margins=(2.3, 0.45)) as (figure, (effect, moved)):
        ratios = [e.effect.mean_ratio for e in entries]
        finite = [v for r in ratios for v in (r.value, r.low, r.high) if v is not None and v > 0]
        lo = min([*finite, 0.5]) / 2
        hi = max([*finite, 2.0]) * 2
        for yy, ratio, entry in zip(y, ratios, entries, strict=True):
            value = ratio.value
            if value is None:
                effect.text(lo * 1.2, yy, "n/a (baseline drift is 0)", va="center", fontsize=6)
                continue
            colour = (
                COLOURS["bad"]
                if ratio.excludes_one and value > 1
                else ("#4e9a06" if ratio.excludes_one else "#777")
            )
            low, high = ratio.low, ratio.high
            if low is not None and high is not None:
                effect.plot(
                    [max(low, floor), max(high, floor)],
                    [yy, yy],
                    color=colour,
                    linewidth=2.2,
                    solid_capstyle="butt",
                    alpha=0.55,
                )
            effect.plot([max(value, floor)], [yy], "o", color=colour, markersize=4)
            p99_ratio = entry.effect.p99_ratio
            p99 = None if p99_ratio is UNSET else p99_ratio.value
            if p99 is not None and p99 > 0:
                effect.plot([p99], [yy], "d", mfc="none", color=colour, markersize=4, mew=0.8)
        effect.axvline(1.0, color="black", linewidth=0.8)
        effect.set_xscale("log")
        log_ticks(effect.xaxis)
        effect.set_xlim(lo, hi)
        effect.set_yticks(y, [_short(label, 34) for label in labels], **PLAIN_TEXT)
        titled = _titled(effect.get_yticklabels(), labels)
        effect.set_xlabel("mean |diff| relative to the baseline (95% bootstrap interval)")
        effect.set_title("effect on mean |diff| (\u25ca: p99); red: interval above 1")
        sides = (("rollout", COLOURS["ok"], 0.18), ("training", "#f57900", -0.18))
        deltas = []
        for side, colour, offset in sides:
            values = np.array([getattr(e, side).max_abs_delta for e in entries], dtype=np.float64)
            deltas.extend(values[values > 0].tolist())
            moved.barh(
                y + offset,
                np.maximum(values, floor),
                height=0.34,
                color=colour,
                label=side,
                left=floor,
            )
        noise = document.noise_floor
        levels = {"rollout": noise.rollout_max_abs_delta, "training": noise.training_max_abs_delta}
        for side, colour, _ in sides:
            level = levels[side]
            if noise.measured and level > 0:
                moved.axvline(level, color=colour, linestyle="--", linewidth=0.8)
                deltas.append(float(level))
        moved.set_xscale("log")
        log_ticks(moved.xaxis)
        moved.set_xlim(min([*deltas, 1e-6]) / 3, max([*deltas, 1e-3]) * 3)
        moved.set_xlabel("max |logprob change| vs baseline, shared tokens")
        moved.set_title("which side moved (dashed: noise floor)")
        moved.legend(fontsize=6, loc="lower right", frameon=False)
        _fit_labels(figure, effect.get_yticklabels())
        return _with_titles(to_svg(figure), titled)


# --------------------------------------------------------------------------- training steps

STEP_LINE_COLOURS = {
    "mismatch_share": "#cc0000",
    "max_abs_diff": "#1f77b4",
    "p99_abs_diff": "#6baed6",
    "ess": "#2ca02c",
    "tis_cap_2": "#ff7f0e",
    "icepop": "#9467bd",
    "seq_mask_tis": "#8c564b",
}


def steps_svg(view: StepsView) -> Markup | None:
    """Drift over training steps, one line per figure (``report.steps.FIGURES``): steps on
    x; above, max and p99 |diff| on a log axis with the contract threshold dashed; below, the
    mismatch share, the token ESS and the shares TIS cap 2, IcePop and seq-mask-tis would clip
    (0 to 1); the first MISMATCH step dotted on both. A step without figures is a gap."""
    if not view.rows:
        return None
    from pytest_logprob_drift.report.steps import FIGURES

    steps = np.array([r.step for r in view.rows], dtype=np.float64)

    def series(key: str) -> np.ndarray[Any, Any]:
        return np.array(
            [np.nan if r.values.get(key) is None else float(r.values[key]) for r in view.rows]  # type: ignore[arg-type]
        )

    width = min(9.0, max(5.0, 3.0 + 0.08 * len(view.rows)))
    marker = "o" if len(view.rows) <= 40 else None
    with new_figure(width + 1.6, 4.2, margins=(0.65, 0.45), right=1.9, nrows=2) as (
        figure,
        (top, bottom),
    ):
        floor = 1e-12
        for figure_def in FIGURES:
            values = series(figure_def.key)
            colour = STEP_LINE_COLOURS[figure_def.key]
            axes = top if figure_def.kind == "diff" else bottom
            if figure_def.kind == "diff":
                values = np.where(np.isnan(values), np.nan, np.maximum(values, floor))
            axes.plot(
                steps, values, color=colour, lw=1.1, marker=marker, ms=2.5, label=figure_def.name
            )
        top.axhline(view.threshold or floor, color=COLOURS["threshold"], lw=1.0, ls="--",
                    label=f"threshold {view.threshold:g}")  # fmt: skip
        top.set_yscale("log")
        log_ticks(top.yaxis)
        top.set_ylabel("|diff| (nats)")
        bottom.set_ylim(-0.03, 1.03)
        bottom.set_ylabel("share / ESS")
        bottom.set_xlabel("training step")
        first = view.first_mismatch
        if first is not None:
            for axes in (top, bottom):
                axes.axvline(first, color="#555", lw=0.8, ls=":")
        top.set_title(
            "drift over training steps"
            + ("" if first is None else f" (dotted: first MISMATCH, step {first})")
        )
        for axes in (top, bottom):
            axes.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        return to_svg(figure)
