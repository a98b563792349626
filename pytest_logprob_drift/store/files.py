"""File-system primitives of the store: exclusive publishing, confined reads, hashing, fsync.

Owns how a file is created (written to a temporary name in its directory, hashed while it is
written: each byte once, then hard-linked into place, which fails rather than overwrite, and
the temporary name removed; fsynced with its directory unless the caller syncs later), how a
file that should be regular is opened (never through a symbolic link, never blocking on a
FIFO) and read (whole, or refused above a size), how a directory below the store's root is
made or checked (never a symbolic link: the root itself may be or pass through one), and what
a plain name inside a directory is; how every JSON file of the store is written (read back at
the store's edge, ``store.decode``).
Knows nothing about seals, attempts, runs or what any file contains.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import stat
import threading
from pathlib import Path
from typing import Any

from pytest_logprob_drift.errors import StorageError

HASH_CHUNK = 1 << 20
THREADED_HASH_BYTES = 1 << 20
"""From this size on, a payload is hashed in a second thread while it is written."""
PUBLISH_TEMPORARY = re.compile(r"\.[^/]+\.[0-9a-f]{8}\.tmp")
"""Temporary names ``publish_bytes`` writes before linking (``.<name>.<8 hex>.tmp``)."""


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


def open_regular(path: Path) -> tuple[int, int]:
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


def read_fd(fd: int, size: int) -> bytes:
    """Up to ``size`` bytes from ``fd`` (fewer when the file was truncated meanwhile: a digest
    of them will say so)."""
    chunks = []
    remaining = size
    while remaining > 0:
        chunk = os.read(fd, min(remaining, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_regular(path: Path, *, limit: int | None = None) -> bytes:
    """The bytes of a regular file (``NotRegularFileError`` for a symbolic link, a FIFO...;
    ValueError when it is larger than ``limit``)."""
    fd, size = open_regular(path)
    try:
        if limit is not None and size > limit:
            raise ValueError(f"{size} bytes, more than the {limit} a seal may have")
        return read_fd(fd, size)
    finally:
        os.close(fd)


def hash_fd(fd: int) -> str:
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
    fd, _ = open_regular(path)
    try:
        return hash_fd(fd)
    finally:
        os.close(fd)


def real_directory(path: Path) -> bool:
    """Whether ``path`` is a directory itself (not a symbolic link to one)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


LINK_REFUSED = "it is a symbolic link (the store follows none below its root)"


def link_refused(error: OSError) -> OSError:
    """``error`` as the store says it: ELOOP (an ``O_NOFOLLOW`` open of a link) named as such."""
    if error.errno == errno.ELOOP:
        return OSError(errno.ELOOP, LINK_REFUSED, error.filename)
    return error


def check_directory(path: Path, *, missing_ok: bool = True) -> None:
    """Raise OSError unless ``path`` is a directory itself: ELOOP for a symbolic link (below the
    store's root none is followed), ENOTDIR for anything else; nothing when it is absent and
    ``missing_ok``."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        if missing_ok:
            return
        raise
    if stat.S_ISLNK(info.st_mode):
        raise OSError(errno.ELOOP, LINK_REFUSED, str(path))
    if not stat.S_ISDIR(info.st_mode):
        raise OSError(errno.ENOTDIR, "it is not a directory", str(path))


def make_directory(path: Path) -> None:
    """Create directory ``path`` unless it exists; either way it must be a directory itself,
    not a symbolic link to one (OSError, see ``check_directory``)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path)
    check_directory(path, missing_ok=False)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview) -> None:
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
        write_all(fd, data)
        return digest.hexdigest()
    hasher = threading.Thread(target=digest.update, args=(memoryview(data),), daemon=True)
    hasher.start()
    try:
        write_all(fd, data)
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
            fsync_dir(directory)
        except OSError as exc:
            raise StorageError(directory, "sync the directory", exc) from None
    return digest


def _discard(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def json_bytes(document: Any) -> bytes:
    """How every JSON file of the store is written: indented, sorted keys, no NaN, newline."""
    return (json.dumps(document, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()
