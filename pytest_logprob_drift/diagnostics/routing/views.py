"""Plain-text rendering of a comparison's routing diagnostics (``diagnostics.routing``).

Owns how the CLI run output, the plugin's failure text and the report's text show where the
two sides' MoE routers chose different experts (``numerics.comparison.RoutingDiagnostics``;
captured by ``execute.routing``, checked by ``diagnostics.routing.check``): two run-table cells (the
lowest per-layer agreement and the share of tokens with a flip), a line per case (agreement by
layer, the flip share, the drift split by flip / no flip / unknown, the worst tokens with where
they flipped, each side's status when it did not capture). Knows nothing about torch, files or
how the numbers were computed; a comparison without routing diagnostics renders as nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from pytest_logprob_drift.numerics.comparison import (
    Diagnostics,
    RoutingDiagnostics,
    RoutingDriftClass,
    RoutingWorstToken,
)


def _routing(diagnostics: Diagnostics | None) -> RoutingDiagnostics | None:
    return None if diagnostics is None else diagnostics.routing


HEADERS: Final = ("routing agree (min layer)", "tokens flipped")
"""The run table's routing columns (shown only when some case has routing diagnostics)."""


def has_routing(diagnostics: Iterable[Diagnostics | None]) -> bool:
    """Whether some case's diagnostics hold routing diagnostics."""
    return any(_routing(d) is not None for d in diagnostics)


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def cells(diagnostics: Diagnostics | None) -> list[str]:
    """The two table cells: the lowest agreement over the MoE layers (with its layer) and the
    share of compared tokens with a flip; ``n/a`` when a side did not capture; empty without
    routing diagnostics."""
    routing = _routing(diagnostics)
    if routing is None:
        return ["", ""]
    figures = routing.figures
    if figures is None:
        return ["n/a", "n/a"]
    known = [(a, k) for k, a in enumerate(figures.agreement_by_layer) if a is not None]
    if not known:
        return ["n/a", _share(figures.flip_share)]
    lowest, layer = min(known)
    return [f"{lowest:.1%} (layer {layer})", _share(figures.flip_share)]


def _drift(name: str, part: RoutingDriftClass) -> str:
    if part.tokens == 0:
        return f"{name} 0 tokens"
    assert part.mismatch_share is not None and part.max_abs_diff is not None
    return (
        f"{name} {part.tokens} tokens ({part.mismatch_share:.0%} over the threshold, "
        f"max |diff| {part.max_abs_diff:.3g})"
    )


def worst_words(token: RoutingWorstToken) -> str:
    """``row 2 pos 19 |diff| 0.0912: flipped at pos 18 layer 0`` and the like."""
    where = f"row {token.row} pos {token.position} |diff| {token.abs_diff:.3g}"
    if token.routing == "flip":
        return f"{where}: flipped at pos {token.first_flip_position} layer {token.first_flip_layer}"
    if token.routing == "unknown":
        return f"{where}: a position before it was not routed by one side"
    return f"{where}: no flip before it"


def lines(diagnostics: Diagnostics | None) -> list[str]:
    """The routing line(s)."""
    routing = _routing(diagnostics)
    if routing is None:
        return []
    out: list[str] = []
    figures = routing.figures
    if figures is not None:
        by_layer = ", ".join(
            f"layer {k} {_share(a)}" for k, a in enumerate(figures.agreement_by_layer)
        )
        drift = figures.drift
        out.append(
            f"routing: {figures.positions_compared} tokens routed by both sides; same experts "
            f"{by_layer}; {_share(figures.flip_share)} with a flip; drift: "
            + "; ".join(
                _drift(n, p)
                for n, p in (
                    ("after a flip", drift.flip),
                    ("no flip", drift.no_flip),
                    ("unknown", drift.unknown),
                )
            )
        )
        if figures.worst:
            out.append("routing worst: " + "; ".join(worst_words(t) for t in figures.worst[:3]))
    for side, status in (("training", routing.training), ("rollout", routing.rollout)):
        if not status.captured:
            out.append(f"routing ({side}): {status.status} ({status.reason})")
    return out
