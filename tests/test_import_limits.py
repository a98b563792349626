"""Import judges what it can and refuses, in one line and publishing nothing, what it could not
read back (issue 47, classes 2 and 3).

Class 2: an active token whose |diff| is past exp's range (710 nats and more; float16's
-65504 sentinel is realistic) is judged by the rule (the difference is finite) and the figures
that exponentiate are recorded as null (overflow); scores whose difference is not finite in
float64 (about 1e308) are INVALID_ARTIFACT for that step; an ignored member nested 5,000 deep
is one line. Class 3: a step or sample id of 2**64 or more, or an input named by bytes that
are not UTF-8, is refused before anything is published (anything import writes decodes, so
verify never rejects what import published). Expected values are recomputed here in numpy
float64.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from drift_testing import cli

THRESHOLD = 1e-3


def _row(step: int, rollout: list[float], training: list[float], **extra: Any) -> dict[str, Any]:
    return {
        "step": step,
        "sample": 0,
        "token_ids": list(range(1, len(rollout) + 2)),
        "prompt_length": 1,
        "mask": [1] * len(rollout),
        "rollout_logprobs": rollout,
        "training_logprobs": training,
        **extra,
    }


def _import(tmp_path: Path, lines: list[str], name: str = "run.jsonl") -> tuple[int, str, str]:
    source = tmp_path / name
    source.write_text("".join(line + "\n" for line in lines))
    return cli("import", "--format", "jsonl", source, "--artifacts", tmp_path / "out", "--json")


@pytest.mark.parametrize("rollout", [-1e4, -800.0, -65504.0, -3e4])
@pytest.mark.slow
def test_a_difference_past_exps_range_is_judged_and_its_exp_figures_overflow(
    tmp_path: Path, rollout: float
) -> None:
    rollout_lp, training_lp = [rollout, -0.5, -1.25], [-0.25, -0.5, -1.25]
    code, out, err = _import(tmp_path, [json.dumps(_row(1, rollout_lp, training_lp))])
    assert code == 1, err  # a MISMATCH was found
    (case,) = json.loads(out)["results"]
    diff = np.abs(np.array(training_lp, np.float64) - np.array(rollout_lp, np.float64))
    assert case["outcome"] == "MISMATCH"
    assert case["mismatches"] == int((diff > THRESHOLD).sum()) == 1
    assert case["max_abs_diff"] == float(diff.max())
    run = Path(json.loads(out)["run_dir"])
    (comparison,) = [json.loads(p.read_text()) for p in run.glob("cases/*/*/comparison.json")]
    diagnostics = comparison["diagnostics"]
    assert diagnostics["nemo_rl_token_mult_prob_error"] is None  # exp(|diff|) overflows
    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(diff).mean())
    assert diagnostics["mean_abs_diff"] == pytest.approx(diff.mean(), rel=1e-12)
    code, out, _ = cli("verify", run, "--json")
    assert code == 0 and json.loads(out)["invalid"] == 0
    # The report draws it too (float16's -65504 sentinel once failed its scatter's axis limits).
    code, out, err = cli("report", run, "--json", "--html", tmp_path / "page.html")
    assert (code, err) == (0, "")
    (shown,) = json.loads(out)["cases"]
    assert shown["outcome"] == "MISMATCH" and shown["mismatches"] == 1


def test_scores_whose_difference_overflows_are_an_invalid_artifact(tmp_path: Path) -> None:
    lines = [
        json.dumps(_row(1, [1e308, -0.5], [-1e308, -0.5])),
        json.dumps(_row(2, [-0.5, -0.5], [-0.5, -0.5])),
    ]
    code, out, err = _import(tmp_path, lines)
    assert code == 1, err
    cases = {c["label"]: c for c in json.loads(out)["results"]}
    assert cases["step=1"]["outcome"] == "INVALID_ARTIFACT"
    assert "overflows float64 at active position [0, 1]" in cases["step=1"]["reason"]
    assert cases["step=2"]["outcome"] == "PASS"
    code, _, _ = cli("verify", json.loads(out)["run_dir"])
    assert code == 0


def test_an_ignored_member_nested_5000_deep_is_one_line(tmp_path: Path) -> None:
    text = json.dumps(_row(1, [-0.5], [-0.5]))
    deep = text[:-1] + ', "extra": ' + "[" * 5000 + "]" * 5000 + "}"
    code, out, err = _import(tmp_path, [deep])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "run.jsonl:1: a member is nested deeper" in err
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


@pytest.mark.parametrize(
    ("row", "where"),
    [
        (_row(2**64, [-0.5], [-0.5]), "$.step: integer 18446744073709551616"),
        (_row(3, [-0.5], [-0.5], sample=2**70), "$.rows[0].sample"),
    ],
)
def test_an_id_of_64_bits_or_more_is_refused_and_nothing_published(
    tmp_path: Path, row: dict[str, Any], where: str
) -> None:
    code, out, err = _import(tmp_path, [json.dumps(_row(1, [-0.5], [-0.5])), json.dumps(row)])
    assert code == 2 and out == "", err
    assert err.count("\n") == 1 and where in err and "nothing is imported" in err
    assert os.listdir(tmp_path / "out") == []  # not even the staging directory


def test_an_input_named_by_bytes_that_are_not_utf8_is_refused(tmp_path: Path) -> None:
    name = os.fsdecode(b"\xff\xfe.jsonl")
    code, out, err = _import(tmp_path, [json.dumps(_row(1, [-0.5], [-0.5]))], name=name)
    assert code == 2 and out == "", err
    assert "lone surrogate" in err and "nothing is imported" in err
    assert os.listdir(tmp_path / "out") == []
