"""Where transformers' own log records go while a checkpoint is loaded: a file or the terminal.

Owns following, for the transformers library, the engine-log policy the frontends set for every
engine (``runtimes.vllm.logs.route_engine_logs``): with a directory, whatever the
``transformers`` loggers write inside ``transformers_output()`` (its multi-line load report of
unexpected, missing or mismatched weights, in ANSI colours; its warnings) goes to one file per
process there (``transformers-<UTC time>-<pid>.log``, created on the first record, colour codes
removed) instead of the terminal; with None (``-v``) or no policy, transformers logs as it
would on its own. Works on the standard ``logging`` tree only, so importing it imports neither
torch nor transformers. Knows nothing about checkpoints, engines, cases or pytest.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from io import TextIOWrapper
from pathlib import Path
from typing import Final

from pytest_logprob_drift.runtimes.vllm.logs import FORMAT, engine_log_directory

LOGGER: Final = "transformers"
"""The transformers library's root logger (its modules log to children of it)."""
_COLOUR: Final = re.compile(r"\x1b\[[0-9;]*m")

_lock = threading.Lock()
_depth = 0  # transformers_output() blocks open now (engines load in parallel groups)
_restore: Callable[[], None] | None = None
_log_file: Path | None = None  # chosen per directory, like vLLM's
_written: Path | None = None


class _Uncoloured(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return _COLOUR.sub("", super().format(record))


class _LogFile(logging.FileHandler):
    """A file handler that creates its directory (and the file) on the first record only."""

    def _open(self) -> TextIOWrapper:
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


def transformers_log_file() -> Path | None:
    """The file this process's transformers records went to (None when none was written)."""
    return _written


def _file(directory: Path) -> Path:
    global _log_file
    directory = directory.resolve()
    if _log_file is None or _log_file.parent != directory:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        _log_file = directory / f"transformers-{now}-{os.getpid()}.log"
    return _log_file


def _route(path: Path) -> Callable[[], None]:
    """Send the ``transformers`` logger's records to ``path`` instead of its terminal
    handlers (and not on to the root logger); returns what puts them back."""
    logger = logging.getLogger(LOGGER)
    before = list(logger.handlers)
    terminal = [
        h
        for h in before
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
    ]
    propagate = logger.propagate
    handler = _LogFile(path, encoding="utf-8", delay=True)
    handler.setFormatter(_Uncoloured(FORMAT))
    for h in terminal:
        logger.removeHandler(h)
    logger.addHandler(handler)
    logger.propagate = False

    def restore() -> None:
        global _written
        logger.removeHandler(handler)
        handler.close()
        now = list(logger.handlers)  # in their old order, and any added meanwhile after them
        logger.handlers = [h for h in before if h in now or h in terminal] + [
            h for h in now if h not in before
        ]
        logger.propagate = propagate
        if path.exists():
            _written = path

    return restore


@contextmanager
def transformers_output() -> Iterator[None]:
    """Inside the block, transformers' log records go where the engine-log policy says."""
    global _depth, _restore
    directory = engine_log_directory()
    if directory is None:
        yield
        return
    with _lock:
        if _depth == 0:
            _restore = _route(_file(directory))
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _restore is not None:
                _restore()
                _restore = None
