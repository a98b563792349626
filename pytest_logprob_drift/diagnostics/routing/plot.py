"""The report's run-level view of MoE routing (opt-in ``diagnostics.routing``): one plot and
the lines under it.

Owns, from the sealed ``comparison.json`` figures of every case with routing diagnostics
(``numerics.comparison.RoutingFigures``, already read and checked by the report's loader; no
tensor is read, so nothing here needs torch): the figure (MoE layer on x, the share of tokens
whose expert set is the same on both sides on y, one line per case in its colour, a legend by
case label) and, per case, the text lines (``diagnostics.routing.views``: agreement by layer, the
share with a flip, the drift split, the worst tokens with where they flipped). Drawn with
``report.plots``' figure set-up (Agg, SVG); case labels are plain text. Knows nothing about the
page around the figure, files or how the routing was captured.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from pytest_logprob_drift.diagnostics.routing import views
from pytest_logprob_drift.report.markup import Markup
from pytest_logprob_drift.report.model import CaseView
from pytest_logprob_drift.report.plots import LINE_COLOURS, new_figure, to_svg, wrap_label

LEGEND_MAX: Final = 12
AGREEMENT_GID: Final = "routing-agreement-{}"


def routed_cases(cases: Sequence[CaseView]) -> list[CaseView]:
    """The cases whose comparison holds routing diagnostics."""
    return [v for v in cases if v.diagnostics.routing is not None]


def agreement_svg(cases: Sequence[CaseView]) -> Markup | None:
    """Agreement by MoE layer, one line per case with figures; None: no case to draw."""
    drawn = [
        (v, f)
        for v in routed_cases(cases)
        if (routing := v.diagnostics.routing) is not None and (f := routing.figures) is not None
    ]
    if not drawn:
        return None
    layers = max(len(f.agreement_by_layer) for _, f in drawn)
    with new_figure(max(4.2, 2.0 + 0.3 * layers) + 2.0, 2.8, right=2.1) as (figure, axes):
        named: list[Any] = []
        for i, (_view, figures) in enumerate(drawn):
            values = [np.nan if a is None else 100.0 * a for a in figures.agreement_by_layer]
            (line,) = axes.plot(
                np.arange(len(values)),
                values,
                color=LINE_COLOURS[i % len(LINE_COLOURS)],
                linewidth=1.0,
                marker="o",
                markersize=3,
            )
            line.set_gid(AGREEMENT_GID.format(i))
            if i < LEGEND_MAX:
                named.append(line)
        axes.set_xticks(np.arange(layers), [str(k) for k in range(layers)])
        axes.set_xlabel("MoE layer")
        axes.set_ylabel("tokens with the same experts (%)")
        axes.set_ylim(min(90.0, axes.get_ylim()[0]), 100.5)
        axes.set_title("routing agreement by layer, rollout vs training, every case")
        axes.legend(
            named,
            [wrap_label(v.label, 28, 2) for v, _ in drawn[:LEGEND_MAX]],
            fontsize=5.5,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            frameon=False,
        )
        return to_svg(figure)


def case_lines(cases: Sequence[CaseView]) -> list[str]:
    """``label: line`` for every routing line of every case with routing diagnostics."""
    return [
        f"{v.label}: {line}" for v in routed_cases(cases) for line in views.lines(v.diagnostics)
    ]
