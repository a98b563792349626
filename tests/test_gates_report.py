"""The frameworks' gates in the report of an imported run (issue 58): per step beside the
verdict in the findings, the steps and case tables (one compact column), ``report --json``
and the page; one run where some gates pass and others fail, each figure against the
framework's formula computed here from the numbers written."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from drift_testing import cli
from framework_gates import miles_sides, nemo, pairs_of, prime, slime, verl_ess, verl_kl
from production_dumps import Sample, make_samples, write_nemo_rl_step

# every test reads the one report of the module, its page drawn
pytestmark = pytest.mark.slow


def _grid(samples: list[Sample]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The step's active tokens as NeMo-RL rows: training, rollout, active (response tokens
    whose mask is 1 of samples that count; one row per sample)."""
    width = max(len(s.mask) for s in samples)
    training = np.zeros((len(samples), width))
    rollout = np.zeros((len(samples), width))
    active = np.zeros((len(samples), width), dtype=bool)
    for i, s in enumerate(samples):
        n = len(s.mask)
        training[i, :n] = s.training
        rollout[i, :n] = s.rollout
        active[i, :n] = np.asarray(s.mask) == 1 if s.counts else False
    return training, rollout, active


def _want(samples: list[Sample]) -> dict[str, tuple[float, bool]]:
    training, rollout, active = _grid(samples)
    pairs = pairs_of(training, rollout, active)
    t, r = miles_sides(training, rollout, active)
    s, n, p, e, k = (
        slime(training, rollout, active),
        nemo(pairs),
        prime(pairs),
        verl_ess(pairs),
        verl_kl(pairs),
    )
    return {
        "slime_ci": (s, s <= 0.1),
        "miles_ci": (abs(t - r), math.isclose(t, r, abs_tol=0.03)),
        "nemo_rl_token_mult_prob_error": (n, n < 1.05),
        "prime_rl_mismatch_kl": (p, p < 0.015),
        "verl_ess": (e, e >= 0.3),
        "verl_kl": (k, abs(k) <= 0.1),
    }


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three NeMo-RL steps: 1 within every gate, 2 with one token 2 nats off in each of two
    samples (slime's 0.1 and verl's advisories pass, miles', NeMo-RL's and prime-rl's fail),
    3 with every sample masked by the run (not judged: no gates)."""
    root = tmp_path_factory.mktemp("gates-report")
    logs = root / "logs"
    logs.mkdir()
    rng = np.random.default_rng(58)
    steps = {
        1: make_samples(rng, 6),
        2: make_samples(rng, 6, planted=[(1, 2, 2.0), (4, 1, 2.0)]),
        3: make_samples(rng, 3),
    }
    for s in steps[3]:
        s.counts = False
    for step, samples in steps.items():
        write_nemo_rl_step(logs, step, samples)
    code, out, err = cli(
        "import", "--format", "nemo-rl", logs, "--artifacts", root / "runs", "--json"
    )
    assert code == 1, err
    run_dir = Path(json.loads(out)["run_dir"])
    code, out, err = cli("report", run_dir, "--json", "--html", root / "page.html")
    assert code == 0, err
    code, text, err = cli("report", run_dir, "--no-html")
    assert code == 0, err
    return {
        "steps": steps,
        "json": json.loads(out),
        "text": text,
        "page": (root / "page.html").read_text(),
    }


def test_each_steps_gates_are_the_frameworks_figures_and_bars(report: dict[str, Any]) -> None:
    by_label = {c["label"]: c for c in report["json"]["cases"]}
    for step in (1, 2):
        got = {g["gate"]: g for g in by_label[f"step={step}"]["gates"]}
        for key, (value, passed) in _want(report["steps"][step]).items():
            # miles differences two means near -1: an absolute bound for their rounding
            assert math.isclose(got[key]["value"], value, rel_tol=1e-9, abs_tol=1e-12), (step, key)
            assert got[key]["passed"] is passed, (step, key)
    failing = {g["gate"] for g in by_label["step=2"]["gates"] if not g["passed"]}
    passing = {g["gate"] for g in by_label["step=2"]["gates"] if g["passed"]}
    assert failing == {"miles_ci", "nemo_rl_token_mult_prob_error", "prime_rl_mismatch_kl"}
    assert passing == {"slime_ci", "verl_ess", "verl_kl"}
    assert all(g["passed"] for g in by_label["step=1"]["gates"])
    assert by_label["step=3"]["outcome"] == "ZERO_ACTIVE_TOKENS"
    assert by_label["step=3"]["gates"] == []


def test_gates_stand_beside_the_verdict(report: dict[str, Any]) -> None:
    by_label = {c["label"]: c for c in report["json"]["cases"]}
    assert by_label["step=1"]["outcome"] == "PASS"  # passing every gate, and PASS
    assert by_label["step=2"]["outcome"] == "MISMATCH"  # the verdict is the contract's
    steps = {s["step"]: s for s in report["json"]["steps"]["steps"]}
    assert steps[2]["gates_failed"] == [
        "miles_ci",
        "nemo_rl_token_mult_prob_error",
        "prime_rl_mismatch_kl",
    ]
    assert steps[1]["gates_failed"] == [] and steps[3]["gates_failed"] is None


def test_json_names_each_gates_source_formula_and_bar(report: dict[str, Any]) -> None:
    gates = {g["gate"]: g for g in report["json"]["gates"]}
    assert gates["nemo_rl_token_mult_prob_error"]["bar"] == 1.05
    assert gates["nemo_rl_token_mult_prob_error"]["passes"] == "<"
    assert gates["prime_rl_mismatch_kl"]["bar"] == 0.015
    assert gates["slime_ci"]["passes"] == "<=" and gates["slime_ci"]["bar"] == 0.1
    assert gates["verl_ess"]["advisory"] and gates["verl_kl"]["advisory"]
    assert "THUDM/slime" in gates["slime_ci"]["source"]
    sentence = report["json"]["findings"]["gates"]
    assert "of 2 judged case(s)" in sentence
    assert "NeMo-RL train/token_mult_prob_error < 1.05: 1 (step=2)" in sentence
    assert "slime" not in sentence.split("failing", 1)[1]


def test_text_tables_and_page_show_which_gates_fail(report: dict[str, Any]) -> None:
    text = report["text"]
    assert "Frameworks' gates (beside the verdict, never instead of it)" in text
    rows = {line.split()[0]: line for line in text.splitlines() if line[:1].isdigit()}
    assert rows["2"].endswith("miles <= 0.03, NeMo-RL < 1.05, prime-rl < 0.015")
    assert rows["1"].endswith("none") and rows["3"].rstrip().endswith("-")
    page = report["page"]
    assert "id='gates'" in page and "<th>gates failed</th>" in page
    assert "<td data-v='3'>miles &lt;= 0.03, NeMo-RL &lt; 1.05, prime-rl &lt; 0.015</td>" in page
    assert "PrimeIntellect-ai/prime-rl" in page
