"""What import publishes and the exit code that says so (issue 47, class 5 and the lesser items).

Exit 2 means nothing was published: a prompt file that cannot be written once the run is
published (no judged sample, a directory that takes no file) is one line on stderr and the
run's own exit code, and the run verifies. ``import`` takes ``run``'s seal key options, so a
keyed verify accepts the import. A staging directory left by an import that was killed is
removed by the next import; a running import's is never touched.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from drift_testing import REPO, cli

NEMO_RL = REPO / "experiments" / "production" / "nemo-rl"


def _line(step: int, mask: list[int]) -> str:
    return json.dumps(
        {
            "step": step,
            "sample": 0,
            "token_ids": list(range(1, len(mask) + 2)),
            "prompt_length": 1,
            "mask": mask,
            "rollout_logprobs": [-0.5] * len(mask),
            "training_logprobs": [-0.75] * len(mask),
        }
    )


def _import(
    tmp_path: Path, lines: list[str], *extra: str | Path
) -> tuple[int, dict[str, Any], str]:
    source = tmp_path / "run.jsonl"
    source.write_text("".join(line + "\n" for line in lines))
    code, out, err = cli(
        "import", "--format", "jsonl", source, "--artifacts", tmp_path / "out", "--json", *extra
    )
    return code, (json.loads(out) if out.strip() else {}), err


def test_worst_without_a_judged_step_publishes_and_says_the_file_was_not_written(
    tmp_path: Path,
) -> None:
    prompts = tmp_path / "worst.json"
    code, result, err = _import(
        tmp_path, [_line(1, [0, 0]), _line(2, [0, 0])], "--worst", "2", "--prompts-out", prompts
    )
    assert code == 1  # the run's own code: ZERO_ACTIVE_TOKENS steps, not "nothing published"
    assert [r["outcome"] for r in result["results"]] == ["ZERO_ACTIVE_TOKENS"] * 2
    assert err.count("\n") == 1
    assert f"{prompts} was not written (--worst: no sample to write" in err
    assert f"the run is published at {result['run_dir']}" in err
    assert not prompts.exists()
    code, _, _ = cli("verify", result["run_dir"])
    assert code == 0


def test_a_prompt_file_the_directory_cannot_take_keeps_the_runs_code(tmp_path: Path) -> None:
    prompts = "/proc/self/worst-prompts.json"  # a directory that takes no new file
    code, result, err = _import(
        tmp_path, [_line(1, [1, 1])], "--worst", "1", "--prompts-out", prompts
    )
    assert code == 1, err  # the step is a MISMATCH (|diff| 0.25)
    assert err.count("\n") == 1 and f"{prompts} was not written" in err
    assert Path(result["run_dir"]).is_dir()
    rerun, _, again = _import(tmp_path, [_line(1, [1, 1])])
    assert rerun == 2 and "a run directory of that name exists" in again


def test_import_seals_with_the_key_a_keyed_verify_checks(tmp_path: Path) -> None:
    key, other = tmp_path / "key", tmp_path / "other"
    key.write_bytes(os.urandom(32))
    other.write_bytes(os.urandom(32))
    code, out, err = cli(
        "import", "--format", "nemo-rl", NEMO_RL, "--artifacts", tmp_path / "out",
        "--seal-key-file", key, "--json",
    )  # fmt: skip
    assert code == 1, err
    run = json.loads(out)["run_dir"]
    code, out, _ = cli("verify", run, "--seal-key-file", key, "--json")
    assert code == 0 and json.loads(out)["invalid"] == 0
    code, out, _ = cli("verify", run, "--seal-key-file", other, "--json")
    assert code == 1 and json.loads(out)["invalid"] > 0


def test_an_abandoned_staging_directory_is_removed_a_live_one_kept(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    dead = out / ".import-999999999-0123456789abcdef"  # beyond any pid: no such process
    live = out / f".import-{os.getpid()}-0123456789abcdef"
    other = out / ".import-notes"
    for directory in (dead, live, other):
        directory.mkdir()
        (directory / "token_diffs.pt").write_bytes(b"x" * 1024)
    code, _, err = _import(tmp_path, [_line(1, [1, 1])])
    assert code == 1, err
    assert not dead.exists()
    assert live.is_dir() and other.is_dir()


def test_positive_logprobs_are_judged_and_said(tmp_path: Path) -> None:
    line = json.loads(_line(4, [1, 1, 1]))
    line["rollout_logprobs"] = [0.25, -0.5, 1e-7]
    code, result, err = _import(tmp_path, [json.dumps(line)])
    assert code == 1
    assert result["results"][0]["outcome"] == "MISMATCH"
    assert err == (
        "logprob-drift: note: step 4: 2 active logprob(s) above 0 (a logprob is at most 0; "
        "judged as logged)\n"
    )
