"""The layer states' names and their words: the vocabulary the layer capture, its reductions and
the texts below the layers diagnostic share.

Owns the names of the two states after the decoder layers (``"0"`` is the embeddings, ``"k"``
the residual stream after k decoder layers), each state in words (``state_words``) and a side's
attribution by layer in words (``where_moved``). Read by ``numerics.layer_reduction`` (which
names the states it reduces), by ``attribution.text`` and ``report.findings`` (the attribution's
layer lines, below the layers diagnostic's folder: they show the attribution document, not the
diagnostic's part) and by ``diagnostics.layers.text``. Torch-free and knows nothing else.
"""

from __future__ import annotations

from typing import Final

FINAL_NORM: Final = "final_norm"
LOGITS: Final = "logits"
"""The two states after the decoder layers (``"0"`` is the embeddings, ``"k"`` the residual
stream after k decoder layers)."""


def state_words(state: str) -> str:
    """``"0"`` -> ``embeddings``, ``"k"`` -> ``layer k``, ``final norm``, ``logits``."""
    if state == "0":
        return "embeddings"
    if state == FINAL_NORM:
        return "final norm"
    return state if state == LOGITS else f"layer {state}"


def where_moved(first: str | None, max_rel_error: float) -> str:
    """A side's attribution by layer (the per-side entry of the layers diagnostic's
    contribution, ``diagnostics.layers.attribution``: the first state that moved and its max
    relative error) in words."""
    how = f" (max rel. error {max_rel_error:.3g})"
    if first is None:
        return "bitwise equal to the baseline at every layer"
    if first == LOGITS:
        equal = "decoder layers and final norm bitwise equal to the baseline"
        return f"{equal}; moved at the logits{how}"
    if first == FINAL_NORM:
        return "decoder layers bitwise equal to the baseline; moved at the final norm" + how
    if first == "0":
        return "moved from the embeddings" + how
    return f"moved from layer {first}" + how
