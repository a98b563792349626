"""NeMo-RL's ``grpo.seq_logprob_error_threshold`` (issue 48, point 4).

NeMo-RL overwrites ``sample_mask`` with its drift mask before the step is logged, so the
sequences it dropped for drift are logged inactive. Written here by a copy of NeMo-RL's own
masking function and logger (``tests/production_dumps.py``, commit named there): the verdict
keeps the logged mask (numpy float64 over the samples logged active), and the samples whose
``sample_loss_mask`` is 0 while their token mask is not are judged apart as ``masked_by_run``
(samples, tokens, mismatches, max |diff|, numpy over exactly those tokens), shown on the page and
in ``report --json`` beside the verdict and never counted in it. A run that masked nothing has
no such entry.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from drift_testing import cli
from production_dumps import (
    THRESHOLD,
    Sample,
    expected,
    make_samples,
    write_nemo_rl_step_with_seq_threshold,
)

SEQ_THRESHOLD = 1.2
"""NeMo-RL's per-sequence mult-prob error limit (``grpo.seq_logprob_error_threshold``)."""


def _masked_numpy(samples: Sequence[Sample], logged: Sequence[bool]) -> dict[str, Any]:
    """The tokens of the samples logged with sample mask 0 whose token mask is 1."""
    diffs = [
        abs(np.float64(t) - np.float64(r))
        for s, kept in zip(samples, logged, strict=True)
        if not kept
        for t, r, m in zip(s.training, s.rollout, s.mask, strict=True)
        if m == 1
    ]
    held = np.asarray(diffs, dtype=np.float64)
    return {
        "samples": sum(1 for s, kept in zip(samples, logged, strict=True) if not kept),
        "tokens": int(held.size),
        "mismatches": int((held > THRESHOLD).sum()),
        "max_abs_diff": float(held.max()),
        "nonfinite_tokens": 0,
    }


@pytest.fixture(scope="module")
def masked_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("nemo-masked")
    rng = np.random.default_rng(4804)
    planted = [(1, 1, 1.5), (4, 0, 2.0), (4, 2, 0.7), (7, 3, 0.01)]
    samples = make_samples(rng, 10, lengths=(6, 12), planted=planted)
    samples[9].counts = False  # dropped by the run for another reason (a filtered sample)
    path, logged = write_nemo_rl_step_with_seq_threshold(tmp, 5, samples, SEQ_THRESHOLD)
    code, out, err = cli(
        "import", "--format", "nemo-rl", path, "--artifacts", tmp / "runs",
        "--experiment-id", "masked", "--json",
    )  # fmt: skip
    assert code == 1, err
    result = json.loads(out)["results"][0]
    comparison = json.loads((Path(result["attempt_dir"]) / "comparison.json").read_text())
    return {"tmp": tmp, "samples": samples, "logged": logged, "result": result, "c": comparison}


def test_nemo_rl_masked_the_drifting_sequences_before_logging(masked_run: dict[str, Any]) -> None:
    assert masked_run["logged"] == [True, False, True, True, False, True, True, True, True, False]


def test_the_verdict_keeps_the_logged_mask(masked_run: dict[str, Any]) -> None:
    samples = [
        Sample(**{**vars(s), "counts": kept})
        for s, kept in zip(masked_run["samples"], masked_run["logged"], strict=True)
    ]
    want = expected(samples)
    c = masked_run["c"]
    assert c["outcome"] == want.outcome == "MISMATCH"
    assert (
        (c["active_tokens"], c["mismatches"])
        == (want.active, want.mismatches)
        == (
            want.active,
            1,
        )
    )
    assert c["diagnostics"]["max_abs_diff"] == want.extra["max_abs_diff"]


def test_the_masked_samples_are_judged_apart(masked_run: dict[str, Any]) -> None:
    want = _masked_numpy(masked_run["samples"], masked_run["logged"])
    got = masked_run["c"]["diagnostics"]["masked_by_run"]
    assert {k: got[k] for k in ("samples", "tokens", "mismatches", "nonfinite_tokens")} == {
        k: want[k] for k in ("samples", "tokens", "mismatches", "nonfinite_tokens")
    }
    assert math.isclose(got["max_abs_diff"], want["max_abs_diff"], rel_tol=0, abs_tol=0)
    assert got["mismatches"] == 3 and got["max_abs_diff"] > 1.9
    # never counted in the verdict
    assert masked_run["c"]["active_tokens"] + got["tokens"] == expected(
        masked_run["samples"]
    ).active + sum(sum(s.mask) for s in masked_run["samples"] if not s.counts)


@pytest.mark.slow
def test_report_and_verify_show_what_the_run_masked(masked_run: dict[str, Any]) -> None:
    run = Path(masked_run["result"]["attempt_dir"]).parents[2]
    code, out, err = cli("verify", run)
    assert code == 0, err
    page = masked_run["tmp"] / "page.html"
    code, out, err = cli("report", run, "--json", "--html", page)
    assert code == 0, err
    (case,) = json.loads(out)["cases"]
    assert case["diagnostics"]["masked_by_run"] == masked_run["c"]["diagnostics"]["masked_by_run"]
    html = page.read_text()
    assert "masked by the run (for drift or another reason; not in the verdict)" in html
    assert "3 samples, " in html and ": 3 mismatches" in html


def test_import_shows_what_the_run_masked_beside_the_verdict(
    masked_run: dict[str, Any], tmp_path: Path
) -> None:
    want = _masked_numpy(masked_run["samples"], masked_run["logged"])
    assert masked_run["result"]["masked_by_run"] == masked_run["c"]["diagnostics"]["masked_by_run"]
    path = masked_run["tmp"] / "train_data_step5.jsonl"
    code, out, err = cli("import", "--format", "nemo-rl", path, "--artifacts", tmp_path)
    assert code == 1, err
    assert (
        f"step=5: the run masked 3 sample(s) itself (for drift or another reason): "
        f"{want['tokens']} tokens, 3 over the threshold, max |diff| {want['max_abs_diff']:.3e}; "
        "not in the verdict"
    ) in out


def test_a_run_that_masked_nothing_has_no_entry(tmp_path: Path) -> None:
    samples = make_samples(np.random.default_rng(4805), 4)
    path, logged = write_nemo_rl_step_with_seq_threshold(tmp_path, 1, samples, SEQ_THRESHOLD)
    assert all(logged)
    code, out, err = cli(
        "import", "--format", "nemo-rl", path, "--artifacts", tmp_path / "runs", "--json"
    )
    assert code == 0, err
    result = json.loads(out)["results"][0]
    comparison = json.loads((Path(result["attempt_dir"]) / "comparison.json").read_text())
    assert "masked_by_run" not in comparison["diagnostics"]
