"""The full-vocabulary and semantic-offset diagnostics shown to people: the HTML report and
the plugin's junit properties (issue 13).

A real cpu-smoke run with ``$.diagnostics.full_vocabulary`` is rendered: the case table gains
KL both ways, TV and the semantic-offset column, every detailed case a "Full-vocabulary
divergence" block with its worst positions and top tokens, and the offset line. A firing
offset comes from real tensors (a rollout reporting processed logprobs at temperature 0.7
against a raw trainer) through ``sealed_diagnostics``, as a case seals it. The junit XML of a
real plugin run (pytester) carries the same figures as properties.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import OFFSET_LABEL, S0, run_by_label

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.diagnostics.full_vocabulary.section import HEADERS as COLUMN_TITLES
from pytest_logprob_drift.numerics import text as divergence_text
from pytest_logprob_drift.numerics.comparison import Diagnostics, from_builtins
from pytest_logprob_drift.numerics.divergence_file import sealed_diagnostics, sealed_tensors
from pytest_logprob_drift.numerics.sampling import Truncation, processed_logits
from pytest_logprob_drift.report.html import render_page
from pytest_logprob_drift.report.load import load_report
from pytest_logprob_drift.runtimes.smoke.runtime import CpuSmokeAdapter

pytest_plugins = ["pytester"]

DIAGNOSTICS = {"full_vocabulary": {"top_k": 3, "worst_positions": 2}}
COLUMNS = list(COLUMN_TITLES)


def s0_document() -> dict[str, Any]:
    document: dict[str, Any] = copy.deepcopy(json.loads(S0.read_text()))
    document["diagnostics"] = DIAGNOSTICS
    return document


@pytest.fixture(scope="module")
def diag_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _smoke_run(tmp_path_factory.mktemp("report-full-vocab"), s0_document())


def _smoke_run(work: Path, document: dict[str, Any]) -> Path:
    """The run directory of ``document`` executed on the smoke runtime under ``work``."""
    config = work / "config.json"
    config.write_text(json.dumps(document))
    run_by_label(
        plan_file(str(config)),
        runtime="cpu-smoke",
        artifacts=work / "runs",
        allow_smoke=True,
        adapter=CpuSmokeAdapter(),
    )
    return work / "runs" / "s0-cpu-smoke"


class _Tables(HTMLParser):
    """Header cells and body rows of the case table."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[str] = []
        self.rows: list[list[str]] = []
        self._in_table = False
        self._depth = 0
        self._cell: list[str] | None = None
        self._row: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table" and ("id", "case-table") in attrs:
            self._in_table = True
        if not self._in_table:
            return
        if tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if not self._in_table:
            return
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if not self.headers:
                self.headers = self._row
            else:
                self.rows.append(self._row)
            self._row = None
        elif tag == "table":
            self._in_table = False

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def case_table(html: str) -> tuple[list[str], dict[str, dict[str, str]]]:
    parser = _Tables()
    parser.feed(html)
    rows = {row[0]: dict(zip(parser.headers, row, strict=True)) for row in parser.rows}
    return parser.headers, rows


@pytest.mark.slow
def test_page_shows_kl_tv_worst_positions_and_the_offset_line(
    diag_run: Path, tmp_path: Path
) -> None:
    data = load_report(diag_run, page_dir=tmp_path)
    html = render_page(data)
    headers, rows = case_table(html)
    assert all(column in headers for column in COLUMNS), headers
    offset_case = rows[OFFSET_LABEL]
    full = data.case(OFFSET_LABEL).diagnostics.to_json()["full_vocabulary"]
    assert offset_case["KL(r||t) max"] == f"{full['kl_rollout_training']['max']:.3e}"
    assert offset_case["TV max"] == f"{full['total_variation']['max']:.3e}"
    assert offset_case["semantic offset"] == "no"
    detailed = [v for v in data.cases if v.detail is not None]
    assert detailed
    assert html.count("<h3>Full-vocabulary divergence</h3>") == len(detailed)
    assert html.count("class='worst-positions'") == len(detailed)
    assert "KL(rollout||training)" in html and "KL(training||rollout)" in html
    assert "Semantic offset:" in html and "no truncation offset" in html
    worst = full["worst_positions"][0]
    assert f"<td class='n'>{worst['top_tokens'][0]['token_id']}</td>" in html


@pytest.mark.slow
def test_page_without_the_diagnostics_keeps_its_columns(tmp_path: Path) -> None:
    """A run without full-vocabulary diagnostics renders exactly the columns it had."""
    work = tmp_path / "plain"
    work.mkdir()
    document = s0_document()
    del document["diagnostics"]
    html = render_page(load_report(_smoke_run(work, document), page_dir=tmp_path))
    headers, _ = case_table(html)
    assert not any(column in headers for column in COLUMNS)
    assert "Full-vocabulary divergence" not in html


