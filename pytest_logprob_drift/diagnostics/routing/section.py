"""The report's routing section: the agreement of every case on one plot, and their lines.

Owns the page's ``routing`` section (its heading, what the figure shows, the figure drawn by
``plot`` when plots are drawn, and each case's routing lines); nothing without a case with
routing diagnostics. Knows nothing about files or how the routing was captured.
"""

from __future__ import annotations

from pytest_logprob_drift.report.markup import Markup, el
from pytest_logprob_drift.report.model import ReportData


def section(data: ReportData, draw: bool) -> Markup | None:
    """Routing agreement by MoE layer of every case with routing diagnostics on one plot, and
    each case's routing lines (worst tokens with where they flipped); nothing without any."""
    from pytest_logprob_drift.diagnostics.routing import plot  # numpy, matplotlib when drawn

    if not plot.routed_cases(data.cases):
        return None
    svg = plot.agreement_svg(data.cases) if draw else None
    figure = None if svg is None else el("figure", svg, class_="plot wide", data_plot="routing")
    return el(
        "section",
        el("h2", "Mixture of experts: routing agreement by layer, every case"),
        el(
            "p",
            "Per MoE layer, the share of tokens both sides routed whose expert set is the same "
            "(the rollout's as it generated, the trainer's teacher-forced), from each case's "
            "sealed routing figures.",
            class_="muted",
        ),
        figure,
        (el("p", line, class_="muted") for line in plot.case_lines(data.cases)),
        id="routing",
    )
