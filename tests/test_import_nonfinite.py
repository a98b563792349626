"""Non-finite logprobs at active tokens (issue 48, points 2 and 3): an imported step holding
+inf, -inf or NaN at an active token is INVALID_ARTIFACT with its real active count and the
number of non-finite tokens among them (both recomputed here in numpy from the written rows);
``report`` (text, ``--json``, the HTML page, both scatter modes) and ``verify`` finish with exit
0 or 1 instead of an internal error. A run sealed before the count existed
(``tests/data/before_issue48``: made by this project's release before issue 48, from
``nonfinite.jsonl`` beside it, with ``active_tokens`` 0 on its INVALID_ARTIFACT steps) verifies
and reports with the same outcomes and counts; a recomputed check is compared in the form it
was sealed in, and only that one earlier form is accepted.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from drift_testing import cli
from production_dumps import (
    THRESHOLD,
    expected,
    make_samples,
    neutral_rows,
    write_jsonl,
    write_nemo_rl_step,
    write_slime_dump,
    write_slime_rank_dumps,
)

from pytest_logprob_drift.numerics.comparison import NumericCheck
from pytest_logprob_drift.outcomes import Outcome

BEFORE = Path(__file__).resolve().parent / "data" / "before_issue48"
BAD = {1: float("inf"), 2: float("nan"), 3: float("-inf"), 4: None, 5: float("inf")}
"""Each step's planted non-finite value (step 4: none; step 5: more active tokens than the
page draws as points, so its scatter is a 2-D histogram)."""


def _numpy_counts(rows: list[dict[str, Any]]) -> dict[int, tuple[int, int]]:
    """Each step's (active tokens, non-finite active tokens), numpy from the written rows."""
    counts: dict[int, tuple[int, int]] = {}
    for row in rows:
        mask = np.asarray(row["mask"], dtype=np.float64) == 1
        training = np.asarray(row["training_logprobs"], dtype=np.float64)[mask]
        rollout = np.asarray(row["rollout_logprobs"], dtype=np.float64)[mask]
        bad = ~(np.isfinite(training) & np.isfinite(rollout))
        active, nonfinite = counts.get(row["step"], (0, 0))
        counts[row["step"]] = (active + int(mask.sum()), nonfinite + int(bad.sum()))
    return counts


@pytest.fixture(scope="module")
def nonfinite_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("nonfinite")
    rng = np.random.default_rng(4848)
    rows: list[dict[str, Any]] = []
    for step, bad in BAD.items():
        big = step == 5
        samples = make_samples(rng, 300 if big else 4, lengths=(15, 20) if big else (6, 14))
        if bad is not None:
            samples[1].training[2] = bad
            samples[2].rollout[0] = bad
        rows += neutral_rows(step, samples)
    write_jsonl(tmp / "in.jsonl", rows)
    code, out, err = cli(
        "import", "--format", "jsonl", tmp / "in.jsonl", "--artifacts", tmp / "runs",
        "--experiment-id", "nonfinite", "--json",
    )  # fmt: skip
    assert code == 1, err
    return {"tmp": tmp, "rows": rows, "result": json.loads(out), "run": tmp / "runs/nonfinite"}


def _comparisons(run: Path) -> dict[int, dict[str, Any]]:
    by_step = {}
    for path in run.glob("cases/*/*/comparison.json"):
        comparison = json.loads(path.read_text())
        by_step[int(comparison["label"].removeprefix("step="))] = comparison
    return by_step


def test_an_invalid_artifact_step_counts_its_active_and_nonfinite_tokens(
    nonfinite_run: dict[str, Any],
) -> None:
    counts = _numpy_counts(nonfinite_run["rows"])
    comparisons = _comparisons(nonfinite_run["run"])
    assert sorted(comparisons) == sorted(BAD)
    for step, bad in BAD.items():
        active, nonfinite = counts[step]
        c = comparisons[step]
        assert c["active_tokens"] == active > 0
        if bad is None:
            assert c["outcome"] == "PASS" and "nonfinite_tokens" not in c
            assert "nonfinite_tokens" not in c["numerical"]
            continue
        assert nonfinite == 2
        assert c["outcome"] == "INVALID_ARTIFACT"
        assert c["nonfinite_tokens"] == nonfinite
        assert c["numerical"] == {
            "outcome": "INVALID_ARTIFACT",
            "mismatches": 0,
            "active_tokens": active,
            "threshold": THRESHOLD,
            "nonfinite_tokens": nonfinite,
        }
        assert f"({nonfinite} of {active} active tokens non-finite)" in c["reason"]
    shown = {c["step"]: c["active_tokens"] for c in nonfinite_run["result"]["results"]}
    assert shown == {step: counts[step][0] for step in BAD}


