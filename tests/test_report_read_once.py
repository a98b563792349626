"""``report`` reads each attempt once: it renders from the attempts ``verify_run`` checked.

Every file of every attempt of the sealed runs of earlier releases (``tests/data/wave4``: an
executed run, layer captures, weight digests, three imports) is opened exactly once by
``load_report`` (the check, whose bytes and decoded documents the report keeps), counted
through ``os.open`` in process. A file changed after the check is not what the page shows
(the checked bytes are); past the report's memory budget a tensor is read again and a change
is refused, naming the file.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch

from pytest_logprob_drift.check.verify import verify_run
from pytest_logprob_drift.report import load
from pytest_logprob_drift.report.load import load_report
from pytest_logprob_drift.store import layout

WAVE4 = Path(__file__).resolve().parent / "data" / "wave4" / "runs"
RUNS = sorted(p.name for p in WAVE4.iterdir())


def _opens(monkeypatch: pytest.MonkeyPatch, root: Path) -> Counter[Path]:
    """Every ``os.open`` of a path under ``root``, counted (the store opens each sealed file
    through ``store.files.open_regular``)."""
    opened: Counter[Path] = Counter()
    real_open = os.open
    resolved = root.resolve()

    def counting_open(path: str | os.PathLike[str], *args: int, **kwargs: int) -> int:
        target = Path(os.fsdecode(path)).resolve()
        if target.is_relative_to(resolved):
            opened[target] += 1
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    return opened


def _attempt_files(run_dir: Path) -> set[Path]:
    return {p.resolve() for p in (run_dir / layout.CASES).glob("*/*/*") if p.is_file()}


@pytest.mark.parametrize("run", RUNS)
def test_the_report_opens_each_attempt_file_once(
    run: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = WAVE4 / run
    files = _attempt_files(run_dir)
    assert len(files) >= 2 * 7, files  # a seal and its documents and tensors per attempt
    opened = _opens(monkeypatch, run_dir / layout.CASES)
    data = load_report(run_dir, page_dir=tmp_path)
    monkeypatch.undo()
    assert {p for p in opened if p.is_file()} == files
    assert {p: n for p, n in opened.items() if n != 1} == {}
    # what was read once is what is shown: every case with a valid attempt is shown from it
    shown = [c for c in data.cases if c.attempt_id is not None]
    assert shown and len(shown) == len({s.case_id for s in data.statuses if s.status == "ok"})
    assert all(s.status == "ok" for s in data.statuses)


def _copy(tmp_path: Path, run: str) -> Path:
    target = tmp_path / "runs" / run
    shutil.copytree(WAVE4 / run, target)
    return target


def _change_after_the_check(monkeypatch: pytest.MonkeyPatch, run_dir: Path, case_id: str) -> Path:
    """token_diffs.pt of ``case_id``'s attempt rewritten (rollout logprobs shifted by 1.0)
    right after ``verify_run`` checked the run: the window between check and use."""
    (attempt,) = (run_dir / layout.CASES / case_id).iterdir()
    path = attempt / layout.TOKEN_DIFFS

    def verify_then_change(run: Path, **kwargs: object) -> object:
        statuses = verify_run(run, **kwargs)  # type: ignore[arg-type]
        tensors = torch.load(path, weights_only=True)
        tensors["rollout_logprobs"] = tensors["rollout_logprobs"] + 1.0
        torch.save(tensors, path)
        return statuses

    monkeypatch.setattr(load, "verify_run", verify_then_change)
    return path


def test_a_file_changed_after_the_check_is_not_what_the_page_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = _copy(tmp_path, "wave4-cpu-smoke")
    before = load_report(run_dir, page_dir=tmp_path)
    case = next(c for c in before.cases if c.detail is not None)
    _change_after_the_check(monkeypatch, run_dir, case.case_id)
    after = load_report(run_dir, page_dir=tmp_path)
    assert after.statuses == before.statuses
    (same,) = (c for c in after.cases if c.case_id == case.case_id)
    assert same.detail is not None and case.detail is not None
    assert same.detail.worst == case.detail.worst  # the checked bytes, not the changed file
    # the file did change: a fresh check refuses it, naming it
    bad = [s for s in verify_run(run_dir) if s.case_id == case.case_id]
    assert [(s.status, s.file) for s in bad] == [("invalid", layout.TOKEN_DIFFS)]


def test_past_the_memory_budget_a_tensor_is_read_again_and_a_change_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = _copy(tmp_path, "wave4-cpu-smoke")
    before = load_report(run_dir, page_dir=tmp_path)
    case = next(c for c in before.cases if c.detail is not None)
    monkeypatch.setattr(load, "HELD_BYTES", 0)  # no bytes kept: documents only
    _change_after_the_check(monkeypatch, run_dir, case.case_id)
    after = load_report(run_dir, page_dir=tmp_path)
    late = after.statuses[len(before.statuses) :]
    assert [(s.case_id, s.status, s.file) for s in late] == [
        (case.case_id, "invalid", layout.TOKEN_DIFFS)
    ]
    assert "SHA-256" in late[0].detail
    (same,) = (c for c in after.cases if c.case_id == case.case_id)
    assert same.detail is None  # nothing of the changed file is plotted
    assert same.outcome == case.outcome  # its checked comparison still gives its row
