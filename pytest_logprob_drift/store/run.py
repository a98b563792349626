"""A run directory and its plan log: experiment.json, plan.jsonl, run seals, the cases' tree.

Owns ``<artifacts>/<experiment>/``: ``experiment.json`` is written once; ``plan.jsonl`` only
grows, one complete canonical row per line (a failed append is rolled back; a torn last line
left by a crash is reported, never appended to); each append is sealed by a new
``seals/run-<bytes>.json``, a manifest (``store.seal``) holding the digest of
``experiment.json`` and of the first ``<bytes>`` bytes of ``plan.jsonl``, so the whole history
stays checkable and nothing is rewritten. A run whose rows are all recorded needs no write (nor
the lock) at all, so it can be resumed from a read-only store. Below the store's root nothing
is followed through a symbolic link (the root itself may be, or pass through, one): a run that
holds one is refused. File-system failures are
``StorageError`` s (one line; exit 2 for a location that cannot hold a run, 3 for an I/O
failure such as a full disk). Nothing is ever overwritten or deleted. Knows nothing about what
an attempt holds (``store.attempt``), runtimes or verdicts.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from pytest_logprob_drift.errors import ExitCode, InvalidRunError, StorageError
from pytest_logprob_drift.records import JsonValue, canonical_json
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.attempt import AttemptWriter
from pytest_logprob_drift.store.decode import JSONDocumentError, decode, decode_any
from pytest_logprob_drift.store.documents import PlanRow
from pytest_logprob_drift.store.files import (
    LINK_REFUSED,
    check_directory,
    json_bytes,
    link_refused,
    make_directory,
    open_regular,
    publish_bytes,
    read_fd,
    write_all,
)
from pytest_logprob_drift.store.keys import active_key
from pytest_logprob_drift.store.seal import (
    Digest,
    Manifest,
    ManifestDocument,
    PrefixDigest,
    SealError,
    SealForm,
    Sha256,
    new_manifest,
    read_manifest,
    write_manifest,
)


class RunSealDocument(ManifestDocument, frozen=True, kw_only=True):
    """A run seal as stored: the digest of ``experiment.json`` and of a prefix of
    ``plan.jsonl``."""

    experiment: Sha256 = msgspec.field(name=layout.EXPERIMENT)
    plan: PrefixDigest = msgspec.field(name=layout.PLAN)


RUN_SEAL = SealForm(
    what="run seal",
    document=RunSealDocument,
    header=(),
    files_key=None,
    covers=frozenset({layout.EXPERIMENT, layout.PLAN}),
    prefixes=frozenset({layout.PLAN}),
)
"""A run seal: the digest of experiment.json and of a prefix of plan.jsonl, no header."""


# --------------------------------------------------------------------------- plan.jsonl


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanLog:
    """What ``plan.jsonl`` holds: its bytes, its rows, and what was not a row."""

    data: bytes = b""
    rows: tuple[PlanRow, ...] = ()
    """Every complete line that is a plan row, in file order."""
    torn: int = 0
    """Bytes after the last newline: a write that never completed (0: none)."""
    bad_lines: tuple[tuple[int, int, str], ...] = ()
    """``(1-based line, offset of its end, why)`` of each complete line that is not a row."""

    def canonical(self) -> frozenset[str]:
        """The rows in canonical JSON (how a run compares the rows it wants with them), built
        when asked: only a run that appends needs them, never a reader."""
        return frozenset(canonical_json(msgspec.to_builtins(row)) for row in self.rows)

    def invalid_lines(self, sealed: int) -> tuple[tuple[int, str], ...]:
        """``(line, why)`` of the lines that are not rows inside the first ``sealed`` bytes:
        a run seal vouches for them, so the run is invalid."""
        return tuple((line, why) for line, end, why in self.bad_lines if end <= sealed)

    def clean_length(self, sealed: int) -> int:
        """How many leading bytes hold only rows (or sealed bytes): where the next append
        cuts the file back to, so an interrupted write is never sealed or glued to."""
        unsealed = [end for _, end, _ in self.bad_lines if end > sealed]
        if unsealed:
            first = min(unsealed)
            start = self.data.rfind(b"\n", 0, first - 1) + 1
            return max(sealed, start)
        return max(sealed, len(self.data) - self.torn)

    def notes(self, path: Path, sealed: int) -> list[str]:
        """What past the first ``sealed`` bytes is not a row: left by an interrupted write,
        never sealed, cut back by the next append."""
        notes = []
        unsealed = [line for line, end, _ in self.bad_lines if end > sealed]
        if unsealed:
            shown = ", ".join(map(str, unsealed[:5]))
            notes.append(f"{path}: line(s) {shown} after the last run seal are not plan rows")
        if self.torn:
            notes.append(
                f"{path}: torn last line ({self.torn} bytes without a newline) left by an "
                "interrupted write; cut back before the next append"
            )
        return notes


def parse_plan_log(data: bytes) -> PlanLog:
    """``plan.jsonl`` read line by line: each complete line decoded into a ``PlanRow``
    (``store.decode``); the torn tail and the lines that are not rows are recorded, with
    where they end, so a reader can tell a sealed line from an unsealed one."""
    complete, newline, tail = data.rpartition(b"\n")
    rows: list[PlanRow] = []
    bad: list[tuple[int, int, str]] = []
    end = 0
    for number, line in enumerate(complete.split(b"\n") if newline else [], start=1):
        end += len(line) + 1
        try:
            row = decode(line, PlanRow)
        except JSONDocumentError as exc:
            bad.append((number, end, str(exc)))
            continue
        rows.append(row)
    return PlanLog(
        data=data,
        rows=tuple(rows),
        torn=len(tail),
        bad_lines=tuple(bad),
    )


def read_plan_log(run_dir: Path) -> PlanLog:
    """``plan.jsonl`` of a run (empty when it does not exist)."""
    try:
        fd, size = open_regular(run_dir / layout.PLAN)
    except FileNotFoundError:
        return PlanLog()
    except OSError as exc:
        raise StorageError(run_dir / layout.PLAN, "read it", exc) from None
    try:
        return parse_plan_log(read_fd(fd, size))
    except OSError as exc:
        raise StorageError(run_dir / layout.PLAN, "read it", exc) from None
    finally:
        os.close(fd)


def run_seals(run_dir: Path) -> list[tuple[int, Path]]:
    """``(sealed bytes of plan.jsonl, path)`` of every run seal, oldest first (a re-seal of
    the same bytes under a key after the plain one)."""
    seals_dir = run_dir / layout.SEALS
    try:
        check_directory(seals_dir)
        names = os.listdir(seals_dir)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StorageError(seals_dir, "list it", exc) from None
    found = [(int(m.group(1)), seals_dir / n) for n in names if (m := layout.RUN_SEAL.fullmatch(n))]
    return sorted(found, key=lambda seal: (seal[0], len(seal[1].name), seal[1].name))


def run_seal_manifest(experiment: bytes, plan: bytes) -> Manifest:
    """What a run seal records for these bytes of experiment.json and plan.jsonl (``mac``
    added under a seal key)."""
    return new_manifest(
        RUN_SEAL,
        {},
        {
            layout.EXPERIMENT: Digest(sha256=hashlib.sha256(experiment).hexdigest()),
            layout.PLAN: Digest(sha256=hashlib.sha256(plan).hexdigest(), length=len(plan)),
        },
    )


def read_run_seal(path: Path) -> Manifest:
    """A run seal, read once and parsed strictly (SealError naming ``seals/<name>``); its MAC
    is not checked here (``store.seal.check_mac``)."""
    return read_manifest(path, RUN_SEAL, name=path.name)


# --------------------------------------------------------------------------- the run


class ArtifactStore:
    """One experiment's run directory."""

    def __init__(self, root: Path, experiment_id: str) -> None:
        self.root = root
        self.directory = root / experiment_id
        self.cases_dir = self.directory / layout.CASES

    def _refuse_links(self) -> None:
        """Below the store's root nothing may be a symbolic link: the run directory, its
        ``.lock``, ``cases/``, ``seals/``, ``attributions/`` (a StorageError, exit 2)."""
        self._require_root()
        paths = layout.RunLayout(self.directory)
        for path in (self.directory, paths.cases, paths.seals, paths.attributions):
            try:
                check_directory(path)
            except OSError as exc:
                raise StorageError(path, "use it", exc) from None
        if os.path.islink(paths.lock):
            raise StorageError(paths.lock, "use it", OSError(errno.ELOOP, LINK_REFUSED))

    def _require_root(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise StorageError(
                self.root, "hold runs", OSError(errno.ENOTDIR, "it is not a directory")
            )
        dangling = [p for p in (self.root, *self.root.parents) if p.is_symlink() and not p.exists()]
        if dangling:  # mkdir would say "File exists"
            raise StorageError(
                dangling[-1], "hold runs", OSError(errno.ENOENT, "it is a dangling symbolic link")
            )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self._require_root()
        try:
            self.root.mkdir(parents=True, exist_ok=True)  # the root may be, or pass through, a link
            make_directory(self.directory)
        except OSError as exc:
            raise StorageError(self.directory, "create the run directory", exc) from None
        lock = self.directory / layout.LOCK
        try:
            fd = os.open(
                lock, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
            )
        except OSError as exc:
            raise StorageError(lock, "create the run's lock file", link_refused(exc)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _experiment_bytes(self) -> bytes | None:
        try:
            fd, size = open_regular(self.directory / layout.EXPERIMENT)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(self.directory / layout.EXPERIMENT, "read it", exc) from None
        try:
            return read_fd(fd, size)
        finally:
            os.close(fd)

    def _experiment_note(self, existing: bytes, experiment: Mapping[str, JsonValue]) -> list[str]:
        try:
            same = decode_any(existing) == json.loads(json_bytes(experiment))
        except JSONDocumentError:
            same = False
        if same:
            return []
        return [
            f"{self.directory / layout.EXPERIMENT} describes a different definition of this "
            "experiment; left unchanged (cases are keyed by case id)"
        ]

    def _sealed_through(self) -> int:
        """Bytes of plan.jsonl the newest run seal covers (-1: none); under a seal key, only
        seals whose MAC verifies under it count (a keyed resume of an unkeyed run re-seals)."""
        seals = run_seals(self.directory)
        key = active_key()
        if key is None:
            return seals[-1][0] if seals else -1
        for length, path in reversed(seals):
            try:
                manifest = read_run_seal(path)
            except SealError:
                continue
            if manifest.mac_problem(key) is None:
                return length
        return -1

    def initialize(
        self, experiment: Mapping[str, JsonValue], rows: Sequence[Mapping[str, JsonValue]]
    ) -> list[str]:
        """Create experiment.json once; append plan rows not yet recorded; seal what was
        appended. Returns notes.

        An existing experiment.json that describes another experiment definition is left
        untouched and reported; plan.jsonl only ever grows. When everything is already
        recorded nothing is written and no lock is taken (a read-only store serves a run
        whose cases are all reusable); only a missing run seal is then attempted, and its
        absence noted when the store cannot be written.
        """
        wanted = [canonical_json(row) for row in rows]
        self._refuse_links()
        if self.directory.is_dir() and self.cases_dir.is_dir():
            existing = self._experiment_bytes()
            log = self._checked_plan_log()
            if existing is not None and set(wanted) <= log.canonical():
                notes = self._experiment_note(existing, experiment)
                notes += log.notes(self.directory / layout.PLAN, self._sealed_length())
                if self._sealed_through() != log.clean_length(self._sealed_length()):
                    try:
                        with self._locked():
                            self._seal_run()
                    except StorageError as exc:
                        if exc.exit_code is not ExitCode.USAGE_ERROR:
                            raise
                        notes.append(f"{exc}: plan.jsonl left without a current run seal")
                return notes
        with self._locked():
            return self._initialize_locked(experiment, wanted)

    def _sealed_length(self) -> int:
        """Bytes of plan.jsonl that any run seal covers (0: none): never cut back."""
        seals = run_seals(self.directory)
        return max((length for length, _ in seals), default=0)

    def _checked_plan_log(self) -> PlanLog:
        """plan.jsonl, refused (``InvalidRunError``, exit 1) when a line that a run seal
        covers is not a plan row."""
        log = read_plan_log(self.directory)
        invalid = log.invalid_lines(self._sealed_length())
        if invalid:
            line, why = invalid[0]
            raise InvalidRunError(
                str(self.directory / layout.PLAN),
                f"sealed line {line} is not a plan row ({why}): the run is invalid; "
                "run into another --artifacts directory",
            )
        return log

    def _initialize_locked(
        self, experiment: Mapping[str, JsonValue], wanted: list[str]
    ) -> list[str]:
        try:
            make_directory(self.cases_dir)
        except OSError as exc:
            raise StorageError(self.cases_dir, "create it", exc) from None
        existing = self._experiment_bytes()
        if existing is None:
            publish_bytes(self.directory, layout.EXPERIMENT, json_bytes(experiment))
            notes = []
        else:
            notes = self._experiment_note(existing, experiment)
        log = self._checked_plan_log()
        notes += log.notes(self.directory / layout.PLAN, self._sealed_length())
        log = self._cut_back(log)
        known = log.canonical()
        new = [row for row in dict.fromkeys(wanted) if row not in known]
        if new:
            self._append(("\n".join(new) + "\n").encode("utf-8"))
        self._seal_run()
        return notes

    def _cut_back(self, log: PlanLog) -> PlanLog:
        """plan.jsonl cut back to its rows (``PlanLog.clean_length``): the unsealed torn tail
        or unsealed lines that are not rows, left by an interrupted write, go (held lock)."""
        keep = log.clean_length(self._sealed_length())
        if keep >= len(log.data):
            return log
        path = self.directory / layout.PLAN
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise StorageError(
                path, "open it to cut an interrupted write", link_refused(exc)
            ) from None
        try:
            os.ftruncate(fd, keep)
            os.fsync(fd)
        except OSError as exc:
            raise StorageError(path, "cut an interrupted write", exc) from None
        finally:
            os.close(fd)
        return parse_plan_log(log.data[:keep])

    def _append(self, payload: bytes) -> None:
        """Append whole rows (the file ends in a newline: ``_cut_back``); on any failure the
        partial append is rolled back."""
        path = self.directory / layout.PLAN
        try:
            fd = os.open(
                path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
            )
        except OSError as exc:
            raise StorageError(path, "open it for appending", link_refused(exc)) from None
        size = 0
        try:
            size = os.fstat(fd).st_size
            write_all(fd, payload)
            os.fsync(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
                os.fsync(fd)
            raise StorageError(path, "append the plan rows", exc) from None
        finally:
            os.close(fd)

    def _seal_run(self) -> None:
        """Seal experiment.json and plan.jsonl as they are now (held lock; no-op if sealed)."""
        experiment = self._experiment_bytes()
        log = self._cut_back(self._checked_plan_log())
        if experiment is None or self._sealed_through() == len(log.data):
            return
        seals_dir = self.directory / layout.SEALS
        try:
            make_directory(seals_dir)
        except OSError as exc:
            raise StorageError(seals_dir, "create it", exc) from None
        name = layout.run_seal_name(len(log.data))
        key = active_key()
        if key is not None and os.path.lexists(seals_dir / name):  # sealed, not under this key
            name = layout.run_seal_name(len(log.data), key.key_id)
        with contextlib.suppress(FileExistsError):  # the same bytes were sealed meanwhile
            write_manifest(seals_dir, name, run_seal_manifest(experiment, log.data))

    def case_dir(self, case_id: str) -> Path:
        return self.cases_dir / case_id

    def new_attempt(self, case_id: str, execution_key: str) -> AttemptWriter:
        return AttemptWriter(self.case_dir(case_id), case_id, execution_key)

    def attempts(self, case_id: str) -> list[Path]:
        """Attempt directories of a case, newest first."""
        directory = self.case_dir(case_id)
        if not directory.is_dir():
            return []
        return sorted(
            (p for p in directory.iterdir() if p.is_dir() and not p.name.startswith(".")),
            key=lambda p: p.name,
            reverse=True,
        )


def iter_attempt_dirs(run_dir: Path) -> Iterator[Path]:
    """Every attempt directory of a run, in case then attempt order."""
    cases = run_dir / layout.CASES
    if not cases.is_dir():
        return
    for case in sorted(p for p in cases.iterdir() if p.is_dir()):
        yield from sorted(p for p in case.iterdir() if p.is_dir())
