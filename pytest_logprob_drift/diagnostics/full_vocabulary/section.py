"""The report's full-vocabulary view: its case-table columns and its section of a case.

Owns the page's full-vocabulary columns (KL both ways and TV, then the semantic-offset cell in
words; on the page only, not in the report's text, shown when some case carries the parts),
the token ids its section names (which the report decodes) and the section of a detailed case:
KL both ways and TV (mean / p99 / max), truncated supports, the worst positions with their top
tokens, the semantic offset; or why they are unavailable. Built with ``report.markup`` only;
the reductions' names come from ``numerics.text``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pytest_logprob_drift.numerics.comparison import (
    Diagnostics,
    FullVocabulary,
    ReductionStats,
    SemanticOffsetSummary,
    TopToken,
)
from pytest_logprob_drift.numerics.text import REDUCTIONS
from pytest_logprob_drift.report.markup import Child, Markup, el, join
from pytest_logprob_drift.report.summary import fmt_diff

COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("KL(r||t) max", "kl_rollout_training", "max"),
    ("KL(r||t) mean", "kl_rollout_training", "mean"),
    ("KL(t||r) max", "kl_training_rollout", "max"),
    ("KL(t||r) mean", "kl_training_rollout", "mean"),
    ("TV max", "total_variation", "max"),
)
"""``(column title, full_vocabulary summary key, statistic)`` of the full-vocabulary columns."""
OFFSET_HEADER = "semantic offset"
HEADERS = (*(title for title, _, _ in COLUMNS), OFFSET_HEADER)
"""The page's columns: the full-vocabulary ones, then the semantic-offset cell."""
STATISTICS = ("mean", "p99", "max")
WORST_POSITION_HEADERS = (
    *("sample", "position", "TV", "KL(r||t)", "KL(t||r)"),
    "top tokens (logprobs; share of the position's TV)",
)


def has_parts(diagnostics: Iterable[Diagnostics | None]) -> bool:
    """Whether some case carries full-vocabulary or semantic-offset diagnostics."""
    return any(
        d is not None and (d.full_vocabulary is not None or d.semantic_offset is not None)
        for d in diagnostics
    )


def stat_cell(stats: ReductionStats | None, statistic: str) -> tuple[str, float | None]:
    """A statistic of one reduction: its text (``inf`` when infinite somewhere and the
    statistic is the max, ``+ inf at n`` noted otherwise) and its sort value."""
    if stats is None:
        return "-", None
    value = stats.statistic(statistic)
    infinite = stats.infinite
    if statistic == "max" and infinite:
        return f"inf ({infinite} pos.)", float("inf")
    if value is None:
        return ("inf" if infinite else "-"), (float("inf") if infinite else None)
    text = fmt_diff(value)
    return (f"{text} (+inf at {infinite})" if infinite else text), float(value)


def cells(diagnostics: Diagnostics) -> list[tuple[str, float | None]]:
    """``(text, sort value)`` of the full-vocabulary columns, then the semantic-offset cell
    (its explanation when it fires)."""
    full, offset = diagnostics.full_summary, diagnostics.semantic_offset
    if diagnostics.unavailable is not None:
        out: list[tuple[str, float | None]] = [("n/a", None) for _ in COLUMNS]
    else:
        out = [
            stat_cell(None if full is None else full.reduction(key), stat)
            for _, key, stat in COLUMNS
        ]
    if offset is not None and offset.fires:
        out.append((offset.explanation or "fires", None))
    else:
        out.append(("-" if offset is None else "no", None))
    return out


def page_cells(diagnostics: Diagnostics) -> list[tuple[str, float | None, str]]:
    """``(text, sort value, class)`` of ``HEADERS``: the figures numeric, the semantic-offset
    cell in words (no class when it says nothing)."""
    *figures, (words, _) = cells(diagnostics)
    return [
        *((text, value, "n") for text, value in figures),
        (words, None, "words" if words not in ("-", "no") else ""),
    ]


