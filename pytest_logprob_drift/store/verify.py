"""Offline verification of a whole run directory.

Owns walking every attempt of a run and classifying it: ``ok`` (seal intact, every verdict
recomputed from the sealed tensors agrees), ``incomplete`` (never sealed; resume ignores it) or
``invalid`` (naming the file at fault). Reads through ``store.resume``'s checks only and never
writes anything. Knows nothing about engines, runtimes or how results are printed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_logprob_drift.errors import UsageError
from pytest_logprob_drift.store.artifacts import COMPLETE, SealError, iter_attempt_dirs
from pytest_logprob_drift.store.resume import check_attempt


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptStatus:
    case_id: str
    attempt_id: str
    status: str
    """``ok``, ``incomplete`` or ``invalid``."""
    outcome: str | None = None
    file: str | None = None
    detail: str = ""

    def to_json(self) -> dict[str, str]:
        entry = {"case_id": self.case_id, "attempt_id": self.attempt_id, "status": self.status}
        if self.outcome is not None:
            entry["outcome"] = self.outcome
        if self.file is not None:
            entry["file"] = self.file
        if self.detail:
            entry["detail"] = self.detail
        return entry


def require_run_dir(run_dir: Path) -> None:
    if not (run_dir / "cases").is_dir():
        raise UsageError(f"{run_dir}: not a run directory (no cases/ inside)")


def verify_run(run_dir: Path) -> list[AttemptStatus]:
    """The status of every attempt under ``run_dir``, in case then attempt order."""
    require_run_dir(run_dir)
    statuses: list[AttemptStatus] = []
    for attempt in iter_attempt_dirs(run_dir):
        ids = {"case_id": attempt.parent.name, "attempt_id": attempt.name}
        if not (attempt / COMPLETE).exists():
            statuses.append(
                AttemptStatus(
                    **ids,
                    status="incomplete",
                    detail="no COMPLETE: never sealed; ignored by resume",
                )
            )
            continue
        try:
            checked = check_attempt(attempt, expected_key=None)
        except SealError as exc:
            statuses.append(
                AttemptStatus(**ids, status="invalid", file=exc.file, detail=exc.message)
            )
            continue
        statuses.append(AttemptStatus(**ids, status="ok", outcome=checked.outcome.value))
    return statuses
