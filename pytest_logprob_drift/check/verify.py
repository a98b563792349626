"""Offline verification of a whole run directory.

Owns walking every attempt of a run and classifying it: ``ok`` (seal intact, every verdict
recomputed from the sealed tensors agrees), ``incomplete`` (never sealed; resume ignores it),
``invalid`` (naming the file at fault; also a sealed attempt of a case that no row of
``plan.jsonl`` has) or, under a seal key, ``superseded`` (an intact attempt
or run seal made without the key, which a seal made with the key replaces); and checking the
run's own files against their run seals (``experiment.json`` and every sealed prefix of
``plan.jsonl``; rows appended after the last seal are ``incomplete``). Reads through
``check.resume``'s checks only and never writes anything, so a read-only run verifies. Knows
nothing about engines, runtimes or how results are printed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from pytest_logprob_drift.check.resume import (
    CheckedAttempt,
    check_attempt,
    load_sealed_document,
)
from pytest_logprob_drift.errors import StorageError, UsageError
from pytest_logprob_drift.numerics.gates import GateResult
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.attempt import ATTEMPT_SEAL, read_seal
from pytest_logprob_drift.store.decode import JSONDocumentError, decode
from pytest_logprob_drift.store.documents import (
    ExperimentDocument,
    FollowedImportSource,
    ImportedStep,
    ImportSource,
    PlanRow,
)
from pytest_logprob_drift.store.files import check_directory, read_regular
from pytest_logprob_drift.store.keys import active_key, sealing_with
from pytest_logprob_drift.store.run import (
    RUN_SEAL,
    iter_attempt_dirs,
    parse_plan_log,
    read_plan_log,
    read_run_seal,
    run_seals,
)
from pytest_logprob_drift.store.seal import (
    Manifest,
    SealError,
    SealForm,
    check_mac,
    read_manifest,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptStatus:
    case_id: str
    attempt_id: str
    status: str
    """``ok``, ``incomplete``, ``invalid`` or (under a seal key) ``superseded``."""
    outcome: str | None = None
    file: str | None = None
    detail: str = ""
    gates: tuple[GateResult, ...] = ()
    """The frameworks' gates of a valid judged attempt (``CheckedAttempt.gates``; not in
    ``verify``'s output)."""

    @classmethod
    def refused(cls, case_id: str, attempt_id: str, exc: SealError) -> AttemptStatus:
        """The attempt is invalid for the reason ``exc`` gives, naming its file."""
        return cls(
            case_id=case_id,
            attempt_id=attempt_id,
            status="invalid",
            file=exc.file,
            detail=exc.message,
        )

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
    """``run_dir`` holds ``cases/`` (a UsageError otherwise) and none of its directories is a
    symbolic link (a StorageError: whatever a link points to is not this run's)."""
    try:
        is_run = (run_dir / layout.CASES).is_dir()
    except OSError as exc:  # e.g. permission denied on a parent
        raise StorageError(run_dir, "read it", exc) from None
    if not is_run:
        raise UsageError(f"{run_dir}: not a run directory (no cases/ inside)")
    paths = layout.RunLayout(run_dir)
    for path in (paths.cases, paths.seals, paths.attributions):
        try:
            check_directory(path)
        except OSError as exc:
            raise StorageError(path, "read it", exc) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFileStatus:
    """A run-level file (``experiment.json``, ``plan.jsonl``, a run seal) and its status."""

    file: str
    status: str
    """``ok``, ``incomplete``, ``invalid`` or (under a seal key) ``superseded``."""
    detail: str = ""

    def to_json(self) -> dict[str, str]:
        entry = {"file": self.file, "status": self.status}
        if self.detail:
            entry["detail"] = self.detail
        return entry


def _regular(path: Path) -> bytes | None:
    try:
        return read_regular(path)
    except FileNotFoundError:
        return None


