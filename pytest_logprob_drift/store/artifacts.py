"""The append-only artifact store: run directories, attempts, seals and discovery.

Owns the contract's tree::

    runs/<experiment>/experiment.json, plan.jsonl, cases/<case>/<attempt>/{...,COMPLETE}

Every file is created exclusively: written to a temporary name in the attempt directory,
fsynced, then hard-linked into place (which fails rather than overwrite) and the temporary
name removed; the directory is fsynced. ``COMPLETE`` is written last and seals every other file
of the attempt with SHA-256 (``{"case_id", "attempt_id", "execution_key", "files"}``). Nothing
is ever overwritten or deleted. Reading a seal treats the directory as untrusted input. Knows
nothing about tensors' meaning, runtimes or verdicts; ``.pt`` payloads are bytes here.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_logprob_drift.records import canonical_json, sha256_hex

COMPLETE = "COMPLETE"
EXPERIMENT_FILE = "experiment.json"
PLAN_FILE = "plan.jsonl"
LOCK_FILE = ".lock"
HASH_CHUNK = 1 << 20
PUBLISH_TEMPORARY = re.compile(r"\.[^/]+\.[0-9a-f]{8}\.tmp")
"""Temporary names ``publish_bytes`` writes before linking (``.<name>.<8 hex>.tmp``)."""


def execution_key(payload: Mapping[str, Any]) -> str:
    """The key an attempt is sealed under: SHA-256 of the canonical execution-key payload
    (which ``identity.json`` carries, so the key can be re-derived offline)."""
    return sha256_hex(canonical_json(payload))


def new_attempt_id() -> str:
    """UTC time plus a random suffix; sortable, never reused."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return f"{now}-{secrets.token_hex(4)}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_bytes(directory: Path, name: str, data: bytes) -> str:
    """Create ``directory/name`` exclusively and durably; return its SHA-256."""
    if "/" in name or name.startswith("."):
        raise ValueError(f"invalid artifact name {name!r}")
    final = directory / name
    temporary = directory / f".{name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(temporary, final)  # raises FileExistsError instead of overwriting
    finally:
        os.unlink(temporary)
    _fsync_dir(directory)
    return hashlib.sha256(data).hexdigest()


