"""The attribution of a run as plain text: one row per case, then the ranking.

Owns the terminal rendering shared by ``run``, ``report`` and the pytest summary: which side
moved and by how much, where sampled tokens first diverged, the case's importance-sampling
ESS (``-`` in attributions sealed before it), the effect on the drift relative to the baseline
with its bootstrap interval, the noise floor, and the interventions ranked by
effect. Knows nothing about how the document was computed or where it is printed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_logprob_drift.numerics.importance_text import ess_text

HEADERS = (
    "case",
    "effect",
    "rollout max|d|",
    "training max|d|",
    "shared",
    "ESS",
    "mean|diff| ratio",
    "95% interval",
)


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.3g}"


def _ess(value: Any) -> str:
    """The ESS cell: ``-`` when the document has none (sealed before the field) or, in a
    document ``verify`` refuses but the report still shows, anything but a number."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return ess_text(float(value)) if number else "-"


def rows(document: Mapping[str, Any]) -> list[list[str]]:
    """Table rows in ranking order."""
    by_label = {c["label"]: c for c in document["cases"]}
    table: list[list[str]] = []
    for label in document["ranking"]:
        case = by_label[label]
        ratio = case["effect"]["mean_ratio"]
        interval = (
            "-"
            if ratio["low"] is None
            else (
                f"[{_num(ratio['low'])}, {_num(ratio['high'])}]"
                + (" excludes 1" if ratio["excludes_one"] else "")
            )
        )
        table.append(
            [
                label,
                case["classification"],
                _num(case["rollout"]["max_abs_delta"]),
                _num(case["training"]["max_abs_delta"]),
                str(case["shared_tokens"]),
                _ess(case.get("ess")),
                _num(ratio["value"]),
                interval,
            ]
        )
    return table


PATH_HEADERS = ("case", "where it moved", "decode max|d|", "prefill max|d|", "training max|d|")
"""The attribution by path (opt-in ``diagnostics.replay``): one row per case that has one."""


def path_rows(document: Mapping[str, Any]) -> list[list[str]]:
    """Rows of the attribution by path, in ranking order (none without replays)."""
    by_label = {c["label"]: c for c in document["cases"]}
    table: list[list[str]] = []
    for label in document["ranking"]:
        case = by_label[label]
        path = case.get("path")
        if path is None:
            continue
        table.append(
            [
                label,
                path["classification"],
                _num(case["rollout"]["max_abs_delta"]),
                _num(path["prefill"]["max_abs_delta"]),
                _num(case["training"]["max_abs_delta"]),
            ]
        )
    return table


LAYER_HEADERS = ("case", "training side by layer", "rollout side by layer", "drift enters at")
"""The attribution by layer (opt-in ``diagnostics.layers``): one row per case that has one."""


def layer_rows(document: Mapping[str, Any]) -> list[list[str]]:
    """Rows of the attribution by layer, in ranking order (none without layer captures)."""
    from pytest_logprob_drift.numerics.layer_text import state_words, where_moved

    by_label = {c["label"]: c for c in document["cases"]}
    table: list[list[str]] = []
    for label in document["ranking"]:
        layers = by_label[label].get("layers")
        if layers is None:
            continue
        sides = [
            where_moved(layers[side]) if side in layers else "-" for side in ("training", "rollout")
        ]
        enters = layers.get("drift_enters")
        table.append([label, *sides, "-" if enters is None else state_words(enters)])
    return table


def summary_lines(document: Mapping[str, Any]) -> list[str]:
    """The noise floor, the ranking, and the cases that could not be attributed."""
    floor = document["noise_floor"]
    if floor["measured"]:
        noise = (
            f"noise floor from {floor['repeats']} baseline repeat(s): rollout "
            f"{_num(floor['rollout_max_abs_delta'])}, training "
            f"{_num(floor['training_max_abs_delta'])}"
        )
    else:
        noise = "noise floor not measured (one baseline execution; any movement counts)"
    lines = [noise]
    if floor.get("layers"):
        from pytest_logprob_drift.numerics.layer_text import state_words

        worst = max(floor["layers"], key=lambda s: s["median_rel_error"])
        where = (
            "0 at every state"
            if worst["median_rel_error"] == 0
            else f"largest {_num(worst['median_rel_error'])} at {state_words(worst['state'])}"
        )
        lines.append(
            "layer noise floor (median rel. error, rollout vs training) from the repeats: "
            f"{where}; drift enters only where a case exceeds the baseline by more"
        )
    if document["ranking"]:
        lines.append("ranked by effect on the drift: " + " > ".join(document["ranking"]))
    lines.extend(f"not attributed: {s['label']}: {s['reason']}" for s in document["skipped"])
    return lines
