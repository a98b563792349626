"""verify cross-checks the weight documents where it can (issue 47, class 6).

Each edit of the issue is made to the baseline of the transformers bfloat16 run sealed by the
fourth wave's release (``tests/data/wave4``), re-sealed as anyone who can write an unkeyed run
can (``resealing``) and made self-consistent where the older check would have caught it (the
recorded differences still equal what the digests show): a rollout document claiming float32
in a bfloat16 case, checkpoint digests that disagree between the two sides for the same dtype,
a tensor dropped, added or listed twice on one side, dtype ``bfloat17``, a slice of rank 7 at
TP 1, a deleted ``weights_rollout.json``, a difference listed twice. verify must list the
attempt invalid, naming the weights file.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from resealing import reseal

from pytest_logprob_drift.check.verify import verify_run

RUN = Path(__file__).parent / "data" / "wave4" / "runs" / "wave4-hf-bf16"
ROLLOUT, TRAINING = "weights_rollout.json", "weights_training.json"


def _baseline(run: Path) -> Path:
    for attempt in sorted(run.glob("cases/*/*")):
        if json.loads((attempt / "comparison.json").read_text())["label"] == "baseline":
            return attempt
    raise AssertionError("no baseline")


def _float32(d: dict[str, Any]) -> None:
    d["dtype"] = "float32"
    for t in d["tensors"]:
        t["side_dtype"] = "float32"


def _disagreeing_checkpoint(d: dict[str, Any]) -> None:
    t = d["tensors"][0]
    t["checkpoint"] = t["side"] = "f" * 64  # the side equals "its" checkpoint: no difference


def _dropped(d: dict[str, Any]) -> None:
    d["tensors"].pop()


def _added(d: dict[str, Any]) -> None:
    d["tensors"].append({**d["tensors"][0], "name": "model.invented.weight"})


def _twice(d: dict[str, Any]) -> None:
    d["tensors"].append(dict(d["tensors"][0]))


def _bfloat17(d: dict[str, Any]) -> None:
    d["dtype"] = "bfloat17"
    for t in d["tensors"]:
        t["side_dtype"] = "bfloat17"


def _rank_7(d: dict[str, Any]) -> None:
    t = d["tensors"][0]
    t["slices"] = [
        {"rank": 7, "dim": 0, "start": 0, "stop": 1, "checkpoint": "a" * 64, "side": "a" * 64}
    ]


def _difference_twice(d: dict[str, Any]) -> None:
    difference = {
        "name": d["tensors"][0]["name"],
        "side": d["side"],
        "rank": None,
        "kind": "values",
        "detail": "invented",
    }
    d["differences"] = [difference, difference]


EDITS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "rollout claims float32 in a bfloat16 case": (_float32, "rollout.dtype=bfloat16"),
    "checkpoint digests disagree between the sides": (_disagreeing_checkpoint, "digest"),
    "a tensor dropped": (_dropped, "the other side does not"),
    "a tensor added": (_added, "lists tensor model.invented.weight"),
    "a tensor listed twice": (_twice, "listed twice"),
    "dtype bfloat17": (_bfloat17, "'bfloat17' is not a floating dtype"),
    "a slice of rank 7 at TP 1": (_rank_7, "rank 7 at tensor-parallel size 1"),
    "a difference listed twice": (_difference_twice, ""),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_resealed_weights_edit_is_invalid(tmp_path: Path, edit: str) -> None:
    run = tmp_path / RUN.name
    shutil.copytree(RUN, run)
    attempt = _baseline(run)
    path = attempt / ROLLOUT
    path.chmod(0o644)
    document = json.loads(path.read_text())
    change, detail = EDITS[edit]
    change(document)
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    reseal(run, path)
    (status,) = [s for s in verify_run(run) if s.attempt_id == attempt.name]
    assert status.status == "invalid", status
    assert status.file in (ROLLOUT, TRAINING)
    assert detail in status.detail


def test_a_deleted_rollout_document_is_invalid(tmp_path: Path) -> None:
    run = tmp_path / RUN.name
    shutil.copytree(RUN, run)
    attempt = _baseline(run)
    (attempt / ROLLOUT).chmod(0o644)
    (attempt / ROLLOUT).unlink()
    complete = attempt / "COMPLETE"
    complete.chmod(0o644)
    seal = json.loads(complete.read_text())
    del seal["files"][ROLLOUT]
    complete.write_text(json.dumps(seal, indent=2, sort_keys=True) + "\n")
    reseal(run, complete)
    (status,) = [s for s in verify_run(run) if s.attempt_id == attempt.name]
    assert (status.status, status.file) == ("invalid", ROLLOUT)
    assert "not sealed, but weights_training.json is" in status.detail


def test_the_unedited_run_verifies(tmp_path: Path) -> None:
    assert {s.status for s in verify_run(RUN)} == {"ok"}