@pytest.mark.slow
def test_report_and_verify_finish_on_nonfinite_active_tokens(
    nonfinite_run: dict[str, Any],
) -> None:
    run, tmp = nonfinite_run["run"], nonfinite_run["tmp"]
    code, out, err = cli("report", run, "--html", tmp / "page.html")
    assert code == 0, err
    assert "internal error" not in err
    page = (tmp / "page.html").read_text()
    assert "2 non-finite not drawn" in page
    assert page.count("<svg") > 5
    code, out, err = cli("report", run, "--json", "--no-html")
    assert code == 0, err
    document = json.loads(out)
    outcomes = {c["label"]: (c["outcome"], c["active_tokens"]) for c in document["cases"]}
    counts = _numpy_counts(nonfinite_run["rows"])
    assert outcomes == {
        f"step={s}": ("PASS" if b is None else "INVALID_ARTIFACT", counts[s][0])
        for s, b in BAD.items()
    }
    code, out, err = cli("verify", run)
    assert code == 0, err
    assert "0 invalid" in out


def test_a_run_sealed_before_the_count_verifies_and_reports_as_it_did(tmp_path: Path) -> None:
    run = tmp_path / "nonfinite-before-issue48"
    shutil.copytree(BEFORE / "runs" / "nonfinite-before-issue48", run)
    sealed = _comparisons(run)
    assert {s: (c["outcome"], c["active_tokens"]) for s, c in sealed.items()} == {
        1: ("INVALID_ARTIFACT", 0),
        2: ("INVALID_ARTIFACT", 0),
        3: ("PASS", 10),
    }
    assert all("nonfinite_tokens" not in c for c in sealed.values())
    code, out, err = cli("verify", run, "--json")
    assert code == 0, err
    assert {a["status"] for a in json.loads(out)["attempts"]} == {"ok"}
    code, out, err = cli("report", run, "--json", "--no-html")
    assert code == 0, err
    shown = {c["label"]: (c["outcome"], c["active_tokens"]) for c in json.loads(out)["cases"]}
    assert shown == {f"step={s}": (c["outcome"], c["active_tokens"]) for s, c in sealed.items()}


def _check(active: int, nonfinite: int | None) -> NumericCheck:
    return NumericCheck(
        outcome=Outcome.INVALID_ARTIFACT,
        mismatches=0,
        active_tokens=active,
        threshold=THRESHOLD,
        nonfinite_tokens=nonfinite,
    )


def test_only_the_earlier_form_of_a_nonfinite_check_is_compared_in_that_form() -> None:
    recomputed = _check(41, 2)
    assert recomputed.as_sealed(_check(0, None)) == _check(0, None)
    # a check sealed in the new form, a wrong count or a count without nonfinite_tokens is
    # compared as recomputed (so verify names the difference)
    for recorded in (_check(41, 2), _check(40, 2), _check(0, 2), _check(41, None), None):
        assert recomputed.as_sealed(recorded) == recomputed
    passed = NumericCheck(outcome=Outcome.PASS, mismatches=0, active_tokens=9, threshold=1e-3)
    assert passed.as_sealed(_check(0, None)) == passed


WRITERS = {
    "nemo-rl": lambda d, step, samples: write_nemo_rl_step(d, step, samples),
    "slime-ranks": lambda d, step, samples: write_slime_rank_dumps(d, step, samples),
    "slime-v2": lambda d, step, samples: write_slime_dump(d, step, samples),
}


@pytest.mark.parametrize("layout", sorted(WRITERS))
@pytest.mark.slow
def test_every_format_reports_and_verifies_with_infinity_and_nan_at_active_tokens(
    layout: str, tmp_path: Path
) -> None:
    rng = np.random.default_rng(4849)
    (tmp_path / "dump").mkdir()
    steps = {}
    for step, bad in ((1, float("inf")), (2, float("-inf")), (3, float("nan"))):
        samples = make_samples(rng, 3)
        samples[0].training[1] = bad
        steps[step] = samples
        WRITERS[layout](tmp_path / "dump", step, samples)
    fmt = "nemo-rl" if layout == "nemo-rl" else "slime"
    code, out, err = cli(
        "import", "--format", fmt, tmp_path / "dump", "--artifacts", tmp_path / "runs",
        "--experiment-id", "x", "--json",
    )  # fmt: skip
    assert code == 1, err
    for result in json.loads(out)["results"]:
        want = expected(steps[result["step"]])
        assert result["outcome"] == want.outcome == "INVALID_ARTIFACT"
        assert result["active_tokens"] == want.active
        assert "(1 of " in result["reason"]
    run = tmp_path / "runs" / "x"
    for args in (
        ("report", run, "--html", tmp_path / "a.html"),
        ("report", run, "--json", "--no-html"),
        ("verify", run),
    ):
        code, out, err = cli(*args)
        assert code in (0, 1) and "internal error" not in err, (args, err)
