"""The input files of an import: found, opened, read once, bounded, hashed while read.

Owns which files a ``PATH`` names for a format (a file as given; in a directory, the files of
the format's name pattern, not recursively: NeMo-RL's ``train_data_step<N>.jsonl``, slime's
``*.pt`` in the directory or in its ``train_data/`` when it is a ``--dump-details`` directory,
the neutral format's ``*.jsonl``/``*.ndjson``/``*.parquet``), opening each as
``config.input_file`` opens an input (a regular file, without blocking, at most
``MAX_INPUT_BYTES``: one NeMo-RL step file of a real run is tens of MB), refusing an empty
file and a Python pickle by its magic bytes before anything parses it (it is never
unpickled), and reading it in one pass: JSONL line by line (each line at most
``MAX_LINE_BYTES``), a torch file whole, the SHA-256 of every byte taken as it is read. Every
refusal is an ``ImportInputError``: one line naming the file (and the line or sample), exit 2.
Knows nothing about what the records mean; imports only the standard library.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pytest_logprob_drift.errors import UsageError

MAX_INPUT_BYTES = 2 * 2**30
"""Largest input file read, in bytes (2 GiB)."""
MAX_LINE_BYTES = 64 * 2**20
"""Longest JSONL line read, in bytes (64 MiB: a 128k-token NeMo-RL row is about 6 MB). A line's
decoded numbers take about 12x its bytes: a line at this cap peaks near 0.8 GiB resident
(``benchmarks/bench_import_memory.py``; at 256 MiB it was 3.2 GiB)."""
NEUTRAL_DOCS = "docs/PRODUCTION_RUNS.md"
"""Where the neutral format is documented (named by every refusal that points at it)."""
NEMO_RL_NAME = re.compile(r"train_data_step([0-9]+)\.jsonl")
"""NeMo-RL's per-step file name; the step comes from it (its rows carry none)."""
PICKLE_SUFFIXES = (".pkl", ".pickle")


class ImportInputError(UsageError):
    """An input that is not imported: one line naming ``file`` and, where it applies, the
    1-based ``line`` or the ``sample`` (exit 2)."""

    def __init__(
        self, file: Path | str, message: str, *, line: int | None = None, sample: int | None = None
    ) -> None:
        where = str(file)
        if line is not None:
            where += f":{line}"
        if sample is not None:
            where += f": sample {sample}"
        self.file = str(file)
        self.line = line
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True, slots=True, kw_only=True)
class InputRecord:
    """An input file as it was read: its path as given, SHA-256 and size."""

    path: str
    sha256: str
    size: int


def _size_text(limit: int) -> str:
    return f"{limit // 2**30} GiB" if limit % 2**30 == 0 else f"{limit // 2**20} MiB"


def pickle_refusal(path: Path | str, why: str) -> ImportInputError:
    return ImportInputError(
        path,
        f"a Python pickle ({why}): never unpickled (loading one runs whatever code it names); "
        f"write the neutral JSONL format instead ({NEUTRAL_DOCS})",
    )


