"""The layers diagnostic's plain-text views of its part (``diagnostics.layers``).

Owns how the CLI run output, the plugin's failure text and junit properties show where in the
network the two sides' states part (``numerics.comparison.LayerDiagnostics``; written by
``execute.layers``, checked by ``diagnostics.layers.check``): two run-table cells (the first state
where the sides stop being bitwise equal, in words, and the max relative error at the logits),
a line per case (the first state where the rollout's states stop being bitwise equal to the
training's, the max relative error at the embeddings, the last decoder layer, the final norm and
the logits, each side's status when it did not capture) and ``drift_layers_*`` properties.
The states' words are ``numerics.layer_states``' (shared with the attribution's text).
Knows nothing about torch, files or how the numbers were computed; a comparison without layer
diagnostics renders as nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from pytest_logprob_drift.numerics.comparison import Diagnostics, LayerDiagnostics
from pytest_logprob_drift.numerics.layer_states import LOGITS, state_words


def _layers(diagnostics: Diagnostics | None) -> LayerDiagnostics | None:
    return None if diagnostics is None else diagnostics.layers


def _at(state: str) -> str:
    """A state after "at": ``layer 3``, ``the embeddings``, ``the logits``."""
    words = state_words(state)
    return words if state.isdigit() and state != "0" else f"the {words}"


HEADERS: Final = ("layers differ at", "max rel (logits)")
"""The run table's layer columns (shown only when some case has layer diagnostics)."""


def has_layers(diagnostics: Iterable[Diagnostics | None]) -> bool:
    """Whether some case's diagnostics hold layer diagnostics."""
    return any(_layers(d) is not None for d in diagnostics)


def cells(diagnostics: Diagnostics | None) -> list[str]:
    """The two table cells: the first state where rollout and training stop being bitwise
    equal in words (``-``: equal at every state) and the logits' max relative error; ``n/a``
    when a side did not capture; empty without layer diagnostics."""
    layers = _layers(diagnostics)
    if layers is None:
        return ["", ""]
    figures = layers.figures
    if figures is None:
        return ["n/a", "n/a"]
    first = figures.first_unequal_state
    logits = next((s for s in figures.states if s.state == LOGITS), None)
    return [
        "-" if first is None else state_words(first),
        "n/a" if logits is None else f"{logits.max_rel_error:.3g}",
    ]


def lines(diagnostics: Diagnostics | None) -> list[str]:
    """The layer line(s)."""
    layers = _layers(diagnostics)
    if layers is None:
        return []
    out: list[str] = []
    figures = layers.figures
    if figures is not None:
        first = figures.first_unequal_state
        where = (
            "rollout and training states bitwise equal at every layer"
            if first is None
            else "rollout vs training states first differ at " + _at(first)
        )
        picks = [figures.states[0], *figures.states[-3:]]  # embeddings, layer L, norm, logits
        errors = ", ".join(f"{state_words(s.state)} {s.max_rel_error:.3g}" for s in picks)
        out.append(f"layers: {where}; max rel. error {errors}")
    for side in ("training", "rollout"):
        status = layers.side(side)
        if not status.captured:
            out.append(f"layers ({side}): {status.status} ({status.reason})")
    return out


def properties(diagnostics: Diagnostics | None) -> list[tuple[str, str]]:
    """junit properties: ``drift_layers_<side>_status`` (with ``_reason``),
    ``drift_layers_first_unequal_state`` (``-``: none), per state
    ``drift_layers_<state>_max_rel_error`` / ``_median_rel_error``."""
    layers = _layers(diagnostics)
    if layers is None:
        return []
    out: list[tuple[str, str]] = []
    for side in ("training", "rollout"):
        status = layers.side(side)
        out.append((f"drift_layers_{side}_status", status.status))
        if status.reason is not None:
            out.append((f"drift_layers_{side}_reason", status.reason))
    figures = layers.figures
    if figures is not None:
        out.append(("drift_layers_first_unequal_state", figures.first_unequal_state or "-"))
        for s in figures.states:
            out.append((f"drift_layers_{s.state}_max_rel_error", repr(s.max_rel_error)))
            out.append((f"drift_layers_{s.state}_median_rel_error", repr(s.median_rel_error)))
    return out
