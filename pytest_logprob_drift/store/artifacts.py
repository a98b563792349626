"""The append-only artifact store: run directories, attempts, seals and discovery.

Owns the contract's tree::

    runs/<experiment>/experiment.json, plan.jsonl, seals/run-<bytes>.json,
                      cases/<case>/<attempt>/{...,COMPLETE}

Every file is created exclusively: written to a temporary name in its directory (hashed while
it is written: each byte once), then hard-linked into place (which fails rather than
overwrite) and the temporary name removed. A standalone file is fsynced with its directory
before ``publish_bytes`` returns; an attempt's payloads are fsynced in the background while the
next one is written, and all of them (and the directory) before ``COMPLETE`` is written last:
``COMPLETE`` seals every other file of the attempt with SHA-256 (``{"case_id", "attempt_id",
"execution_key", "files"}``, plus ``mac`` under a seal key, see ``store.keys``). Seal entries
are plain names inside the attempt; symbolic links and other non-regular files are refused.

``experiment.json`` is written once; ``plan.jsonl`` only grows, one complete canonical row per
line (a failed append is rolled back; a torn last line left by a crash is reported, never
appended to); each append is sealed by a new ``seals/run-<bytes>.json`` holding the digest of
``experiment.json`` and of the first ``<bytes>`` bytes of ``plan.jsonl``, so the whole history
stays checkable and nothing is rewritten. A run whose rows are all recorded needs no write (nor
the lock) at all, so it can be resumed from a read-only store. File-system failures are
``StorageError`` s (one line; exit 2 for a location that cannot hold a run, 3 for an I/O
failure such as a full disk). Nothing is ever overwritten or deleted. Reading a seal treats the
directory as untrusted input. Knows nothing about tensors' meaning, runtimes or verdicts;
``.pt`` payloads are bytes here.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import stat
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_logprob_drift.errors import ExitCode, StorageError
from pytest_logprob_drift.records import canonical_json, sha256_hex
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.keys import active_key

HASH_CHUNK = 1 << 20
THREADED_HASH_BYTES = 1 << 20
"""From this size on, a payload is hashed in a second thread while it is written."""
MAX_SEAL_BYTES = 16 << 20
"""A COMPLETE or run seal larger than this is refused unread."""
PUBLISH_TEMPORARY = re.compile(r"\.[^/]+\.[0-9a-f]{8}\.tmp")
"""Temporary names ``publish_bytes`` writes before linking (``.<name>.<8 hex>.tmp``)."""
_SHA256 = re.compile(r"[0-9a-f]{64}")


def execution_key(payload: Mapping[str, Any]) -> str:
    """The key an attempt is sealed under: SHA-256 of the canonical execution-key payload
    (which ``identity.json`` carries, so the key can be re-derived offline)."""
    return sha256_hex(canonical_json(payload))


def new_attempt_id() -> str:
    """UTC time plus a random suffix; sortable, never reused."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return f"{now}-{secrets.token_hex(4)}"


def plain_name(name: object) -> bool:
    """Whether ``name`` may name a file inside an attempt: one path component, no ``..``,
    no NUL, not hidden (temporaries start with '.'), at most 255 bytes."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\0" not in name
        and not name.startswith(".")
        and len(name.encode("utf-8", "surrogatepass")) <= 255
    )


class NotRegularFileError(OSError):
    """A path that should be a regular file is a symbolic link, a directory, a FIFO..."""


def _open_regular(path: Path) -> tuple[int, int]:
    """``(fd, size)`` of a regular file opened read-only without following a symbolic link
    (non-blocking, so a FIFO cannot hang the reader)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFileError(exc.errno, "is a symbolic link", str(path)) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise NotRegularFileError(errno.EINVAL, "is not a regular file", str(path))
    return fd, info.st_size


