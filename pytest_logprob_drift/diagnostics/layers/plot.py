"""The report's view of where in the network the sides part (opt-in ``diagnostics.layers``).

Owns, for one case whose two layer captures are sealed: the plot data read from the sealed
reductions (``layers_training.pt``, ``layers_rollout.pt``, digest checked by the store's
loader): the rollout-vs-training relative error per state and captured position
(``numerics.layer_reduction.relative_errors``), and its two figures: a state x position
heatmap on a log colour scale fixed for every case (``HEAT_LOW`` .. ``HEAT_HIGH``, shared with
the run-level plot of ``run_plot``; a bitwise equal state drawn at the low end, a
relative error above the range at the high end), and the per-state median and max over
positions on the same range. Drawn with ``report.plots``' figure set-up (Agg,
SVG, plain-text labels). Knows nothing about the page around the figures or how the states
were captured.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pytest_logprob_drift.check.resume import load_sealed_tensors
from pytest_logprob_drift.diagnostics.layers.run_plot import HEAT_HIGH as HEAT_HIGH
from pytest_logprob_drift.diagnostics.layers.run_plot import HEAT_LOW as HEAT_LOW
from pytest_logprob_drift.diagnostics.layers.run_plot import drawn
from pytest_logprob_drift.diagnostics.layers.run_plot import state_tick as _label
from pytest_logprob_drift.numerics.comparison import LayerDiagnostics
from pytest_logprob_drift.numerics.layer_reduction import relative_errors, state_names
from pytest_logprob_drift.report.markup import Markup
from pytest_logprob_drift.report.plots import LINE_COLOURS, log_ticks, new_figure, to_svg
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.attempt import Seal


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerPlot:
    """One case's rollout-vs-training relative errors, ``[states, positions]`` float64."""

    states: tuple[str, ...]
    errors: np.ndarray


def load_layer_plot(
    directory: Path, seal: Seal, layers: LayerDiagnostics | None
) -> LayerPlot | None:
    """The plot data of a sealed attempt, or None without both sealed captures."""
    if layers is None or not all(name in seal.files for name in layout.LAYER_FILES):
        return None
    training = load_sealed_tensors(directory, layout.LAYERS_TRAINING, seal)
    rollout = load_sealed_tensors(directory, layout.LAYERS_ROLLOUT, seal)
    errors = relative_errors(training, rollout).numpy()
    return LayerPlot(states=state_names(errors.shape[0] - 3), errors=errors)


def heatmap_svg(plot: LayerPlot) -> Markup:
    """State x captured position, log colour scale ``HEAT_LOW`` .. ``HEAT_HIGH``."""
    from matplotlib.colors import LogNorm

    with new_figure(3.6, 2.6, right=0.9) as (figure, axes):
        shown = np.clip(plot.errors, HEAT_LOW, HEAT_HIGH)
        image = axes.imshow(
            shown,
            aspect="auto",
            interpolation="nearest",
            norm=LogNorm(vmin=HEAT_LOW, vmax=HEAT_HIGH),
            cmap="viridis",
        )
        axes.set_yticks(range(len(plot.states)), [_label(s) for s in plot.states], fontsize=5)
        axes.set_xlabel("captured position (row-major)")
        axes.set_title("rollout vs training: relative error by layer")
        bar = figure.colorbar(image, ax=axes, fraction=0.08, pad=0.02)
        bar.ax.tick_params(labelsize=5)
        return to_svg(figure)


def by_state_svg(plot: LayerPlot) -> Markup:
    """Per state: median and max relative error over positions, drawn within ``HEAT_LOW`` ..
    ``HEAT_HIGH`` as the heatmap is (``run_plot.drawn``)."""
    with new_figure(3.6, 2.3) as (figure, axes):
        x = np.arange(len(plot.states))
        for i, (name, values) in enumerate(
            (("median", np.median(plot.errors, axis=1)), ("max", plot.errors.max(axis=1)))
        ):
            axes.plot(
                x,
                drawn(values),
                color=LINE_COLOURS[i],
                marker="o",
                markersize=2,
                linewidth=1.0,
                label=name,
            )
        axes.set_yscale("log")
        log_ticks(axes.yaxis)
        axes.set_xticks(x, [_label(s) for s in plot.states], fontsize=5)
        axes.legend(fontsize=5.5, loc="upper left", frameon=False)
        axes.set_ylabel(f"relative error (0 drawn at {HEAT_LOW:g})")
        axes.set_title("median and max over positions, per state")
        return to_svg(figure)
