"""The frameworks' gates in the report: the compact cell, the finding, the JSON, the page's table.

Owns how ``numerics.gates`` results are shown beside each case's verdict (never instead of
it): the one compact cell naming the gates a case fails (``failed_cell``; "-" for a case
without scores, "none" when it passes every gate), the findings' sentence counting the cases
that fail each gate (``finding``), a case's and the run's gates in ``report --json``
(``case_json``, ``definitions_json``) and the page's section naming each gate's figure,
formula, bar and source (``section``). Knows nothing about files, seals or tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_logprob_drift.numerics.gates import GATES, Gate, GateResult
from pytest_logprob_drift.records import JsonObject
from pytest_logprob_drift.report.markup import Markup, el

TITLE = "gates failed"
"""The compact column's title (the case table, the steps table)."""


def short(gate: Gate) -> str:
    """``NeMo-RL < 1.05``: the framework and its bar, as the compact cell names a gate."""
    name = {"verl_ess": "verl ESS", "verl_kl": "verl KL"}.get(gate.key, gate.framework)
    return f"{name} {gate.passes.value} {gate.bar:g}"


def failed_cell(gates: Sequence[GateResult]) -> str:
    """The gates a case fails, by their short names ("-": not judged; "none": it passes
    every gate)."""
    if not gates:
        return "-"
    failed = [short(r.gate) for r in gates if not r.passed]
    return ", ".join(failed) if failed else "none"


def finding(cases: Sequence[tuple[str, Sequence[GateResult]]]) -> str | None:
    """One sentence: how many judged cases fail each gate (``cases``: each case's label and
    gates); None when no case was judged."""
    judged = [(label, gates) for label, gates in cases if gates]
    if not judged:
        return None
    parts = []
    for gate in GATES:
        failing = [
            label
            for label, gates in judged
            if any(r.key == gate.key and not r.passed for r in gates)
        ]
        if failing:
            named = ", ".join(failing[:3]) + (
                f" and {len(failing) - 3} more" if len(failing) > 3 else ""
            )
            advisory = ", advisory" if gate.advisory else ""
            parts.append(
                f"{gate.framework} {gate.figure} {gate.passes.value} {gate.bar:g}{advisory}: "
                f"{len(failing)} ({named})"
            )
    lead = (
        "Frameworks' gates (beside the verdict, never instead of it), of "
        f"{len(judged)} judged case(s): "
    )
    if not parts:
        return lead + "every one passes every gate."
    return lead + "failing " + "; ".join(parts) + "."


def case_json(gates: Sequence[GateResult]) -> list[JsonObject]:
    return [r.to_json() for r in gates]


def definitions_json() -> list[JsonObject]:
    """Every gate as the report names it: its figure, formula, bar and source."""
    return [
        {
            "gate": g.key,
            "framework": g.framework,
            "figure": g.figure,
            "formula": g.formula,
            "passes": g.passes.value,
            "bar": g.bar,
            "advisory": g.advisory,
            "source": g.source,
            "assumes": g.assumes or None,
        }
        for g in GATES
    ]


def section(cases: Sequence[tuple[str, Sequence[GateResult]]]) -> Markup | None:
    """The page's gates section: each gate's figure, bar, formula and source, and the cases
    failing it (None when no case was judged)."""
    judged = [(label, gates) for label, gates in cases if gates]
    if not judged:
        return None
    rows = []
    for gate in GATES:
        failing = [
            label
            for label, gates in judged
            if any(r.key == gate.key and not r.passed for r in gates)
        ]
        rows.append(
            el(
                "tr",
                el("td", gate.framework + (" (advisory)" if gate.advisory else "")),
                el("td", el("code", gate.figure)),
                el("td", f"{gate.passes.value} {gate.bar:g}"),
                el("td", f"{len(failing)} of {len(judged)}", title=", ".join(failing) or None),
                el("td", gate.formula + (f" (here: {gate.assumes})" if gate.assumes else "")),
                el("td", el("code", gate.source)),
            )
        )
    head = el(
        "tr",
        *(
            el("th", h)
            for h in ("framework", "figure", "passes when", "cases failing", "formula", "source")
        ),
    )
    return el(
        "section",
        el("h2", "Frameworks' gates"),
        el(
            "p",
            "What each framework's own check would say of the same active tokens, beside the "
            "contract's verdict and never instead of it.",
            class_="muted",
        ),
        el("table", el("thead", head), el("tbody", *rows), class_="gates"),
        id="gates",
    )
