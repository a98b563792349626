"""The report's importance-sampling view: what each peer's correction would do to a case.

Owns the case table's importance-sampling columns (the normalized ESS and verl's TIS
clipped-token fraction at cap 2), the per-case panel "what your correction would do" (each
peer correction with its framework, the flag a user sets, its band and the fraction it would
clip, drop or mask), the report text's lines, and supplying the figures at read time for a
shown attempt sealed before they existed (from its sealed token_diffs.pt, never by executing
anything; torch is imported only then, so rendering stays torch-free). Built with
``report.markup`` only; the names come from ``numerics.peer_corrections`` and the wording from
``numerics.importance_text``.
"""

from __future__ import annotations

from pathlib import Path

from pytest_logprob_drift.numerics import importance_text
from pytest_logprob_drift.numerics.comparison import Comparison, Diagnostics
from pytest_logprob_drift.numerics.peer_corrections import PEER_CORRECTIONS
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.report.markup import Markup, el
from pytest_logprob_drift.store import layout

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from pytest_logprob_drift.store.attempt import Seal

HEADERS = (importance_text.ESS_HEADER, "verl TIS cap 2 clipped")
"""The case table's columns (the HTML page's and the report text's)."""

PANEL_HEADERS = ("framework", "flag", "keeps", "measures", "fraction affected")


def with_read_time_figures(comparison: Comparison, directory: Path, seal: Seal) -> Comparison:
    """``comparison`` with its figures: the sealed part, or (sealed before the part existed)
    the part computed now from the attempt's sealed token_diffs.pt. A SealError when
    token_diffs.pt does not verify or cannot give them."""
    if (
        comparison.diagnostics.importance_sampling is not None
        or comparison.outcome not in (Outcome.PASS, Outcome.MISMATCH)
        or layout.TOKEN_DIFFS not in seal.files
    ):
        return comparison
    # torch only here: rendering the page imports none (the loader has torch already)
    from pytest_logprob_drift.store.importance_check import figures_of_diffs, with_figures
    from pytest_logprob_drift.store.resume import load_sealed_tensors

    diffs = load_sealed_tensors(directory, layout.TOKEN_DIFFS, seal)
    return with_figures(comparison, figures_of_diffs(diffs))


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
