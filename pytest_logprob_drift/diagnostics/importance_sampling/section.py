"""The report's importance-sampling view: what each peer's correction would do to a case.

Owns the case table's importance-sampling columns (the normalized ESS and verl's TIS
clipped-token fraction at cap 2), the per-case panel "what your correction would do" (each
peer correction with its framework, the flag a user sets, its band and the fraction it would
clip, drop or mask) and the report text's lines (the figures of an attempt sealed before they
existed come from the check ``check.verify`` runs, from its sealed token_diffs.pt), shown
through the diagnostic (``diagnostic``). Built with ``report.markup`` only; the names come
from ``numerics.peer_corrections`` and the wording from ``numerics.importance_text``.
"""

from __future__ import annotations

from pytest_logprob_drift.numerics import importance_text
from pytest_logprob_drift.numerics.comparison import Diagnostics
from pytest_logprob_drift.numerics.peer_corrections import PEER_CORRECTIONS
from pytest_logprob_drift.report.markup import Markup, el

HEADERS = (importance_text.ESS_HEADER, "verl TIS cap 2 clipped")
"""The case table's columns (the HTML page's and the report text's)."""

PANEL_HEADERS = ("framework", "flag", "keeps", "measures", "fraction affected")


def cells(diagnostics: Diagnostics) -> list[tuple[str, float | None]]:
    """``(text, sort value)`` of the case table's two columns."""
    figures = diagnostics.importance_sampling
    if figures is None:
        return [("-", None), ("-", None)]
    clipped = figures.correction(importance_text.TOKEN_HEADLINE)
    return [
        (importance_text.ess_text(figures.ess), figures.ess),
        (importance_text.percent(clipped), clipped),
    ]


def text_cells(diagnostics: Diagnostics) -> list[str]:
    """The report text's two cells."""
    return [text for text, _ in cells(diagnostics)]


def panel(diagnostics: Diagnostics) -> Markup | None:
    """The per-case panel "what your correction would do"; None without the figures."""
    figures = diagnostics.importance_sampling
    if figures is None:
        return None
    rows = [
        el(
            "tr",
            el("td", p.framework),
            el("td", el("code", p.flag)),
            el("td", importance_text.band(p)),
            el("td", p.measures, class_="words"),
            el(
                "td",
                importance_text.percent(fraction),
                class_="n",
                data_v=repr(fraction),
            ),
            data_correction=p.key,
        )
        for p in PEER_CORRECTIONS
        if (fraction := figures.correction(p.key)) is not None
    ]
    return el(
        "section",
        el("h3", "What your correction would do"),
        el(
            "p",
            f"Over {figures.active_tokens} active tokens in {figures.sequences} sequences, "
            f"with weights w = exp(training - rollout) per token, not clamped: normalized ESS "
            f"{importance_text.ess_text(figures.ess)} (verl's, weights clamped to "
            f"[{figures.verl_clamp[0]:g}, {figures.verl_clamp[1]:g}]: "
            f"{importance_text.ess_text(figures.ess_verl_clamped)}); sequence-level ESS "
            f"{importance_text.ess_text(figures.ess_sequence)}; token chi2 "
            f"{importance_text.number(figures.chi2_token)}. Never a verdict.",
            class_="muted",
        ),
        el(
            "table",
            el("thead", el("tr", (el("th", h) for h in PANEL_HEADERS))),
            el("tbody", rows),
            class_="importance",
        ),
        class_="importance",
    )