def reduction_rows(full: FullVocabulary) -> list[tuple[str, list[tuple[str, float | None]]]]:
    """Per reduction: its display name and ``STATISTICS`` cells (what a case section shows)."""
    return [
        (name, [stat_cell(full.reduction(key), stat) for stat in STATISTICS])
        for key, name in REDUCTIONS
    ]


def token_ids(diagnostics: Diagnostics) -> tuple[int, ...]:
    """The token ids named at the full-vocabulary worst positions, sorted, distinct."""
    full = diagnostics.full_summary
    if full is None:
        return ()
    return tuple(sorted({t.token_id for w in full.worst_positions for t in w.top_tokens}))


def _td(value: Any, *, num: float | None = None, cls: str = "") -> Markup:
    return el("td", str(value), class_=cls or None, data_v=None if num is None else repr(num))


def _head(headers: Iterable[Child]) -> Markup:
    return el("thead", el("tr", (el("th", h) for h in headers)))


def _number(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:.4g}"


def _stat_td(cell: tuple[str, float | None]) -> Markup:
    text, value = cell
    return _td(text, num=value if value is not None and value != float("inf") else None, cls="n")


def _offset(offset: SemanticOffsetSummary | None) -> Markup | None:
    if offset is None:
        return None
    fires = offset.fires
    explanation = offset.explanation
    return el(
        "p",
        el("b", "Semantic offset:"),
        " ",
        el("span", offset.message, class_="bad" if fires else "muted"),
        [" ", el("span", f"({explanation})", class_="muted")] if explanation else None,
        class_="offset",
    )


def _top_token(token: TopToken, texts: Mapping[int, str]) -> str:
    """A top token's decoded text as the page shows tokens (a line break as a visible
    symbol), its id when the report could not decode it."""
    text = texts.get(token.token_id)
    return (text if text is not None else str(token.token_id)).replace("\n", "\u23ce")


def section(diagnostics: Diagnostics, texts: Mapping[int, str]) -> Markup | None:
    """The full-vocabulary divergence of a detailed case: KL both ways and TV (mean / p99 /
    max), truncated supports, the worst positions with their top tokens, the semantic
    offset; or why they are unavailable; nothing when the case has none. ``texts``: the
    decoded ``token_ids``."""
    full, offset = diagnostics.full_summary, diagnostics.semantic_offset
    if diagnostics.full_vocabulary is None and offset is None:
        return None
    parts: list[Child] = [el("h3", "Full-vocabulary divergence")]
    if diagnostics.unavailable is not None:
        parts.append(el("p", f"unavailable: {diagnostics.unavailable}", class_="muted"))
        return join([*parts, _offset(offset)])
    if full is not None:
        rows = (
            el("tr", _td(name), (_stat_td(c) for c in cells))
            for name, cells in reduction_rows(full)
        )
        parts += [
            el(
                "p",
                f"Over {full.positions} active positions; supports differ "
                f"(truncation) at {full.truncated_positions}.",
            ),
            el("table", _head(["", *STATISTICS]), el("tbody", rows), class_="divergence"),
        ]
    parts.append(_offset(offset))
    worst = () if full is None else full.worst_positions
    if worst:
        body = []
        for w in worst:
            tokens = (
                el(
                    "tr",
                    _td(t.token_id, cls="n"),
                    el("td", el("code", _top_token(t, texts), class_="tok")),
                    _td(_number(t.rollout_logprob), cls="n"),
                    _td(_number(t.training_logprob), cls="n"),
                    _td(_number(t.tv_share), cls="n"),
                )
                for t in w.top_tokens
            )
            body.append(
                el(
                    "tr",
                    _td(w.sample, cls="n"),
                    _td(w.position, cls="n"),
                    _td(_number(w.total_variation), cls="n"),
                    _td(_number(w.kl_rollout_training), cls="n"),
                    _td(_number(w.kl_training_rollout), cls="n"),
                    el(
                        "td",
                        el(
                            "table",
                            _head(["id", "token", "rollout", "training", "TV share"]),
                            el("tbody", tokens),
                            class_="top",
                        ),
                    ),
                )
            )
        parts.append(
            el(
                "table",
                _head(WORST_POSITION_HEADERS),
                el("tbody", body),
                class_="worst-positions",
            )
        )
    return join(parts)