def verify_run_files(run_dir: Path) -> list[RunFileStatus]:
    """``experiment.json`` and ``plan.jsonl`` against every run seal (oldest first): each seal
    must hold the digest of experiment.json and of the plan's first ``bytes`` bytes (so a
    rewrite of anything already sealed is invalid); what follows the last seal is incomplete."""
    require_run_dir(run_dir)
    try:
        experiment = _regular(run_dir / layout.EXPERIMENT)
        plan = _regular(run_dir / layout.PLAN) or b""
        seals = run_seals(run_dir)
    except OSError as exc:  # NotRegularFileError included
        name = Path(str(exc.filename or layout.EXPERIMENT)).name
        return [RunFileStatus(file=name, status="invalid", detail=f"unreadable: {exc}")]
    statuses: list[RunFileStatus] = []
    if experiment is None:
        statuses.append(RunFileStatus(file=layout.EXPERIMENT, status="invalid", detail="missing"))
    if not seals:
        statuses.append(
            RunFileStatus(
                file=layout.SEALS,
                status="incomplete",
                detail="experiment.json and plan.jsonl are not sealed (no run seal yet)",
            )
        )
    seal_statuses: list[tuple[int, RunFileStatus, bool]] = []
    for length, path in seals:
        checked = _seal_problem(path, experiment)
        problem = checked if isinstance(checked, str) else None
        if isinstance(checked, Manifest):  # the seal: check the plan prefix it seals
            prefix = checked.files[layout.PLAN]
            if length > len(plan):
                problem = f"plan.jsonl has {len(plan)} bytes, the seal covers {length}: truncated"
            elif prefix.length != length or not prefix.matches(plan):
                problem = (
                    f"plan.jsonl's first {length} bytes do not match the seal "
                    "(rewritten after it was sealed)"
                )
        name = f"{layout.SEALS}/{path.name}"
        seal_status = RunFileStatus(
            file=name, status="ok" if problem is None else "invalid", detail=problem or ""
        )
        seal_statuses.append((length, seal_status, _unkeyed(path, RUN_SEAL)))
    statuses.extend(_superseded(seal_statuses))
    log = parse_plan_log(plan)
    covered = max((length for length, _ in seals), default=0)
    invalid = log.invalid_lines(covered)
    if invalid:
        line, why = invalid[0]
        statuses.append(
            RunFileStatus(
                file=layout.PLAN,
                status="invalid",
                detail=f"sealed line {line} is not a plan row ({why})",
            )
        )
        return statuses
    if experiment is not None:
        statuses.extend(_experiment_problems(run_dir, experiment, log.rows))
    notes = log.notes(Path(layout.PLAN), covered)
    sealed = seals[-1][0] if seals else len(plan)
    if len(plan) > sealed:
        notes.insert(0, f"{len(plan) - sealed} byte(s) after the last run seal are not sealed")
    status = "incomplete" if notes else "ok"
    statuses.append(RunFileStatus(file=layout.PLAN, status=status, detail="; ".join(notes)))
    return statuses


def _experiment_problems(
    run_dir: Path, experiment: bytes, rows: tuple[PlanRow, ...]
) -> list[RunFileStatus]:
    """experiment.json as the read model decodes it (the report refuses what does not), and
    an imported run's step and sample counts against its plan and its steps' imported.json."""
    try:
        document = decode(experiment, ExperimentDocument)
    except JSONDocumentError as exc:
        return [RunFileStatus(file=layout.EXPERIMENT, status="invalid", detail=str(exc))]
    source = document.imported
    if isinstance(source, FollowedImportSource):
        return []  # no whole-run counts; each step's own imported.json form is its check
    if not isinstance(source, ImportSource):
        return []
    steps = len({row.case_id for row in rows})
    if source.steps != steps:
        return [
            RunFileStatus(
                file=layout.EXPERIMENT,
                status="invalid",
                detail=f"$.imported.steps is {source.steps}, plan.jsonl has {steps} step(s)",
            )
        ]
    samples = sum(_imported_samples(attempt) for attempt in iter_attempt_dirs(run_dir))
    if source.samples != samples:
        return [
            RunFileStatus(
                file=layout.EXPERIMENT,
                status="invalid",
                detail=f"$.imported.samples is {source.samples}, the steps' imported.json name "
                f"{samples}",
            )
        ]
    return []


def _imported_step(attempt: Path) -> ImportedStep | None:
    """A sealed imported step's imported.json (None where it cannot be read: the attempt's
    own check says why)."""
    try:
        seal = read_seal(attempt, keep=(layout.IMPORTED,), every=False)
        if layout.IMPORTED not in seal.files:
            return None
        return load_sealed_document(attempt, layout.IMPORTED, seal, ImportedStep)
    except (SealError, OSError):
        return None


def _imported_samples(attempt: Path) -> int:
    """How many source rows a sealed imported step names (0 where it cannot be read: the
    attempt's own check says why)."""
    imported = _imported_step(attempt)
    return 0 if imported is None else imported.samples


def _unkeyed(path: Path, form: SealForm) -> bool:
    """Whether a seal (of ``form``) is well formed and carries no MAC (made without a key)."""
    try:
        return read_manifest(path, form, name=path.name).mac is None
    except SealError:
        return False


def _unkeyed_problem(attempt: Path) -> SealError | None:
    """What is wrong with an unkeyed attempt as a plain SHA-256 manifest (None: nothing)."""
    with sealing_with(None):
        try:
            check_attempt(attempt, expected_key=None)
        except SealError as exc:
            return exc
    return None


def _superseded(seals: list[tuple[int, RunFileStatus, bool]]) -> list[RunFileStatus]:
    """Under a seal key, an unkeyed run seal that a later seal valid under the key covers
    (a keyed resume of a run first sealed without a key) is ``superseded``, not invalid: the
    keyed seal vouches for every byte the unkeyed one did."""
    if active_key() is None:
        return [status for _, status, _ in seals]
    covered = max((length for length, s, _ in seals if s.status == "ok"), default=-1)
    return [
        RunFileStatus(
            file=status.file,
            status="superseded",
            detail="sealed without a key; a later seal made with the key covers these bytes",
        )
        if unkeyed and status.status == "invalid" and length <= covered
        else status
        for length, status, unkeyed in seals
    ]


