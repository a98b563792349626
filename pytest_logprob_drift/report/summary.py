"""The report's rows and text: what the terminal prints, and the cell formats the page shares.

Owns the summary row of each case (shared by the terminal table, ``--json`` and the page's
formats), the peer metrics other RL frameworks log that the table shows, the attribution's
ranking in text (``attribution.text``'s rows and lines, from the sealed document), and the JSON
document of ``report --json`` (each case's sealed attribution entry, the findings and, for an
imported run, the steps view of ``report.steps``). Knows nothing about files, seals or how a
table is printed.
"""

from __future__ import annotations

from typing import Any

from pytest_logprob_drift.attribution.document import Case, Ratio, document_json
from pytest_logprob_drift.attribution.materiality import material
from pytest_logprob_drift.attribution.text import HEADERS as ATTRIBUTION_HEADERS
from pytest_logprob_drift.attribution.text import rows as attribution_rows
from pytest_logprob_drift.attribution.text import summary_lines
from pytest_logprob_drift.diagnostics.registry import installed
from pytest_logprob_drift.numerics.comparison import Diagnostics
from pytest_logprob_drift.numerics.framework_figures import SLIME_FIGURE, SLIME_PER_TOKEN_FIGURE
from pytest_logprob_drift.records import JsonObject
from pytest_logprob_drift.report import gates
from pytest_logprob_drift.report.findings import findings, moved_side, threshold, within_contract
from pytest_logprob_drift.report.model import ReportData
from pytest_logprob_drift.report.signatures import named_signatures

HEADERS = [
    "case_id",
    "label",
    "outcome",
    "active",
    "mismatches",
    "max|diff|",
    "p99|diff|",
    "mean|diff|",
    gates.TITLE,
    "k3 KL",
]
"""The text table's columns before the installed diagnostics' (``headers``)."""


def headers() -> list[str]:
    """The report text's case-table columns: ``HEADERS``, then each installed diagnostic's."""
    return [*HEADERS, *(h for diagnostic in installed() for h in diagnostic.report_headers())]


PEER_METRICS: tuple[tuple[str, str], ...] = (
    ("k1 KL", "approx_kl_k1"),
    ("k3 KL", "approx_kl_k3"),
    (
        "mean exp|diff| (NeMo-RL's mult-prob error, active tokens only)",
        "nemo_rl_token_mult_prob_error",
    ),
    ("verl probs diff max", "verl_rollout_probs_diff_max"),
)
"""``(column title, comparison.json diagnostics key)`` of the peer metrics every scored case
has: verl's rollout_probs_diff_max as verl computes it; NeMo-RL's token_mult_prob_error over
the active tokens only (NeMo-RL's own is over its whole padded batch, so a NaN in padding makes
it NaN, and is the mean of per-global-batch means when a step has several: the title names the
difference). The mean |diff| column is the token mean, which is slime's figure only with
``--calculate-per-token-loss`` (``FRAMEWORK_FIGURES``)."""
FRAMEWORK_FIGURES: tuple[tuple[str, str], ...] = (
    ("slime train_rollout_logprob_abs_diff", SLIME_FIGURE),
    ("slime train_rollout_logprob_abs_diff, --calculate-per-token-loss", SLIME_PER_TOKEN_FIGURE),
)
"""``(column title, diagnostics key)`` of the figures a framework logs, computed as it does,
which only an imported step of that framework has (``numerics.framework_figures``)."""


def framework_figure(diagnostics: Diagnostics, key: str) -> float | None:
    """A ``FRAMEWORK_FIGURES`` figure of a case (None: not recorded)."""
    value: float | None = getattr(diagnostics, key)
    return value


def fmt_diff(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:.3e}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def interval(ratio: Ratio | None) -> str:
    """A ratio's bootstrap interval (``-``: none, or no ratio)."""
    if ratio is None or ratio.low is None or ratio.high is None:
        return "-"
    return f"[{ratio.low:.3g}, {ratio.high:.3g}]" + (" excludes 1" if ratio.excludes_one else "")


def summary_rows(data: ReportData) -> list[list[Any]]:
    rows = []
    for view in data.cases:
        d = view.diagnostics
        rows.append(
            [
                view.case_id,
                view.label,
                view.outcome,
                "-" if view.active_tokens is None else view.active_tokens,
                "-" if view.mismatches is None else view.mismatches,
                fmt_diff(d.statistic("max_abs_diff")),
                fmt_diff(d.statistic("p99_abs_diff")),
                fmt_diff(d.statistic("mean_abs_diff")),
                gates.failed_cell(view.gates),
                fmt_diff(d.statistic("approx_kl_k3")),
                *(text for diagnostic in installed() for text, _ in diagnostic.report_cells(d)),
            ]
        )
    return rows


def ranking_table(data: ReportData) -> tuple[list[str], list[list[str]], list[str]] | None:
    """``(headers, rows, lines)`` of the attribution in text, or None without one."""
    if data.attribution is None:
        return None
    return (
        list(ATTRIBUTION_HEADERS),
        attribution_rows(data.attribution.ranked()),
        summary_lines(data.attribution, within_contract(data), threshold(data)),
    )


def report_json(data: ReportData, page: str | None) -> JsonObject:
    """The ``report --json`` document: per case its sealed attribution entry as sealed (None
    without one) and the side it moved; the findings; the ranking of the material
    interventions (``attribution.materiality``: the sealed ranking without those within the
    contract)."""
    document = data.attribution

    def side(entry: Case | None) -> str | None:
        moved = (
            None if entry is None or document is None else moved_side(entry, document.noise_floor)
        )
        return None if moved is None else moved.value

    return {
        "run_dir": data.header.run_dir,
        "experiment_id": data.header.experiment_id,
        "html": page,
        "cases": [
            {
                "case_id": v.case_id,
                "label": v.label,
                "changed": list(v.changed),
                "outcome": v.outcome,
                "attempt_id": v.attempt_id,
                "active_tokens": v.active_tokens,
                "mismatches": v.mismatches,
                "diagnostics": v.diagnostics.to_json(),
                "detailed": v.detail is not None,
                "attribution": None if v.attribution is None else document_json(v.attribution),
                "side_moved": side(v.attribution),
                "gates": gates.case_json(v.gates),
                "weights": dict(v.weights),
            }
            for v in data.cases
        ],
        "attempts": [s.to_json() for s in data.statuses],
        "invalid": len(data.invalid),
        "ranking": [] if document is None else material(document.ranking, within_contract(data)),
        "findings": findings(data).to_json(),
        "steps": None if data.steps is None else data.steps.to_json(),
        "signatures": [s.to_json() for s in named_signatures(data)],
        "unread": list(data.unread),
        "gates": gates.definitions_json(),
    }
