"""Plain-text rendering of a comparison's layer diagnostics (``diagnostics.layers``).

Owns how the CLI run output, the plugin's failure text and junit properties show where in the
network the two sides' states part (``numerics.comparison.LayerDiagnostics``; written by
``execute.layers``, checked by ``store.layers_check``): a line per case (the first state
where the rollout's states stop being bitwise equal to the training's, the max relative error
at the embeddings, the last decoder layer, the final norm and the logits, each side's status
when it did not capture) and ``drift_layers_*`` properties. Knows nothing about torch, files
or how the numbers were computed; a comparison without layer diagnostics renders as nothing.
"""

from __future__ import annotations

from pytest_logprob_drift.numerics.comparison import Diagnostics, LayerDiagnostics


def _layers(diagnostics: Diagnostics | None) -> LayerDiagnostics | None:
    return None if diagnostics is None else diagnostics.layers


def _name(state: str) -> str:
    if state == "0":
        return "embeddings"
    return state.replace("_", " ") if not state.isdigit() else f"layer {state}"


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
            else "rollout vs training states first differ at "
            + (_name(first) if first.isdigit() and first != "0" else f"the {_name(first)}")
        )
        picks = [figures.states[0], *figures.states[-3:]]  # embeddings, layer L, norm, logits
        errors = ", ".join(f"{_name(s.state)} {s.max_rel_error:.3g}" for s in picks)
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
