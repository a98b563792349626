"""The report's lead sentence says what the steps did (issue 47, class 8): drift that comes and
goes is not "stayed at 0%", and a run without a valid attempt is not "No step of the 0".

Each run is a neutral-format import whose per-step mismatch shares are chosen here, so the
sentence is checked against shares known in advance.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from drift_testing import cli


def _step(step: int, mismatching: int, tokens: int = 4) -> str:
    rollout = [-0.5] * tokens
    training = [-0.5 - (0.25 if i < mismatching else 0.0) for i in range(tokens)]
    return json.dumps(
        {
            "step": step,
            "sample": 0,
            "token_ids": list(range(1, tokens + 2)),
            "prompt_length": 1,
            "mask": [1] * tokens,
            "rollout_logprobs": rollout,
            "training_logprobs": training,
        }
    )


def _report(tmp_path: Path, mismatching: list[int]) -> tuple[Path, dict[str, Any]]:
    tmp_path.mkdir(exist_ok=True)
    source = tmp_path / "steps.jsonl"
    source.write_text("".join(_step(i + 1, m) + "\n" for i, m in enumerate(mismatching)))
    code, out, err = cli(
        "import", "--format", "jsonl", source, "--artifacts", tmp_path / "out", "--json"
    )
    assert code in (0, 1), err
    run = Path(json.loads(out)["run_dir"])
    code, out, err = cli("report", run, "--json", "--no-html")
    assert code in (0, 1), err
    return run, json.loads(out)


def test_pass_mismatch_pass_is_not_stayed_at_0(tmp_path: Path) -> None:
    _, report = _report(tmp_path, [0, 2, 0])
    assert report["steps"]["trend"] == (
        "The mismatch share came and went between 0% (step 1) and 50% (step 2) from step 1 "
        "to step 3; first MISMATCH at step 2 (1 of 3 judged steps MISMATCH)."
    )


def test_drift_on_many_steps_that_ends_at_0_is_counted(tmp_path: Path) -> None:
    shares = [0, 1, 0, 3, 0, 0, 2, 0]
    _, report = _report(tmp_path, shares)
    trend = report["steps"]["trend"]
    assert "stayed" not in trend
    assert "between 0% (step 1) and 75% (step 4)" in trend
    assert "(3 of 8 judged steps MISMATCH)" in trend


def test_monotone_drift_rises_and_steady_drift_stays(tmp_path: Path) -> None:
    _, report = _report(tmp_path / "rise", [0, 1, 1, 4])
    assert report["steps"]["trend"].startswith("The mismatch share rose from 0% at step 1 to 100%")
    _, report = _report(tmp_path / "stay", [2, 2, 2])
    assert report["steps"]["trend"].startswith("The mismatch share stayed at 50% from step 1")


def test_a_run_without_a_valid_attempt_says_so(tmp_path: Path) -> None:
    run, _ = _report(tmp_path, [0, 1])
    for comparison in run.glob("cases/*/*/comparison.json"):
        comparison.chmod(0o644)
        comparison.write_text(comparison.read_text().replace('"step=', '"stop='))
    code, out, err = cli("report", run, "--json", "--no-html")
    assert code == 0, err
    report = json.loads(out)
    assert report["findings"]["trend"] == (
        "No step has a valid attempt (verify lists why each is invalid)."
    )