class InputFile:
    """One input file opened for one pass: a regular file of at most ``limit`` bytes, not
    empty, not a pickle; ``lines()`` or ``read_all()`` reads it once and ``record()`` then
    gives its SHA-256 and size."""

    def __init__(
        self,
        path: Path,
        *,
        limit: int = MAX_INPUT_BYTES,
        span: tuple[int, int, int] | None = None,
    ) -> None:
        """``span``: ``(start, stop, first line number)``: ``lines()`` reads only the bytes
        ``[start, stop)``, whole lines of a file still growing (``production.follow``)."""
        self.path = path
        self.limit = limit
        self.span = span
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ImportInputError(path, "no such file") from None
        except OSError as exc:
            raise ImportInputError(path, f"cannot open it: {exc.strerror or exc}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ImportInputError(path, "not a regular file")
            size = info.st_size if span is None else span[1] - span[0]
            if span is not None and not 0 <= span[0] <= span[1] <= info.st_size:
                raise ImportInputError(path, f"shrank below byte {span[1]} while followed")
            if size > limit:
                raise ImportInputError(
                    path,
                    f"{size} bytes, larger than the import limit of {_size_text(limit)}",
                )
            if size == 0:
                raise ImportInputError(path, "empty file: nothing to import")
            head = os.pread(fd, 8, 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        self.size = size
        self.head = head
        if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
            self.close()
            raise pickle_refusal(path, f"protocol {head[1]} magic bytes")
        if path.suffix.lower() in PICKLE_SUFFIXES:
            self.close()
            raise pickle_refusal(path, f"a {path.suffix} file")
        self._hash = hashlib.sha256()
        self._read = 0
        self._done = False

    @property
    def is_zip(self) -> bool:
        """Whether the file is a zip archive (``torch.save``'s format, Parquet is not)."""
        return self.head.startswith(b"PK\x03\x04")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _take(self, data: bytes) -> None:
        self._read += len(data)
        if self._read > self.limit:
            raise ImportInputError(
                self.path, f"grew past the import limit of {_size_text(self.limit)} while read"
            )
        self._hash.update(data)

    def lines(self) -> Iterator[tuple[int, bytes]]:
        """``(1-based line number, bytes)`` of every line that is not blank, in one bounded
        pass (a line longer than ``MAX_LINE_BYTES`` is refused)."""
        if self._fd is None:
            raise ValueError("input already read")
        start, stop, first = (0, None, 1) if self.span is None else self.span
        os.lseek(self._fd, start, os.SEEK_SET)
        stream = io.BufferedReader(io.FileIO(self._fd, closefd=True), buffer_size=1 << 20)
        self._fd = None
        number = first - 1
        left = None if stop is None else stop - start
        with stream:
            while left is None or left > 0:
                line = stream.readline(
                    MAX_LINE_BYTES + 1 if left is None else min(MAX_LINE_BYTES + 1, left)
                )
                if not line:
                    break
                if left is not None:
                    left -= len(line)
                number += 1
                self._take(line)
                if len(line) > MAX_LINE_BYTES:
                    raise ImportInputError(
                        self.path,
                        f"line longer than {_size_text(MAX_LINE_BYTES)}: refused",
                        line=number,
                    )
                if line.strip():
                    yield number, line
        self._done = True

    def read_all(self) -> bytes:
        """Every byte of the file (at most its limit)."""
        if self.span is not None:
            raise ValueError("a span is read by lines()")
        if self._fd is None:
            raise ValueError("input already read")
        fd, self._fd = self._fd, None
        chunks: list[bytes] = []
        try:
            while chunk := os.read(fd, 1 << 22):
                self._take(chunk)
                chunks.append(chunk)
        finally:
            os.close(fd)
        self._done = True
        return b"".join(chunks)

    def record(self) -> InputRecord:
        """The file's path, SHA-256 and size (once it was read to its end)."""
        if not self._done:
            raise ValueError(f"{self.path} was not read to its end")
        return InputRecord(path=str(self.path), sha256=self._hash.hexdigest(), size=self._read)


def _natural(name: str) -> tuple[tuple[int, int | str], ...]:
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part)
        for part in re.split(r"([0-9]+)", name)
        if part
    )


def nemo_rl_step(path: Path) -> int:
    """The step of a NeMo-RL ``train_data_step<N>.jsonl`` from its name (its rows carry
    none)."""
    match = NEMO_RL_NAME.fullmatch(path.name)
    if match is None:
        raise ImportInputError(
            path,
            "not named train_data_step<N>.jsonl: NeMo-RL's rows carry no step, so it comes "
            "from the file name NeMo-RL gives each step's file",
        )
    return int(match.group(1))


def _nemo_rl_file(path: Path) -> bool:
    return NEMO_RL_NAME.fullmatch(path.name) is not None


def _slime_file(path: Path) -> bool:
    return path.suffix == ".pt"


def _neutral_file(path: Path) -> bool:
    return path.suffix.lower() in (".jsonl", ".ndjson", ".parquet", ".pq")


_PATTERNS: dict[str, tuple[str, Callable[[Path], bool]]] = {
    "nemo-rl": ("train_data_step<N>.jsonl", _nemo_rl_file),
    "slime": ("*.pt", _slime_file),
    "jsonl": ("*.jsonl, *.ndjson or *.parquet", _neutral_file),
}


def input_paths(fmt: str, paths: list[str]) -> list[Path]:
    """The files ``paths`` name for format ``fmt``, each once, ordered: NeMo-RL's by their
    step number (``train_data_step10`` after ``step2``), the others by a natural sort of the
    directory's names after the files named directly, as given."""
    pattern, matches = _PATTERNS[fmt]
    found: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            directory = path
            if fmt == "slime" and (path / "train_data").is_dir():  # a --dump-details directory
                directory = path / "train_data"
            try:
                names = sorted(os.listdir(directory), key=_natural)
            except OSError as exc:
                raise ImportInputError(path, f"cannot list it: {exc.strerror or exc}") from None
            inside = [directory / n for n in names if matches(directory / n)]
            inside = [p for p in inside if p.is_file()]
            if not inside:
                raise ImportInputError(path, f"a directory without any {pattern} file")
            found.extend(inside)
        elif path.exists() or path.is_symlink():
            found.append(path)
        else:
            raise ImportInputError(path, "no such file or directory")
    unique: dict[str, Path] = {}
    for path in found:
        unique.setdefault(os.path.realpath(path), path)
    ordered = list(unique.values())
    if fmt == "nemo-rl":
        steps = [(nemo_rl_step(p), p) for p in ordered]
        seen: dict[int, Path] = {}
        for step, p in steps:
            if step in seen:
                raise ImportInputError(p, f"step {step} again (also {seen[step]})")
            seen[step] = p
        ordered = [p for _, p in sorted(steps, key=lambda item: item[0])]
    return ordered
