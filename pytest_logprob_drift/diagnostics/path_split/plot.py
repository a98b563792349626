"""The report's view of where the drift enters (opt-in ``diagnostics.replay``).

Owns, for one case whose prefill replay is sealed: the plot data read from the sealed
tensors (``score_rollout.pt``, ``score_rollout_prefill.pt``, ``score_training.pt``, digest
checked by the store's loader) and its two figures: the three |diff| distributions
(|decode - prefill|, |prefill - training|, |decode - training|) as step histograms on one log
axis, and, per response position, the largest |decode - prefill| over samples against the
largest |prefill - training|. A pair that comparison.json marks incomparable is not drawn.
Drawn with ``report.plots``' figure set-up (Agg, SVG, plain-text labels). Knows nothing about
the page around the figures or how the replay was computed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pytest_logprob_drift.check.resume import load_sealed_tensors
from pytest_logprob_drift.numerics.comparison import PathSplit
from pytest_logprob_drift.report.markup import Markup
from pytest_logprob_drift.report.plots import (
    LINE_COLOURS,
    empty_note,
    log_ticks,
    new_figure,
    to_svg,
)
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.attempt import Seal

LOG10_LOW, LOG10_HIGH, PER_DECADE = -12, 1, 8
"""The histograms' shared bins: ``PER_DECADE`` per decade from 1e-12 to 10 nats."""
PAIRS = (
    ("decode_prefill", "|decode - prefill| (rollout engine)"),
    ("prefill_training", "|prefill - training| (across engines)"),
    ("decode_training", "|decode - training| (the verdict's pair)"),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PathSplitPlot:
    """One case's split, aggregated for drawing."""

    counts: Mapping[str, np.ndarray]
    """Per drawn pair: active tokens per log bin (below 1e-12 not counted)."""
    zeros: Mapping[str, int]
    """Per drawn pair: active tokens where the two are exactly equal."""
    by_position: Mapping[str, np.ndarray]
    """``decode_prefill`` / ``prefill_training``: per response position, the max over samples
    (NaN where no sample is active)."""


def _edges() -> np.ndarray:
    return np.asarray(
        10.0 ** (LOG10_LOW + np.arange((LOG10_HIGH - LOG10_LOW) * PER_DECADE + 1) / PER_DECADE)
    )


def plot_data(
    rollout: Mapping[str, torch.Tensor],
    prefill: torch.Tensor,
    training: torch.Tensor,
    split: PathSplit,
) -> PathSplitPlot:
    """The plot data of one case (see ``PathSplitPlot``), in float64."""
    active = rollout["active_mask"].bool()
    d, p, t = rollout["logprobs"].double(), prefill.double(), training.double()
    grids = {"decode_prefill": d - p, "prefill_training": p - t, "decode_training": d - t}
    counts, zeros, by_position = {}, {}, {}
    starts = rollout["prompt_lengths"].long()
    width = int((active.sum(-1)).max()) if active.numel() else 0
    for pair, grid in grids.items():
        if not split.comparable.get(pair, False):
            continue
        values = grid.abs()[active].numpy()
        counts[pair] = np.histogram(values, bins=_edges())[0]
        zeros[pair] = int((values == 0).sum())
        if pair == "decode_training":
            continue
        line = np.full(width, np.nan)
        for row in range(active.shape[0]):
            offsets = active[row].nonzero().flatten() - starts[row]
            row_values = grid.abs()[row][active[row]].numpy()
            for offset, value in zip(offsets.tolist(), row_values, strict=True):
                line[offset] = value if np.isnan(line[offset]) else max(line[offset], value)
        by_position[pair] = line
    return PathSplitPlot(counts=counts, zeros=zeros, by_position=by_position)


def load_plot(directory: Path, seal: Seal, split: PathSplit | None) -> PathSplitPlot | None:
    """The plot data of a sealed attempt, or None without a sealed prefill replay."""
    if split is None or layout.SCORE_ROLLOUT_PREFILL not in seal.files:
        return None
    rollout = load_sealed_tensors(directory, layout.SCORE_ROLLOUT, seal)
    prefill = load_sealed_tensors(directory, layout.SCORE_ROLLOUT_PREFILL, seal)["logprobs"]
    training = load_sealed_tensors(directory, layout.SCORE_TRAINING, seal)["logprobs"]
    return plot_data(rollout, prefill, training, split)


def distributions_svg(plot: PathSplitPlot) -> Markup:
    """The three |diff| distributions on one log axis."""
    edges = _edges()
    with new_figure(3.6, 2.3) as (figure, axes):
        drawn = False
        for i, (pair, name) in enumerate(PAIRS):
            if pair not in plot.counts:
                continue
            zeros = plot.zeros[pair]
            axes.stairs(
                plot.counts[pair],
                edges,
                color=LINE_COLOURS[i],
                linewidth=1.1,
                linestyle=("-", "--", ":")[i],
                label=f"{name}; {zeros} exactly 0" if zeros else name,
            )
            drawn = drawn or bool(plot.counts[pair].any())
        axes.set_xscale("log")
        log_ticks(axes.xaxis)
        if not drawn:
            empty_note(axes, "every difference is exactly 0")
        axes.legend(fontsize=5.5, loc="upper left", frameon=False)
        axes.set_xlabel("|difference| (nats)")
        axes.set_ylabel("active tokens")
        axes.set_title("where the drift enters: decode vs prefill")
        return to_svg(figure)


def by_position_svg(plot: PathSplitPlot) -> Markup:
    """Per response position: max |decode - prefill| against max |prefill - training|."""
    floor = 1e-12
    with new_figure(3.6, 2.3) as (figure, axes):
        drawn = False
        for i, (pair, name) in enumerate(PAIRS[:2]):
            line = plot.by_position.get(pair)
            if line is None:
                continue
            positive = np.where(np.isfinite(line), np.maximum(line, floor), np.nan)
            axes.plot(
                np.arange(line.size),
                positive,
                color=LINE_COLOURS[i],
                linewidth=1.0,
                marker="o",
                markersize=2,
                label=name,
            )
            drawn = drawn or bool(np.nanmax(line, initial=0.0) > 0)
        axes.set_yscale("log")
        log_ticks(axes.yaxis)
        if not drawn:
            empty_note(axes, "every difference is exactly 0")
        axes.legend(fontsize=5.5, loc="lower right", frameon=False)
        axes.set_xlabel("response position")
        axes.set_ylabel("max over samples (0 drawn at 1e-12)")
        axes.set_title("decode-vs-prefill against prefill-vs-training")
        return to_svg(figure)
