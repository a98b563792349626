"""A disk that fills up: a 64 KiB tmpfs mounted for the length of a ``with`` block.

Owns ``small_tmpfs`` and ``fill``, shared by the ``tiny_tmpfs`` fixture
(``tests/conftest.py``) and the tests that fill it. Mounting needs root; where it cannot be
mounted the block gets the reason instead of a path.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SIZE = "64k"


@contextmanager
def small_tmpfs(mount: Path) -> Iterator[Path | str]:
    """A ``SIZE`` tmpfs at ``mount`` (made here; unmounted when the block ends), or why none
    could be mounted (not root, no ``mount``)."""
    if os.geteuid() != 0:
        yield "mounting a small tmpfs to fill needs root"
        return
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        yield f"cannot mount a tmpfs here: {result.stderr.strip()}"
        return
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path, leave: int = 0) -> Path:
    """Fill the file system of ``directory`` up to ``leave`` free bytes (the file ``filler``
    in it, returned)."""
    filler = directory / "filler"
    stat_ = os.statvfs(directory)
    filler.write_bytes(b"\0" * max(stat_.f_bavail * stat_.f_frsize - leave, 0))
    return filler