def _seal_problem(path: Path, experiment: bytes | None) -> str | Manifest:
    """Why a run seal is not valid for ``experiment``, or the seal when it is."""
    try:
        manifest = read_run_seal(path)
        check_mac(manifest, path.name)
    except SealError as exc:
        return exc.message
    if experiment is None or not manifest.files[layout.EXPERIMENT].matches(experiment):
        return "experiment.json does not match the seal (rewritten after it was sealed)"
    return manifest


def planned_cases(run_dir: Path) -> dict[str, tuple[PlanRow, ...]]:
    """The rows of the run's ``plan.jsonl`` by case id (none when it cannot be read)."""
    try:
        rows = read_plan_log(run_dir).rows
    except (OSError, StorageError):
        return {}
    planned: dict[str, tuple[PlanRow, ...]] = {}
    for row in rows:
        planned[row.case_id] = (*planned.get(row.case_id, ()), row)
    return planned


def _plan_disagrees(rows: tuple[PlanRow, ...], label: str, threshold: float) -> str | None:
    """How the plan's rows of a case disagree with its attempt's comparison (None: they do
    not): the label and the threshold the plan promised."""
    for row in rows:
        if row.label != label:
            return f"plan.jsonl labels case {row.case_id} {row.label!r}, its attempt {label!r}"
        if row.threshold != threshold:
            return (
                f"plan.jsonl gives case {row.case_id} threshold {row.threshold!r}, its attempt "
                f"was judged with {threshold!r}"
            )
    return None


class _AttemptIds(TypedDict):
    case_id: str
    attempt_id: str


def verify_run(
    run_dir: Path, *, on_ok: Callable[[CheckedAttempt], None] | None = None
) -> list[AttemptStatus]:
    """The status of every attempt under ``run_dir``, in case then attempt order. Under a seal
    key, an attempt sealed without any key is ``superseded`` (not invalid) when its case has an
    attempt valid under the key: keyed resume re-executed it and never reuses it.

    ``on_ok`` is handed each attempt found ``ok`` as it was checked (its seal holding the very
    bytes hashed, its documents decoded), in the same order: a reader that renders from it
    reads and hashes each attempt's files once, and what it renders is what was checked."""
    require_run_dir(run_dir)
    statuses: list[AttemptStatus] = []
    unkeyed: set[int] = set()
    planned = planned_cases(run_dir)
    for attempt in iter_attempt_dirs(run_dir):
        ids: _AttemptIds = {"case_id": attempt.parent.name, "attempt_id": attempt.name}
        if not (attempt / layout.COMPLETE).exists():
            statuses.append(
                AttemptStatus(
                    **ids,
                    status="incomplete",
                    detail="no COMPLETE: never sealed; ignored by resume",
                )
            )
            continue
        if attempt.parent.name not in planned:
            statuses.append(
                AttemptStatus(
                    **ids,
                    status="invalid",
                    file=layout.PLAN,
                    detail=f"case {attempt.parent.name} is not in the run's plan "
                    "(plan.jsonl has no such case)",
                )
            )
            continue
        try:
            checked = check_attempt(attempt, expected_key=None)
        except SealError as exc:
            if exc.file == layout.COMPLETE and _unkeyed(attempt / layout.COMPLETE, ATTEMPT_SEAL):
                manifest_problem = _unkeyed_problem(attempt)
                if manifest_problem is None:
                    unkeyed.add(len(statuses))  # intact, only made without the key
                else:
                    exc = manifest_problem
            statuses.append(AttemptStatus.refused(ids["case_id"], ids["attempt_id"], exc))
            continue
        disagreement = _plan_disagrees(
            planned[attempt.parent.name], checked.comparison.label, checked.comparison.threshold
        )
        if disagreement is not None:
            statuses.append(
                AttemptStatus(**ids, status="invalid", file=layout.PLAN, detail=disagreement)
            )
            continue
        statuses.append(
            AttemptStatus(**ids, status="ok", outcome=checked.outcome.value, gates=checked.gates)
        )
        if on_ok is not None:
            on_ok(checked)
    if active_key() is None:
        return statuses
    keyed_cases = {s.case_id for s in statuses if s.status == "ok"}
    return [
        AttemptStatus(
            case_id=s.case_id,
            attempt_id=s.attempt_id,
            status="superseded",
            file=layout.COMPLETE,
            detail="sealed without a key; the case has an attempt sealed with the key",
        )
        if i in unkeyed and s.case_id in keyed_cases
        else s
        for i, s in enumerate(statuses)
    ]
