"""One attempt of a case: writing it append-only and reading its seal back.

Owns ``cases/<case>/<attempt>/``: the attempt id, the execution key an attempt is sealed under,
``AttemptWriter`` (every payload published exclusively and fsynced in the background while the
next one is written; all of them, and the directory, durable before ``COMPLETE`` is written
last), and the attempt's seal: ``COMPLETE``, a manifest (``store.seal``) with header
``case_id``, ``attempt_id``, ``execution_key`` and the SHA-256 of every other file, plus ``mac``
under a seal key. ``read_seal`` treats the directory as untrusted input. Knows nothing about
what the files contain (``check.resume`` checks that), runtimes or verdicts.
"""

from __future__ import annotations

import datetime
import os
import secrets
import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from pytest_logprob_drift.errors import StorageError
from pytest_logprob_drift.records import JsonValue, canonical_json, sha256_hex
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.decode import Document
from pytest_logprob_drift.store.documents import document_file
from pytest_logprob_drift.store.files import (
    check_directory,
    fsync_dir,
    json_bytes,
    make_directory,
    publish_bytes,
    real_directory,
)
from pytest_logprob_drift.store.seal import (
    FilesManifest,
    Sealed,
    SealError,
    SealForm,
    new_manifest,
    read_manifest,
    verify_directory,
    write_manifest,
)


class AttemptSealDocument(FilesManifest, frozen=True, kw_only=True):
    """An attempt's ``COMPLETE`` as stored."""

    case_id: str
    attempt_id: str
    execution_key: str


ATTEMPT_SEAL = SealForm(
    what="seal",
    document=AttemptSealDocument,
    header=("case_id", "attempt_id", "execution_key"),
)
"""An attempt's COMPLETE: its ids, its execution key and every other file of the attempt."""


def execution_key(payload: Mapping[str, JsonValue]) -> str:
    """The key an attempt is sealed under: SHA-256 of the canonical execution-key payload
    (which ``identity.json`` carries, so the key can be re-derived offline)."""
    return sha256_hex(canonical_json(payload))


def new_attempt_id() -> str:
    """UTC time plus a random suffix; sortable, never reused."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return f"{now}-{secrets.token_hex(4)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Seal(Sealed):
    """An attempt's verified seal (and the bytes ``read_seal`` kept: the very bytes hashed)."""

    @property
    def case_id(self) -> str:
        return str(self.manifest.header["case_id"])

    @property
    def attempt_id(self) -> str:
        return str(self.manifest.header["attempt_id"])

    @property
    def execution_key(self) -> str:
        return str(self.manifest.header["execution_key"])


def read_seal(attempt_dir: Path, *, keep: Collection[str] = (), every: bool = True) -> Seal:
    """Parse and check an attempt's COMPLETE against the files it seals.

    Every sealed file is read and hashed exactly once (with ``every=False`` only the kept
    ones now, each other one when ``Seal.read`` reads it); the bytes of the names in ``keep``
    are returned in ``Seal.contents`` (so a caller loads exactly what was checked, without
    hashing again). Symbolic links and other non-regular files are refused anywhere in the
    attempt."""
    if not real_directory(attempt_dir) or not real_directory(attempt_dir.parent):
        raise SealError(layout.COMPLETE, "the attempt (or its case) is not a directory: refused")
    complete = attempt_dir / layout.COMPLETE
    if not os.path.lexists(complete):
        raise SealError(layout.COMPLETE, "missing: the attempt never completed")
    manifest = read_manifest(
        complete, ATTEMPT_SEAL, name=layout.COMPLETE, missing="missing: the attempt never completed"
    )
    attempt_id, case_id = manifest.header["attempt_id"], manifest.header["case_id"]
    if attempt_id != attempt_dir.name:
        raise SealError(
            layout.COMPLETE,
            f"seal names attempt {attempt_id!r}, directory is {attempt_dir.name!r}",
        )
    if case_id != attempt_dir.parent.name:
        raise SealError(
            layout.COMPLETE,
            f"seal names case {case_id!r}, directory is {attempt_dir.parent.name!r}",
        )
    contents = verify_directory(attempt_dir, manifest, keep=keep, every=every)
    return Seal(directory=attempt_dir, manifest=manifest, contents=contents)


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


def _text(value: object) -> str:
    """A ``str`` subclass (``torch.__version__``) as the string it is, as ``json`` writes it;
    any other object JSON has no form for is refused."""
    if isinstance(value, str):
        return str(value)
    raise NotImplementedError(f"{type(value).__name__} has no JSON form")


class AttemptWriter:
    """Writes one attempt; ``seal()`` publishes COMPLETE last. Never overwrites anything."""

    def __init__(self, case_dir: Path, case_id: str, execution_key: str) -> None:
        try:
            case_dir.parent.mkdir(parents=True, exist_ok=True)
            check_directory(case_dir.parent)  # cases/: never a symbolic link
            make_directory(case_dir)
            while True:
                attempt_id = new_attempt_id()
                try:
                    (case_dir / attempt_id).mkdir()
                    break
                except FileExistsError:  # pragma: no cover - random suffix collision
                    continue
            fsync_dir(case_dir)
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

    def write_document(self, document: Document) -> None:
        """The one way an attempt's typed documents are written: as the file their type is
        read from (``documents.document_file``), in the store's JSON form."""
        self.write_json(document_file(document), msgspec.to_builtins(document, enc_hook=_text))

    def _durable(self) -> None:
        """Every payload and the directory durable: what COMPLETE may then vouch for."""
        syncs, self._syncs = self._syncs, []
        for sync in syncs:
            sync.join()
        for sync in syncs:
            if sync.error is not None:
                raise StorageError(sync.path, "sync it to disk", sync.error)
        try:
            fsync_dir(self.directory)
        except OSError as exc:
            raise StorageError(self.directory, "sync the directory", exc) from None

    def seal(self) -> Seal:
        self._durable()
        header = {
            "case_id": self.case_id,
            "attempt_id": self.attempt_id,
            "execution_key": self.execution_key,
        }
        manifest = write_manifest(
            self.directory, layout.COMPLETE, new_manifest(ATTEMPT_SEAL, header, self._digests)
        )
        self._sealed = True
        return Seal(directory=self.directory, manifest=manifest)