def json_bytes(document: Any) -> bytes:
    return (json.dumps(document, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class Seal:
    case_id: str
    attempt_id: str
    execution_key: str
    files: Mapping[str, str]


class SealError(Exception):
    """An attempt directory is partial, malformed or tampered; ``file`` names the culprit."""

    def __init__(self, file: str, message: str) -> None:
        self.file = file
        self.message = message
        super().__init__(f"{file}: {message}")


def read_seal(attempt_dir: Path) -> Seal:
    """Parse and check an attempt's COMPLETE against every file it seals."""
    complete = attempt_dir / COMPLETE
    if not complete.is_file():
        raise SealError(COMPLETE, "missing: the attempt never completed")
    try:
        document = json.loads(complete.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SealError(COMPLETE, f"unreadable seal: {exc}") from None
    if not isinstance(document, dict) or set(document) != {
        "case_id",
        "attempt_id",
        "execution_key",
        "files",
    }:
        raise SealError(
            COMPLETE, "malformed seal: expected keys case_id, attempt_id, execution_key, files"
        )
    files = document["files"]
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        raise SealError(COMPLETE, "malformed seal: files must map names to digests")
    if document["attempt_id"] != attempt_dir.name:
        raise SealError(
            COMPLETE,
            f"seal names attempt {document['attempt_id']!r}, directory is {attempt_dir.name!r}",
        )
    if document["case_id"] != attempt_dir.parent.name:
        raise SealError(
            COMPLETE,
            f"seal names case {document['case_id']!r}, directory is {attempt_dir.parent.name!r}",
        )
    # A crash between linking a file into place and removing its temporary name leaves that
    # name behind (for COMPLETE, in an otherwise sealed attempt): it is never a payload.
    present = {p.name for p in attempt_dir.iterdir() if not PUBLISH_TEMPORARY.fullmatch(p.name)} - {
        COMPLETE
    }
    for extra in sorted(present - set(files)):
        raise SealError(extra, "file is not covered by the seal")
    for name, digest in sorted(files.items()):
        path = attempt_dir / name
        if not path.is_file():
            raise SealError(name, "sealed file is missing")
        if sha256_file(path) != digest:
            raise SealError(name, "SHA-256 does not match the seal (tampered or corrupt)")
    return Seal(
        case_id=document["case_id"],
        attempt_id=document["attempt_id"],
        execution_key=document["execution_key"],
        files=dict(files),
    )


class AttemptWriter:
    """Writes one attempt; ``seal()`` publishes COMPLETE last. Never overwrites anything."""

    def __init__(self, case_dir: Path, case_id: str, execution_key: str) -> None:
        case_dir.mkdir(parents=True, exist_ok=True)
        while True:
            attempt_id = new_attempt_id()
            try:
                (case_dir / attempt_id).mkdir()
                break
            except FileExistsError:  # pragma: no cover - random suffix collision
                continue
        _fsync_dir(case_dir)
        self.case_id = case_id
        self.attempt_id = attempt_id
        self.directory = case_dir / attempt_id
        self.execution_key = execution_key
        self._digests: dict[str, str] = {}
        self._sealed = False

    def write_bytes(self, name: str, data: bytes) -> None:
        if self._sealed:
            raise RuntimeError("attempt already sealed")
        if name == COMPLETE or name in self._digests:
            raise FileExistsError(f"{name} already written in attempt {self.attempt_id}")
        self._digests[name] = publish_bytes(self.directory, name, data)

    def write_json(self, name: str, document: Any) -> None:
        self.write_bytes(name, json_bytes(document))

    def seal(self) -> Seal:
        seal = Seal(
            case_id=self.case_id,
            attempt_id=self.attempt_id,
            execution_key=self.execution_key,
            files=dict(sorted(self._digests.items())),
        )
        publish_bytes(
            self.directory,
            COMPLETE,
            json_bytes(
                {
                    "case_id": seal.case_id,
                    "attempt_id": seal.attempt_id,
                    "execution_key": seal.execution_key,
                    "files": dict(seal.files),
                }
            ),
        )
        self._sealed = True
        return seal


class ArtifactStore:
    """One experiment's run directory."""

    def __init__(self, root: Path, experiment_id: str) -> None:
        self.root = root
        self.directory = root / experiment_id
        self.cases_dir = self.directory / "cases"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / LOCK_FILE).open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def initialize(
        self, experiment: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]
    ) -> list[str]:
        """Create experiment.json once; append plan rows not yet recorded. Returns notes.

        An existing experiment.json that describes another experiment definition is left
        untouched and reported; plan.jsonl only ever grows.
        """
        notes: list[str] = []
        with self._locked():
            self.cases_dir.mkdir(exist_ok=True)
            existing = self.directory / EXPERIMENT_FILE
            if existing.exists():
                try:
                    same = json.loads(existing.read_text()) == json.loads(
                        json_bytes(experiment).decode()
                    )
                except (OSError, json.JSONDecodeError):
                    same = False
                if not same:
                    notes.append(
                        f"{existing} describes a different definition of this "
                        "experiment; left unchanged (cases are keyed by case id)"
                    )
            else:
                publish_bytes(self.directory, EXPERIMENT_FILE, json_bytes(experiment))
            plan_path = self.directory / PLAN_FILE
            known: set[str] = set()
            if plan_path.exists():
                for line in plan_path.read_text(encoding="utf-8").splitlines():
                    with contextlib.suppress(json.JSONDecodeError, TypeError, KeyError):
                        known.add(canonical_json(json.loads(line)))
            new = [canonical_json(row) for row in rows if canonical_json(row) not in known]
            if new:
                fd = os.open(plan_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, ("\n".join(new) + "\n").encode())
                    os.fsync(fd)
                finally:
                    os.close(fd)
        return notes

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
    cases = run_dir / "cases"
    if not cases.is_dir():
        return
    for case in sorted(p for p in cases.iterdir() if p.is_dir()):
        yield from sorted(p for p in case.iterdir() if p.is_dir())
