"""Each imported step's ``imported.json`` v2 (and v3) holds its inputs' SHA-256 (issue 57): per
input file for NeMo-RL and slime (per rank file for slime's per-rank dumps), the step's own lines
for the neutral format; checked against ``hashlib`` of the written bytes here. Verify checks the
field's form and that it agrees with ``rows_sha256`` where the inputs determine it; a v1 step
(no digests) still verifies, in a run imported at once (tests/test_wave4_runs.py) and in a run
followed before the digests (tests/data/before_issue57)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from drift_testing import cli
from production_dumps import (
    make_samples,
    neutral_rows,
    write_jsonl,
    write_nemo_rl_step,
    write_slime_rank_dumps,
)
from resealing import reseal


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _import(fmt: str, source: Path, runs: Path, *extra: str) -> Path:
    code, out, err = cli("import", "--format", fmt, source, "--artifacts", runs, "--json", *extra)
    assert code in (0, 1), out + err
    return Path(json.loads(out)["run_dir"])


def _steps(run_dir: Path) -> dict[int, tuple[Path, dict[str, Any]]]:
    found = {}
    for complete in run_dir.glob("cases/*/*/COMPLETE"):
        document = json.loads((complete.parent / "imported.json").read_text())
        found[document["step"]] = (complete.parent, document)
    return found


def _verify(run_dir: Path) -> tuple[int, str]:
    code, out, err = cli("verify", run_dir)
    return code, out + err


@pytest.fixture(scope="module")
def nemo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("digests-nemo")
    logs = root / "logs"
    logs.mkdir()
    rng = np.random.default_rng(57)
    for step in (1, 2):
        write_nemo_rl_step(logs, step, make_samples(rng, 3))
    return logs, _import("nemo-rl", logs, root / "runs")


def test_a_nemo_rl_step_holds_its_files_sha256(nemo_run: tuple[Path, Path]) -> None:
    logs, run_dir = nemo_run
    steps = _steps(run_dir)
    assert sorted(steps) == [1, 2]
    for step, (_, document) in steps.items():
        data = (logs / f"train_data_step{step}.jsonl").read_bytes()
        assert document["schema_version"] == "cross_config.imported_step.v3"
        assert document["input_digests"] == [{"sha256": _sha(data), "size": len(data)}]
        assert document["rows_sha256"] == _sha(data)
    assert _verify(run_dir)[0] == 0


def test_a_neutral_step_holds_the_sha256_of_its_own_lines(tmp_path: Path) -> None:
    """One file holding two steps: each step's digest covers exactly its lines."""
    rng = np.random.default_rng(5)
    rows = {k: neutral_rows(k, make_samples(rng, 3)) for k in (4, 9)}
    path = write_jsonl(tmp_path / "run.jsonl", rows[4] + rows[9])
    lines = path.read_bytes().splitlines(keepends=True)
    run_dir = _import("jsonl", path, tmp_path / "runs")
    steps = _steps(run_dir)
    for k, first in ((4, 0), (9, 3)):
        own = b"".join(lines[first : first + 3])
        document = steps[k][1]
        assert document["input_digests"] == [{"sha256": _sha(own), "size": len(own)}]
        assert [r["line"] for r in document["rows"]] == [first + 1, first + 2, first + 3]
    assert _verify(run_dir)[0] == 0


def test_a_neutral_step_over_two_files_holds_each_files_part(tmp_path: Path) -> None:
    """Step 1 begins in one file and ends in the next, where step 2 follows: step 1 holds
    the SHA-256 of its lines of each file, step 2 of its own lines of the second."""
    rng = np.random.default_rng(8)
    one, two = neutral_rows(1, make_samples(rng, 3)), neutral_rows(2, make_samples(rng, 2))
    (tmp_path / "in").mkdir()
    a = write_jsonl(tmp_path / "in" / "a.jsonl", one[:2])
    b = write_jsonl(tmp_path / "in" / "b.jsonl", one[2:] + two)
    b_lines = b.read_bytes().splitlines(keepends=True)
    run_dir = _import("jsonl", tmp_path / "in", tmp_path / "runs")
    steps = _steps(run_dir)

    def digest(data: bytes) -> dict[str, Any]:
        return {"sha256": _sha(data), "size": len(data)}

    assert [Path(p).name for p in steps[1][1]["inputs"]] == ["a.jsonl", "b.jsonl"]
    assert steps[1][1]["input_digests"] == [digest(a.read_bytes()), digest(b_lines[0])]
    assert steps[1][1]["rows_sha256"] == _sha(a.read_bytes() + b_lines[0])
    assert steps[2][1]["input_digests"] == [digest(b"".join(b_lines[1:]))]
    assert _verify(run_dir)[0] == 0