def firing_offset() -> dict[str, Any]:
    """comparison.json's diagnostics of a rollout reporting processed logprobs at temperature
    0.7 (top_p 0.9) against a raw trainer, computed from real tensors as a case seals them."""
    how = Truncation(temperature=0.7, top_p=0.9)
    logits = torch.randn((6, 32), generator=torch.Generator().manual_seed(4)) * 2
    processed = processed_logits(logits, how)
    tokens = processed.argmax(-1)
    active = torch.cat([torch.zeros(1, dtype=torch.bool), torch.ones(6, dtype=torch.bool)])[None]

    def grid(values: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.zeros(1, dtype=values.dtype), values])[None]

    def pick(rows: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(rows, -1).gather(-1, tokens[:, None])[:, 0]

    rollout, training = grid(pick(processed)), grid(pick(logits))
    sealed = sealed_tensors(
        processed,
        logits,
        active,
        top_k=3,
        worst_positions=2,
        truncation=how,
        token_ids=grid(tokens),
        rollout_logprobs=rollout,
        training_logprobs=training,
    )
    return sealed_diagnostics(sealed, training, rollout, active)


@pytest.mark.slow
def test_a_firing_offset_is_shown_with_its_explanation(diag_run: Path, tmp_path: Path) -> None:
    entries = firing_offset()
    assert entries["semantic_offset"]["fires"] is True
    data = load_report(diag_run, page_dir=tmp_path)
    view = data.case(OFFSET_LABEL)
    shown = dataclasses.replace(
        view, diagnostics=from_builtins({**view.diagnostics.to_json(), **entries}, Diagnostics)
    )
    page = render_page(
        dataclasses.replace(data, cases=tuple(shown if c is view else c for c in data.cases))
    )
    _, rows = case_table(page)
    assert rows[OFFSET_LABEL]["semantic offset"] == "processed_rollout"
    assert "processed semantics: the rollout&#x27;s logprobs match the processed distribution" in (
        page
    )
    assert "(temperature 0.7, top_p 0.9)" in page
    # The same line in the plugin's failure text and its junit properties.
    lines = divergence_text.lines(from_builtins(entries, Diagnostics))
    assert any(line.startswith("semantic offset: processed semantics") for line in lines)
    properties = dict(divergence_text.properties(from_builtins(entries, Diagnostics)))
    assert properties["drift_semantic_offset_explanation"] == "processed_rollout"
    assert properties["drift_semantic_offset_fires"] == "True"


def test_junit_properties_carry_the_full_vocabulary_diagnostics(
    pytester: pytest.Pytester,
) -> None:
    pytest.importorskip("torch")
    config = "s0_full_vocab.json"
    (pytester.path / config).write_text(json.dumps(s0_document()))
    shutil.copy(S0, pytester.path / "unused.json")
    result = pytester.runpytest(
        "--drift-config",
        config,
        "--drift-runtime",
        "cpu-smoke",
        "--drift-allow-smoke-operators",
        "--drift-expect",
        f"{OFFSET_LABEL}=MISMATCH",
        "--junitxml",
        "out.xml",
    )
    result.assert_outcomes(passed=3)
    root = ET.parse(pytester.path / "out.xml").getroot()
    cases = {
        case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
        for case in root.iter("testcase")
    }
    assert set(cases) == {"baseline", "batch.size=1", OFFSET_LABEL}
    for name, props in cases.items():
        for key in ("kl_rollout_training", "kl_training_rollout", "total_variation"):
            for stat in ("max", "mean", "infinite"):
                assert f"drift_{key}_{stat}" in props, (name, key, stat)
        assert props["drift_full_vocab_positions"] == props["drift_active_tokens"]
        worst = json.loads(props["drift_full_vocab_worst_positions"])
        assert len(worst) == 2 and all(len(w["top_tokens"]) == 3 for w in worst)
        assert props["drift_semantic_offset_fires"] == "False"
        assert props["drift_semantic_offset"].startswith("no truncation offset")
    attempt = Path(cases[OFFSET_LABEL]["drift_attempt"])
    comparison = json.loads((attempt / "comparison.json").read_text())
    full = comparison["diagnostics"]["full_vocabulary"]
    assert float(cases[OFFSET_LABEL]["drift_total_variation_max"]) == full["total_variation"]["max"]
    assert (
        float(cases[OFFSET_LABEL]["drift_kl_rollout_training_mean"])
        == (full["kl_rollout_training"]["mean"])
    )
