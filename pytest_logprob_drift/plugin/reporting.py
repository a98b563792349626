"""How drift outcomes are reported: status words and letters, the summary, report tags.

Owns tagging a drift item's call report with its outcome and attribution entry (JSON-safe
attributes, so they travel from xdist workers), the junit properties of a case's
full-vocabulary and semantic-offset diagnostics, the status word and letter of each outcome
(MISMATCH "M", ...), and the terminal summary: per-outcome counts, the session's engine
constructions, and a "drift attribution" section ranking each experiment's material cases by
their effect on the drift (those within the contract, ``attribution.materiality``, listed
apart). Knows nothing about execution.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from pytest_logprob_drift.attribution.document import Case, read_case_bytes
from pytest_logprob_drift.attribution.materiality import rule_words, within_contract
from pytest_logprob_drift.attribution.ranking import case_rank_key
from pytest_logprob_drift.attribution.text import (
    HEADERS,
    LAYER_HEADERS,
    PATH_HEADERS,
    layer_rows,
    path_rows,
    rows,
)
from pytest_logprob_drift.diagnostics.registry import installed
from pytest_logprob_drift.errors import one_line
from pytest_logprob_drift.numerics.comparison import Diagnostics
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.plugin.session import drift_session
from pytest_logprob_drift.tables import render_table


def diagnostic_properties(diagnostics: Diagnostics | None) -> list[tuple[str, str]]:
    """The junit properties of a case's diagnostics (each installed diagnostic's): what
    ``--junitxml`` records beside the verdict."""
    return [p for diagnostic in installed() for p in diagnostic.properties(diagnostics)]


def tag_report(
    report: pytest.TestReport, user_properties: list[tuple[str, object]], plan_only: bool
) -> None:
    """Put the item's outcome and expected outcome on its call report."""
    properties = dict(user_properties)
    outcome = properties.get("drift_outcome")
    if outcome is None and plan_only:
        outcome = Outcome.PLAN_ONLY.value
    if outcome is not None:
        report.drift_outcome = outcome  # type: ignore[attr-defined]
        report.drift_expected = properties.get(  # type: ignore[attr-defined]
            "drift_expected", Outcome.PASS.value
        )
    entry = properties.get("drift_attribution_entry")
    if isinstance(entry, str):
        report.drift_attribution = entry  # type: ignore[attr-defined]
        report.drift_within_contract = within_contract(  # type: ignore[attr-defined]
            str(outcome),
            _number(properties.get("drift_max_abs_diff")),
            _number(properties.get("drift_threshold")),
        )


def _number(value: object) -> float | None:
    """A junit property's number (None: absent or ``None``)."""
    try:
        return None if value is None else float(str(value))
    except ValueError:
        return None


class OutcomeCounter:
    """Counts drift outcomes of reports (on the xdist controller too) and prints them, with
    the engine constructions of the session."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.counts: Counter[str] = Counter()
        self.attributions: dict[str, list[Case]] = {}
        """Per experiment (the node id without the case label): attribution entries."""
        self.within: dict[str, set[str]] = {}
        """Per experiment: labels of the interventions within the contract
        (``attribution.materiality``), never ranked."""

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome = getattr(report, "drift_outcome", None)
        if outcome is not None and report.when == "call":
            self.counts[outcome] += 1
        entry = getattr(report, "drift_attribution", None)
        if isinstance(entry, str) and report.when == "call":
            experiment = report.nodeid.split("@", 1)[0].rsplit("::", 1)[0]
            case = read_case_bytes(entry)
            self.attributions.setdefault(experiment, []).append(case)
            if getattr(report, "drift_within_contract", False):
                self.within.setdefault(experiment, set()).add(case.label)

    def _write_attribution(self, terminalreporter: Any) -> None:
        terminalreporter.write_sep("=", "drift attribution")
        for experiment, entries in sorted(self.attributions.items()):
            ranked = sorted(entries, key=case_rank_key)
            terminalreporter.write_line(one_line(f"{experiment} (against its baseline):"))
            terminalreporter.write_line(render_table(list(HEADERS), rows(ranked)))
            if by_path := path_rows(ranked):
                terminalreporter.write_line(render_table(list(PATH_HEADERS), by_path))
            if by_layer := layer_rows(ranked):
                terminalreporter.write_line(render_table(list(LAYER_HEADERS), by_layer))
            within = self.within.get(experiment, set())
            if material := [c.label for c in ranked if c.label not in within]:
                terminalreporter.write_line(
                    one_line("ranked by effect on the drift: " + " > ".join(material))
                )
            if apart := [c.label for c in ranked if c.label in within]:
                terminalreporter.write_line(
                    one_line(
                        f"within the contract ({rule_words(None)}; not ranked): " + ", ".join(apart)
                    )
                )
        for directory in drift_session(self.config).sealed:
            terminalreporter.write_line(one_line(f"sealed attribution: {directory}"))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        constructions = drift_session(self.config).constructions
        if not self.counts and not constructions:
            return
        terminalreporter.write_sep("=", "logprob drift outcomes")
        if self.counts:
            terminalreporter.write_line(
                ", ".join(
                    f"{self.counts[o.value]} {o.value}" for o in Outcome if self.counts[o.value]
                )
            )
        if constructions:
            terminalreporter.write_line(
                f"engine constructions: rollout "
                f"{constructions['rollout']}, training "
                f"{constructions['training']}"
            )
        if self.attributions:
            self._write_attribution(terminalreporter)


def status_of(report: pytest.TestReport) -> tuple[str, str, str] | None:
    """``(category, letter, word)`` for a drift call report; None for any other report."""
    outcome = getattr(report, "drift_outcome", None)
    if outcome is None or report.when != "call":
        return None
    word = Outcome(outcome)
    if report.failed:
        if word is Outcome.PASS:
            expected = getattr(report, "drift_expected", Outcome.PASS.value)
            return "failed", "F", f"PASS (expected {expected})"
        return "failed", word.letter, word.value
    if report.passed:
        return (
            "passed",
            "." if word is Outcome.PASS else word.letter.lower(),
            f"{word.value} (expected)" if word is not Outcome.PASS else "PASS",
        )
    if report.skipped and word is Outcome.PLAN_ONLY:
        return "skipped", word.letter, word.value
    return None
