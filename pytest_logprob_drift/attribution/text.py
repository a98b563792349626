"""The attribution of a run as plain text: one row per case, then the ranking.

Owns the terminal rendering shared by ``run``, ``report`` and the pytest summary, from the
document's records (``attribution.document``), and the junit properties of a case's
attribution by layer: which side moved and by how much, where sampled tokens first
diverged, the case's importance-sampling ESS (``-`` in attributions sealed before it), the
effect on the drift relative to the baseline with its bootstrap interval, the noise floor,
and the interventions ranked by effect. Knows nothing about how the document was computed or
where it is printed.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from msgspec import UNSET, UnsetType

from pytest_logprob_drift.attribution.document import Attribution, Case, LayerSide
from pytest_logprob_drift.attribution.materiality import material, rule_words
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


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def rows(cases: Sequence[Case]) -> list[list[str]]:
    """Table rows of ``cases`` (in ranking order: ``Attribution.ranked``)."""
    table: list[list[str]] = []
    for case in cases:
        ratio = case.effect.mean_ratio
        interval = (
            "-"
            if ratio.low is None
            else (
                f"[{_num(ratio.low)}, {_num(ratio.high)}]"
                + (" excludes 1" if ratio.excludes_one else "")
            )
        )
        table.append(
            [
                case.label,
                case.classification,
                _num(case.rollout.max_abs_delta),
                _num(case.training.max_abs_delta),
                str(case.shared_tokens),
                "-" if case.ess is UNSET else ess_text(case.ess),
                _num(ratio.value),
                interval,
            ]
        )
    return table


PATH_HEADERS = ("case", "where it moved", "decode max|d|", "prefill max|d|", "training max|d|")
"""The attribution by path (opt-in ``diagnostics.replay``): one row per case that has one."""


def path_rows(cases: Sequence[Case]) -> list[list[str]]:
    """Rows of the attribution by path, in the order of ``cases`` (none without replays)."""
    return [
        [
            case.label,
            case.path.classification,
            _num(case.rollout.max_abs_delta),
            _num(case.path.prefill.max_abs_delta),
            _num(case.training.max_abs_delta),
        ]
        for case in cases
        if case.path is not UNSET
    ]


LAYER_HEADERS = ("case", "training side by layer", "rollout side by layer", "drift enters at")
"""The attribution by layer (opt-in ``diagnostics.layers``): one row per case that has one."""


def layer_rows(cases: Sequence[Case]) -> list[list[str]]:
    """Rows of the attribution by layer, in the order of ``cases`` (none without layer
    captures)."""
    from pytest_logprob_drift.numerics.layer_states import state_words

    table: list[list[str]] = []
    for case in cases:
        layers = case.layers
        if layers is UNSET:
            continue
        sides = [side_by_layer(side) for side in (layers.training, layers.rollout)]
        enters = layers.drift_enters
        table.append([case.label, *sides, "-" if enters is None else state_words(enters)])
    return table


def side_by_layer(side: LayerSide | UnsetType) -> str:
    """One side's attribution by layer in words (``-``: the side has none)."""
    from pytest_logprob_drift.numerics.layer_states import where_moved

    return "-" if side is UNSET else where_moved(side.first_moved_layer, side.max_rel_error)


def layer_properties(case: Case) -> list[tuple[str, str]]:
    """junit properties of a case's attribution by layer (the document's ``layers``; none without
    one): ``drift_layers_drift_enters`` and, per side compared with the baseline,
    ``drift_layers_<side>_first_moved`` (``-``: bitwise equal to the baseline everywhere)."""
    layers = case.layers
    if layers is UNSET:
        return []
    out = [("drift_layers_drift_enters", layers.drift_enters or "-")]
    for name, side in (("training", layers.training), ("rollout", layers.rollout)):
        if side is not UNSET:
            out.append((f"drift_layers_{name}_first_moved", side.first_moved_layer or "-"))
    return out


def summary_lines(
    document: Attribution, within: Collection[str] = (), threshold: float | None = None
) -> list[str]:
    """The noise floor, the ranking of the material interventions, those ``within`` the
    contract (``attribution.materiality``, under ``threshold``: listed apart, not ranked), and
    the cases that could not be attributed."""
    floor = document.noise_floor
    if floor.measured:
        noise = (
            f"noise floor from {floor.repeats + 1} baseline executions: rollout "
            f"{_num(floor.rollout_max_abs_delta)}, training "
            f"{_num(floor.training_max_abs_delta)}"
        )
    else:
        noise = "noise floor not measured (one baseline execution; any movement counts)"
    lines = [noise]
    if floor.layers:
        from pytest_logprob_drift.numerics.layer_states import state_words

        worst = max(floor.layers, key=lambda s: s.median_rel_error)
        where = (
            "0 at every state"
            if worst.median_rel_error == 0
            else f"largest {_num(worst.median_rel_error)} at {state_words(worst.state)}"
        )
        lines.append(
            "layer noise floor (median rel. error, rollout vs training) from the repeats: "
            f"{where}; drift enters only where a case exceeds the baseline by more"
        )
    ranked = material(document.ranking, within)
    if ranked:
        lines.append("ranked by effect on the drift: " + " > ".join(ranked))
    apart = [label for label in document.ranking if label in within]
    if apart:
        lines.append(
            f"within the contract ({rule_words(threshold)}; not ranked): " + ", ".join(apart)
        )
    lines.extend(f"not attributed: {s.label}: {s.reason}" for s in document.skipped)
    return lines