def test_a_per_rank_slime_step_holds_each_ranks_sha256(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    files = write_slime_rank_dumps(tmp_path / "dump", 3, make_samples(rng, 4))
    run_dir = _import("slime", tmp_path / "dump", tmp_path / "runs")
    ((_, document),) = _steps(run_dir).values()
    by_name = {Path(p).name: d for p, d in zip(document["inputs"], document["input_digests"],
                                               strict=True)}  # fmt: skip
    assert by_name == {
        f.name: {"sha256": _sha(f.read_bytes()), "size": f.stat().st_size} for f in files
    }
    ranks = hashlib.sha256()
    for digest in document["input_digests"]:
        ranks.update(bytes.fromhex(digest["sha256"]))
    assert document["rows_sha256"] == ranks.hexdigest()
    assert _verify(run_dir)[0] == 0


def test_a_step_keeps_its_case_id_across_forms(tmp_path: Path) -> None:
    """The example NeMo-RL dumps imported now (v3 steps) are the cases of the run sealed from
    them by an earlier release (tests/data/wave4, v1 steps): the form is not the step."""
    root = Path(__file__).resolve().parent.parent
    earlier = root / "tests/data/wave4/runs/wave4-nemo-rl"
    forms = {json.loads(p.read_text())["schema_version"] for p in earlier.glob("cases/*/*/*.json")
             if p.name == "imported.json"}  # fmt: skip
    assert forms == {"cross_config.imported_step.v1"}
    run_dir = _import("nemo-rl", root / "experiments/production/nemo-rl", tmp_path / "runs")
    now = _steps(run_dir)
    assert {d["schema_version"] for _, d in now.values()} == {"cross_config.imported_step.v3"}
    assert {a.parent.name for a, _ in now.values()} == {
        p.name for p in (earlier / "cases").iterdir()
    }


def _edited(nemo_run: tuple[Path, Path], tmp_path: Path, edit: Any) -> tuple[int, str]:
    """A copy of the NeMo-RL run with step 1's imported.json edited and resealed, verified."""
    run_dir = tmp_path / "run"
    shutil.copytree(nemo_run[1], run_dir)
    attempt, document = _steps(run_dir)[1]
    edit(document)
    path = attempt / "imported.json"
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    reseal(run_dir, path)
    return _verify(run_dir)


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (
            lambda d: d["input_digests"][0].update(sha256="ab" * 32),
            "is not what its input_digests make for a nemo-rl step of 1 input file(s)",
        ),
        (
            lambda d: d["input_digests"][0].update(sha256="XYZ"),
            "$.input_digests[0].sha256",
        ),
        (
            lambda d: d["input_digests"][0].update(size=-1),
            "$.input_digests[0].size",
        ),
        (lambda d: d["input_digests"].append(d["input_digests"][0]), "2 input digest(s) for 1"),
        (lambda d: d.pop("input_digests"), "cross_config.imported_step.v3 requires input_digests"),
        (
            lambda d: d.update(schema_version="cross_config.imported_step.v1"),
            "a cross_config.imported_step.v1 document has no input_digests",
        ),
    ],
)
def test_a_steps_input_digests_are_checked(
    nemo_run: tuple[Path, Path], tmp_path: Path, edit: Any, needle: str
) -> None:
    code, out = _edited(nemo_run, tmp_path, edit)
    assert code != 0
    assert "imported.json" in out and needle in out, out


BEFORE_ISSUE57 = Path(__file__).resolve().parent / "data" / "before_issue57" / "runs"
EXAMPLE_DUMPS = Path(__file__).resolve().parents[1] / "experiments" / "production" / "nemo-rl"


def _outcomes(run_dir: Path) -> dict[int, str]:
    """Each step's outcome as ``report --json`` gives it."""
    code, out, err = cli("report", run_dir, "--json", "--no-html")
    assert code in (0, 1), out + err
    cases = json.loads(out)["cases"]
    return {int(case["label"].removeprefix("step=")): case["outcome"] for case in cases}


def test_a_run_followed_before_the_digests_verifies_reports_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run followed by the release before the digests (v1 steps under a followed
    experiment.json, sealed at 5b7a035 from the example NeMo-RL dumps) still verifies and
    reports with its outcomes; following the same dumps again into it adds nothing, and a new
    step joins it as v3 (its own document set) beside the v1 steps, the whole run still
    verifying."""
    run = tmp_path / "runs" / "follow-nemo-rl-before-issue57"
    shutil.copytree(BEFORE_ISSUE57 / run.name, run)
    steps = _steps(run)
    assert {doc["schema_version"] for _, doc in steps.values()} == {"cross_config.imported_step.v1"}
    code, out = _verify(run)
    assert code == 0 and "6 attempt(s), 0 attribution(s), 0 invalid" in out, out
    before = _outcomes(run)
    # the outcomes the example dumps are built to give (scripts/make_example_dumps.py):
    # steps 1-2 all float32, steps 3-6 with bfloat16 rollouts
    assert before == {1: "PASS", 2: "PASS", 3: "MISMATCH", 4: "MISMATCH", 5: "MISMATCH",
                      6: "MISMATCH"}  # fmt: skip

    # the run names the directory as it was given (relative to the repository root)
    monkeypatch.chdir(tmp_path)
    logs = Path("experiments/production/nemo-rl")
    shutil.copytree(EXAMPLE_DUMPS, logs)
    follow = ("import", "--format", "nemo-rl", "--follow", logs, "--artifacts", run.parent,
              "--settle", "0", "--idle", "0.3", "--poll", "0.02",
              "--experiment-id", run.name)  # fmt: skip
    code, out, err = cli(*follow)
    assert code == 1, out + err  # steps 3-6 are MISMATCH, as when first followed
    assert "(sealed:" not in out and out.count("(already sealed: cases/") == 6, out
    assert len(_steps(run)) == 6

    write_nemo_rl_step(logs, 7, make_samples(np.random.default_rng(7), 3))
    code, out, err = cli(*follow)
    assert code == 1, out + err
    assert out.count("(sealed: cases/") == 1 and out.count("(already sealed: cases/") == 6, out
    steps = _steps(run)
    assert sorted(steps) == [1, 2, 3, 4, 5, 6, 7]
    data = (logs / "train_data_step7.jsonl").read_bytes()
    assert steps[7][1]["schema_version"] == "cross_config.imported_step.v3"
    assert steps[7][1]["input_digests"] == [{"sha256": _sha(data), "size": len(data)}]
    code, out = _verify(run)
    assert code == 0 and "7 attempt(s), 0 attribution(s), 0 invalid" in out, out
    after = _outcomes(run)
    assert {step: after[step] for step in before} == before
