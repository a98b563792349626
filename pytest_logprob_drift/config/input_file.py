"""Reading an input a user names (a config, a prompt file, a checkpoint's config.json, a seal
key file): only a regular file, only up to a size limit, never blocking.

Owns the one way such a file is read: opened without blocking (``O_NONBLOCK``: a FIFO with no
writer does not hang the open), checked on the open descriptor before anything is read
(anything but a regular file, such as a directory, FIFO, device like ``/dev/zero`` or socket,
is ``NotRegularInput``; a file larger than the limit, a sparse one too, is ``OversizedInput``),
and at most ``limit + 1`` bytes ever read (a file that grows past the limit while it is read
is refused the same way). Callers word the refusal for their own frontend. Knows nothing about
JSON, configs or keys; imports only the standard library.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class InputFileError(ValueError):
    """An input file that is not read: not a regular file, over its size limit, or not UTF-8."""


class NotRegularInput(InputFileError):
    """The path names something other than a regular file (``kind`` says what)."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"not a regular file ({kind})")
        self.kind = kind


class OversizedInput(InputFileError):
    """The file is larger than the limit (``size``: its size, or what was read of it)."""

    def __init__(self, message: str, *, size: int) -> None:
        super().__init__(message)
        self.size = size


def size_text(limit: int) -> str:
    return f"{limit // 2**20} MiB" if limit % 2**20 == 0 else f"{limit} bytes"


def read_input(file: Path | str, limit: int) -> bytes:
    """The bytes of the regular file ``file``, at most ``limit`` of them. OS errors
    (``FileNotFoundError`` among them) propagate; a NUL in the path is a ``ValueError``."""
    fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((name for test, name in _FILE_KINDS if test(info.st_mode)), "unknown")
            raise NotRegularInput(kind)
        if info.st_size > limit:
            raise OversizedInput(
                f"{info.st_size} bytes, larger than the limit of {size_text(limit)}",
                size=info.st_size,
            )
        chunks: list[bytes] = []
        remaining = limit + 1
        while remaining > 0 and (chunk := os.read(fd, min(remaining, 2**20))):
            chunks.append(chunk)
            remaining -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise OversizedInput(
            f"grew past the limit of {size_text(limit)} while it was read", size=len(data)
        )
    return data