def _read_fd(fd: int, size: int) -> bytes:
    chunks = []
    remaining = size
    while remaining > 0:
        chunk = os.read(fd, min(remaining, 1 << 24))
        if not chunk:
            break  # truncated meanwhile: the digest will say so
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_regular(path: Path, *, limit: int | None = None) -> bytes:
    """The bytes of a regular file (``NotRegularFileError`` for a symbolic link, a FIFO...;
    ValueError when it is larger than ``limit``)."""
    fd, size = _open_regular(path)
    try:
        if limit is not None and size > limit:
            raise ValueError(f"{size} bytes, more than the {limit} a seal may have")
        return _read_fd(fd, size)
    finally:
        os.close(fd)


def _hash_fd(fd: int) -> str:
    """SHA-256 of everything readable from ``fd``: chunks read into one reused buffer, so each
    byte is copied once from the page cache and hashed once."""
    digest = hashlib.sha256()
    buffer = bytearray(HASH_CHUNK)
    view = memoryview(buffer)
    while n := os.readv(fd, [buffer]):
        digest.update(view[:n])
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    """SHA-256 of a regular file (a symbolic link or other non-regular file is refused with
    ``NotRegularFileError``, an ``OSError``)."""
    fd, _ = _open_regular(path)
    try:
        return _hash_fd(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _write_hashed(fd: int, data: bytes) -> str:
    """Write ``data`` completely and return its SHA-256, hashing each byte once: in a second
    thread, while this one writes, for large payloads (both release the GIL)."""
    digest = hashlib.sha256()
    if len(data) < THREADED_HASH_BYTES:
        digest.update(data)
        _write_all(fd, data)
        return digest.hexdigest()
    hasher = threading.Thread(target=digest.update, args=(memoryview(data),), daemon=True)
    hasher.start()
    try:
        _write_all(fd, data)
    finally:
        hasher.join()
    return digest.hexdigest()


def publish_bytes(directory: Path, name: str, data: bytes, *, sync: bool = True) -> str:
    """Create ``directory/name`` exclusively and return its SHA-256 (hashed while written).

    With ``sync`` (the default) the file and the directory entry are durable on return;
    without it the caller fsyncs them (``AttemptWriter`` does, before COMPLETE). Raises
    FileExistsError rather than overwrite, StorageError for any other file-system failure
    (the temporary is removed: nothing partial is left behind)."""
    if not plain_name(name):
        raise ValueError(f"invalid artifact name {name!r}")
    final = directory / name
    temporary = directory / f".{name}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StorageError(final, "create it", exc) from None
    try:
        try:
            digest = _write_hashed(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.link(temporary, final)  # raises FileExistsError instead of overwriting
    except FileExistsError:
        _discard(temporary)
        raise
    except OSError as exc:
        _discard(temporary)
        raise StorageError(final, "write it", exc) from None
    _discard(temporary)
    if sync:
        try:
            _fsync_dir(directory)
        except OSError as exc:
            raise StorageError(directory, "sync the directory", exc) from None
    return digest


def _discard(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def json_bytes(document: Any) -> bytes:
    return (json.dumps(document, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class Seal:
    case_id: str
    attempt_id: str
    execution_key: str
    files: Mapping[str, str]
    mac: Mapping[str, str] | None = None
    """The keyed seal (``store.keys``), when the attempt was sealed with a key."""
    contents: Mapping[str, bytes] = field(default_factory=dict, repr=False, compare=False)
    """The bytes of the files ``read_seal`` was asked to keep: the very bytes it hashed."""


class SealError(Exception):
    """An attempt directory is partial, malformed or tampered; ``file`` names the culprit."""

    def __init__(self, file: str, message: str) -> None:
        self.file = file
        self.message = message
        super().__init__(f"{file}: {message}")


def _real_directory(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _read_json_file(path: Path, name: str) -> Any:
    """A small JSON document from a regular file (SealError naming ``name`` otherwise)."""
    try:
        fd, size = _open_regular(path)
    except FileNotFoundError:
        raise SealError(name, "missing") from None
    except OSError as exc:
        raise SealError(name, f"unreadable: {exc.strerror or exc}") from None
    try:
        if size > MAX_SEAL_BYTES:
            raise SealError(name, f"larger than {MAX_SEAL_BYTES} bytes; refused")
        data = _read_fd(fd, size)
    except OSError as exc:
        raise SealError(name, f"unreadable: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SealError(name, f"unreadable seal: {exc}") from None


def _seal_document(document: Any) -> dict[str, Any]:
    """Check the shape of a parsed COMPLETE."""
    required = {"case_id", "attempt_id", "execution_key", "files"}
    if not isinstance(document, dict) or not (
        set(document) == required or set(document) == required | {"mac"}
    ):
        raise SealError(
            layout.COMPLETE,
            "malformed seal: expected keys case_id, attempt_id, execution_key, files",
        )
    if not all(isinstance(document[k], str) for k in ("case_id", "attempt_id", "execution_key")):
        raise SealError(
            layout.COMPLETE, "malformed seal: ids and the execution key must be strings"
        )
    files = document["files"]
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        raise SealError(layout.COMPLETE, "malformed seal: files must map names to digests")
    for name, digest in files.items():
        if not plain_name(name) or name == layout.COMPLETE:
            raise SealError(
                layout.COMPLETE,
                f"seal entry {name!r} is not a plain file name inside the attempt "
                "(no '/', '..', absolute or hidden names)",
            )
        if not _SHA256.fullmatch(digest):
            raise SealError(layout.COMPLETE, f"seal entry {name!r} has no SHA-256 digest")
    return document


def check_mac(document: Mapping[str, Any], file: str) -> None:
    """Under an active seal key, refuse a seal without a valid MAC (``store.keys``)."""
    key = active_key()
    if key is None:
        return
    body = {k: v for k, v in document.items() if k != "mac"}
    problem = key.problem(body, document.get("mac"))
    if problem is not None:
        raise SealError(file, problem)


def read_seal(attempt_dir: Path, *, keep: Collection[str] = ()) -> Seal:
    """Parse and check an attempt's COMPLETE against every file it seals.

    Every sealed file is read and hashed exactly once; the bytes of the names in ``keep`` are
    returned in ``Seal.contents`` (so a caller loads exactly what was checked, without hashing
    again). Symbolic links and other non-regular files are refused anywhere in the attempt."""
    if not _real_directory(attempt_dir) or not _real_directory(attempt_dir.parent):
        raise SealError(layout.COMPLETE, "the attempt (or its case) is not a directory: refused")
    complete = attempt_dir / layout.COMPLETE
    if not os.path.lexists(complete):
        raise SealError(layout.COMPLETE, "missing: the attempt never completed")
    document = _seal_document(_read_json_file(complete, layout.COMPLETE))
    files: dict[str, str] = document["files"]
    if document["attempt_id"] != attempt_dir.name:
        raise SealError(
            layout.COMPLETE,
            f"seal names attempt {document['attempt_id']!r}, directory is {attempt_dir.name!r}",
        )
    if document["case_id"] != attempt_dir.parent.name:
        raise SealError(
            layout.COMPLETE,
            f"seal names case {document['case_id']!r}, directory is {attempt_dir.parent.name!r}",
        )
    check_mac(document, layout.COMPLETE)
    # A crash between linking a file into place and removing its temporary name leaves that
    # name behind (for COMPLETE, in an otherwise sealed attempt): it is never a payload.
    try:
        entries = sorted(os.scandir(attempt_dir), key=lambda e: e.name)
    except OSError as exc:
        raise SealError(
            layout.COMPLETE, f"cannot list the attempt: {exc.strerror or exc}"
        ) from None
    for entry in entries:
        if entry.is_symlink():
            raise SealError(entry.name, "is a symbolic link; an attempt holds regular files only")
        if not entry.is_file(follow_symlinks=False):
            raise SealError(entry.name, "is not a regular file; refused")
        if entry.name == layout.COMPLETE or PUBLISH_TEMPORARY.fullmatch(entry.name):
            continue
        if entry.name not in files:
            raise SealError(entry.name, "file is not covered by the seal")
    contents: dict[str, bytes] = {}
    for name, digest in sorted(files.items()):
        if _file_digest(attempt_dir / name, name, contents if name in keep else None) != digest:
            raise SealError(name, "SHA-256 does not match the seal (tampered or corrupt)")
    return Seal(
        case_id=document["case_id"],
        attempt_id=document["attempt_id"],
        execution_key=document["execution_key"],
        files=dict(files),
        mac=document.get("mac"),
        contents=contents,
    )


@contextlib.contextmanager
def sealed_file_errors(name: str) -> Iterator[None]:
    """Opening or reading the sealed file ``name``: any OS error becomes a SealError naming it
    (missing; a link or other non-regular file, refused; unreadable)."""
    try:
        yield
    except FileNotFoundError:
        raise SealError(name, "sealed file is missing") from None
    except NotRegularFileError as exc:
        raise SealError(name, f"{exc.strerror}; refused") from None
    except OSError as exc:
        raise SealError(name, f"unreadable: {exc.strerror or exc}") from None


def _file_digest(path: Path, name: str, keep: dict[str, bytes] | None) -> str:
    with sealed_file_errors(name):
        fd, size = _open_regular(path)
    try:
        if keep is None:
            return _hash_fd(fd)
        data = _read_fd(fd, size)
        keep[name] = data
        return hashlib.sha256(data).hexdigest()
    except OSError as exc:
        raise SealError(name, f"unreadable: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


class _BackgroundSync(threading.Thread):
    """fsyncs one published file while the next one is written."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.error: OSError | None = None
        self.start()

    def run(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            self.error = exc


class AttemptWriter:
    """Writes one attempt; ``seal()`` publishes COMPLETE last. Never overwrites anything."""

    def __init__(self, case_dir: Path, case_id: str, execution_key: str) -> None:
        try:
            case_dir.mkdir(parents=True, exist_ok=True)
            while True:
                attempt_id = new_attempt_id()
                try:
                    (case_dir / attempt_id).mkdir()
                    break
                except FileExistsError:  # pragma: no cover - random suffix collision
                    continue
            _fsync_dir(case_dir)
        except OSError as exc:
            raise StorageError(case_dir, "create an attempt directory", exc) from None
        self.case_id = case_id
        self.attempt_id = attempt_id
        self.directory = case_dir / attempt_id
        self.execution_key = execution_key
        self._digests: dict[str, str] = {}
        self._syncs: list[_BackgroundSync] = []
        self._sealed = False

    def write_bytes(self, name: str, data: bytes) -> None:
        if self._sealed:
            raise RuntimeError("attempt already sealed")
        if name == layout.COMPLETE or name in self._digests:
            raise FileExistsError(f"{name} already written in attempt {self.attempt_id}")
        self._digests[name] = publish_bytes(self.directory, name, data, sync=False)
        self._syncs.append(_BackgroundSync(self.directory / name))

    def write_json(self, name: str, document: Any) -> None:
        self.write_bytes(name, json_bytes(document))

    def _durable(self) -> None:
        """Every payload and the directory durable: what COMPLETE may then vouch for."""
        syncs, self._syncs = self._syncs, []
        for sync in syncs:
            sync.join()
        for sync in syncs:
            if sync.error is not None:
                raise StorageError(sync.path, "sync it to disk", sync.error)
        try:
            _fsync_dir(self.directory)
        except OSError as exc:
            raise StorageError(self.directory, "sync the directory", exc) from None

    def seal(self) -> Seal:
        self._durable()
        document: dict[str, Any] = {
            "case_id": self.case_id,
            "attempt_id": self.attempt_id,
            "execution_key": self.execution_key,
            "files": dict(sorted(self._digests.items())),
        }
        key = active_key()
        if key is not None:
            document["mac"] = key.mac(document)
        publish_bytes(self.directory, layout.COMPLETE, json_bytes(document))
        self._sealed = True
        return Seal(
            case_id=self.case_id,
            attempt_id=self.attempt_id,
            execution_key=self.execution_key,
            files=document["files"],
            mac=document.get("mac"),
        )


# --------------------------------------------------------------------------- plan.jsonl


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanLog:
    """What ``plan.jsonl`` holds: its bytes, the canonical rows, and what was not a row."""

    data: bytes = b""
    rows: tuple[str, ...] = ()
    """Every complete line that is a JSON object, in canonical JSON."""
    torn: int = 0
    """Bytes after the last newline: a write that never completed (0: none)."""
    bad_lines: tuple[int, ...] = ()
    """1-based numbers of complete lines that are not plan rows."""

    def notes(self, path: Path) -> list[str]:
        notes = []
        if self.torn:
            notes.append(
                f"{path}: torn last line ({self.torn} bytes without a newline) left by an "
                "interrupted write; ignored, and never appended to"
            )
        if self.bad_lines:
            shown = ", ".join(map(str, self.bad_lines[:5]))
            notes.append(f"{path}: line(s) {shown} are not plan rows; ignored")
        return notes


def parse_plan_log(data: bytes) -> PlanLog:
    """Tolerant reading of ``plan.jsonl``: complete rows, the torn tail, lines that are not
    rows (a torn line that a later append terminated)."""
    complete, newline, tail = data.rpartition(b"\n")
    rows: list[str] = []
    bad: list[int] = []
    for number, line in enumerate(complete.split(b"\n") if newline else [], start=1):
        try:
            row = json.loads(line)
        except (UnicodeDecodeError, ValueError, RecursionError):
            bad.append(number)
            continue
        if isinstance(row, dict):
            rows.append(canonical_json(row))
        else:
            bad.append(number)
    return PlanLog(data=data, rows=tuple(rows), torn=len(tail), bad_lines=tuple(bad))


def read_plan_log(run_dir: Path) -> PlanLog:
    """``plan.jsonl`` of a run (empty when it does not exist)."""
    try:
        fd, size = _open_regular(run_dir / layout.PLAN)
    except FileNotFoundError:
        return PlanLog()
    except OSError as exc:
        raise StorageError(run_dir / layout.PLAN, "read it", exc) from None
    try:
        return parse_plan_log(_read_fd(fd, size))
    except OSError as exc:
        raise StorageError(run_dir / layout.PLAN, "read it", exc) from None
    finally:
        os.close(fd)


def run_seals(run_dir: Path) -> list[tuple[int, Path]]:
    """``(sealed bytes of plan.jsonl, path)`` of every run seal, oldest first (a re-seal of
    the same bytes under a key after the plain one)."""
    seals_dir = run_dir / layout.SEALS
    try:
        names = os.listdir(seals_dir)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StorageError(seals_dir, "list it", exc) from None
    found = [(int(m.group(1)), seals_dir / n) for n in names if (m := layout.RUN_SEAL.fullmatch(n))]
    return sorted(found, key=lambda seal: (seal[0], len(seal[1].name), seal[1].name))


def run_seal_document(experiment: bytes, plan: bytes) -> dict[str, Any]:
    """What a run seal records for these bytes of experiment.json and plan.jsonl (``mac``
    added under a seal key)."""
    document: dict[str, Any] = {
        layout.EXPERIMENT: hashlib.sha256(experiment).hexdigest(),
        layout.PLAN: {"bytes": len(plan), "sha256": hashlib.sha256(plan).hexdigest()},
    }
    key = active_key()
    if key is not None:
        document["mac"] = key.mac(document)
    return document


# --------------------------------------------------------------------------- the run


class ArtifactStore:
    """One experiment's run directory."""

    def __init__(self, root: Path, experiment_id: str) -> None:
        self.root = root
        self.directory = root / experiment_id
        self.cases_dir = self.directory / layout.CASES

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self.root.exists() and not self.root.is_dir():
            raise StorageError(
                self.root, "hold runs", OSError(errno.ENOTDIR, "it is not a directory")
            )
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(self.directory, "create the run directory", exc) from None
        lock = self.directory / layout.LOCK
        try:
            handle = lock.open("a")
        except OSError as exc:
            raise StorageError(lock, "create the run's lock file", exc) from None
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _experiment_bytes(self) -> bytes | None:
        try:
            fd, size = _open_regular(self.directory / layout.EXPERIMENT)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(self.directory / layout.EXPERIMENT, "read it", exc) from None
        try:
            return _read_fd(fd, size)
        finally:
            os.close(fd)

    def _experiment_note(self, existing: bytes, experiment: Mapping[str, Any]) -> list[str]:
        try:
            same = json.loads(existing) == json.loads(json_bytes(experiment))
        except ValueError:
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
                document = json.loads(read_regular(path, limit=MAX_SEAL_BYTES))
            except (OSError, ValueError, RecursionError):
                continue
            if (
                isinstance(document, dict)
                and key.problem(
                    {k: v for k, v in document.items() if k != "mac"}, document.get("mac")
                )
                is None
            ):
                return length
        return -1

    def initialize(
        self, experiment: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]
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
        if self.directory.is_dir() and self.cases_dir.is_dir():
            existing = self._experiment_bytes()
            log = read_plan_log(self.directory)
            if existing is not None and set(wanted) <= set(log.rows):
                notes = self._experiment_note(existing, experiment)
                notes += log.notes(self.directory / layout.PLAN)
                if self._sealed_through() != len(log.data):
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

    def _initialize_locked(self, experiment: Mapping[str, Any], wanted: list[str]) -> list[str]:
        try:
            self.cases_dir.mkdir(exist_ok=True)
        except OSError as exc:
            raise StorageError(self.cases_dir, "create it", exc) from None
        existing = self._experiment_bytes()
        if existing is None:
            publish_bytes(self.directory, layout.EXPERIMENT, json_bytes(experiment))
            notes = []
        else:
            notes = self._experiment_note(existing, experiment)
        log = read_plan_log(self.directory)
        notes += log.notes(self.directory / layout.PLAN)
        known = set(log.rows)
        new = [row for row in dict.fromkeys(wanted) if row not in known]
        if new:
            self._append(log, ("\n".join(new) + "\n").encode("utf-8"))
        self._seal_run()
        return notes

    def _append(self, log: PlanLog, payload: bytes) -> None:
        """Append whole rows: after a newline if the file ends in a torn line (so a row is
        never glued onto it); on any failure the partial append is rolled back."""
        path = self.directory / layout.PLAN
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StorageError(path, "open it for appending", exc) from None
        size = 0
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                payload = b"\n" + payload
            _write_all(fd, payload)
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
        log = read_plan_log(self.directory)
        if experiment is None or self._sealed_through() == len(log.data):
            return
        seals_dir = self.directory / layout.SEALS
        try:
            seals_dir.mkdir(exist_ok=True)
        except OSError as exc:
            raise StorageError(seals_dir, "create it", exc) from None
        name = f"run-{len(log.data):012d}.json"
        key = active_key()
        if key is not None and os.path.lexists(seals_dir / name):  # sealed, not under this key
            name = f"run-{len(log.data):012d}-{key.key_id}.json"
        with contextlib.suppress(FileExistsError):  # the same bytes were sealed meanwhile
            publish_bytes(seals_dir, name, json_bytes(run_seal_document(experiment, log.data)))

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
    cases = run_dir / layout.CASES
    if not cases.is_dir():
        return
    for case in sorted(p for p in cases.iterdir() if p.is_dir()):
        yield from sorted(p for p in case.iterdir() if p.is_dir())
