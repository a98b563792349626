"""Where vLLM's own output goes: a log file beside the artifacts, or the terminal.

Owns the process-wide engine-log policy a frontend sets (``route_engine_logs``): with a
directory, everything vLLM writes goes to one file per process there
(``vllm-<UTC time>-<pid>.log``): the ``vllm`` loggers (the logger and its children, at INFO
unless ``VLLM_LOGGING_LEVEL`` says otherwise) of this process and of every engine process,
through a ``dictConfig`` file beside the log named by ``VLLM_LOGGING_CONFIG_PATH`` (which vLLM
applies whenever it configures logging; a user's own setting wins), and, while vLLM is
imported and while an engine is constructed, this process's stdout/stderr file descriptors,
which the engine-core and worker processes inherit for their lifetime (whatever they print
outside logging: warnings, tracebacks). With ``None`` vLLM logs to the terminal as it would on
its own. Unset (library use), vLLM logs WARNING and above to the terminal. Knows nothing
about vLLM's objects, cases or pytest; importing it imports neither torch nor vLLM.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

VLLM_LOGGER: Final = "vllm"
LEVEL_ENV: Final = "VLLM_LOGGING_LEVEL"
CONFIG_ENV: Final = "VLLM_LOGGING_CONFIG_PATH"
FORMAT: Final = "%(levelname)s %(asctime)s %(process)d [%(name)s] %(message)s"
_MARK: Final = "_logprob_drift_engine_log"


@dataclass(frozen=True, slots=True)
class EngineLogPolicy:
    directory: Path | None
    """Where the log file goes; None shows vLLM's output on the terminal."""


_policy: EngineLogPolicy | None = None
_log_file: Path | None = None
_config_file: Path | None = None


def route_engine_logs(directory: Path | None) -> EngineLogPolicy | None:
    """Keep vLLM's output in a file under ``directory`` (None: show it on the terminal);
    returns the policy it replaces (for ``restore_engine_logs``)."""
    global _policy
    previous, _policy = _policy, EngineLogPolicy(directory=directory)
    return previous


def restore_engine_logs(previous: EngineLogPolicy | None) -> None:
    """Put back the policy ``route_engine_logs`` replaced, and take this policy's logging
    config out of the environment (a process started afterwards, an engine or a CLI run,
    must not inherit it; the next engine under a file policy writes it again)."""
    global _policy
    _policy = previous
    _forget_logging_config()


def engine_log_directory() -> Path | None:
    """Where the policy sends engine output (None: the terminal, or no policy set); other
    engines' own logs (``runtimes.transformers.logs``) follow it too."""
    return None if _policy is None else _policy.directory


def engine_log_file() -> Path | None:
    """The file this process's vLLM output went to (None when nothing was written there)."""
    return _log_file


def _file(directory: Path) -> Path:
    global _log_file
    directory = directory.resolve()
    if _log_file is None or _log_file.parent != directory:
        directory.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        _log_file = directory / f"vllm-{now}-{os.getpid()}.log"
    return _log_file


@contextmanager
def _descriptors_to(path: Path | None) -> Iterator[None]:
    """Point fds 1 and 2 at ``path`` (appending) for the block; child processes started
    inside keep writing there."""
    if path is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    saved = (os.dup(1), os.dup(2))
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)


def _attach(path: Path) -> None:
    """Replace the ``vllm`` logger's terminal handlers by one file handler on ``path``."""
    logger = logging.getLogger(VLLM_LOGGER)
    for handler in list(logger.handlers):
        if isinstance(handler, logging.FileHandler):
            if Path(handler.baseFilename) == path:
                return
            if getattr(handler, _MARK, False):
                logger.removeHandler(handler)
                handler.close()
        elif isinstance(handler, logging.StreamHandler):
            logger.removeHandler(handler)
    handler = logging.FileHandler(path, encoding="utf-8")
    setattr(handler, _MARK, True)
    handler.setFormatter(logging.Formatter(FORMAT))
    logger.addHandler(handler)
    logger.propagate = False
    # The file gets vLLM's own default level (INFO) unless the user set one, also when an
    # earlier import already configured the logger for the terminal.
    logger.setLevel(os.environ.get(LEVEL_ENV, "INFO").upper())


def _logging_config(path: Path) -> None:
    """Point vLLM's own logging configuration (``VLLM_LOGGING_CONFIG_PATH``, which vLLM applies
    whenever it configures logging, in this process and in every engine process) at a
    ``dictConfig`` that writes to ``path``, unless the user chose a configuration."""
    global _config_file
    current = os.environ.get(CONFIG_ENV)
    if current is not None and current != str(_config_file):
        return  # the user's own logging configuration wins
    config = path.with_name(path.stem + ".logging.json")
    if not config.exists():
        level = os.environ.get(LEVEL_ENV, "INFO").upper()
        config.write_text(
            json.dumps(
                {
                    "version": 1,
                    "disable_existing_loggers": False,
                    "formatters": {"drift": {"format": FORMAT}},
                    "handlers": {
                        "file": {
                            "class": "logging.FileHandler",
                            "filename": str(path),
                            "encoding": "utf-8",
                            "formatter": "drift",
                        }
                    },
                    "loggers": {
                        VLLM_LOGGER: {"handlers": ["file"], "level": level, "propagate": False}
                    },
                },
                indent=2,
            )
            + "\n"
        )
    _config_file = config
    os.environ[CONFIG_ENV] = str(config)


def _forget_logging_config() -> None:
    """Undo ``_logging_config`` (vLLM's output goes back to the terminal)."""
    if _config_file is not None and os.environ.get(CONFIG_ENV) == str(_config_file):
        del os.environ[CONFIG_ENV]


def prepare_vllm_logging() -> None:
    """Apply the policy; call before vLLM is imported or an engine is built. Imports vLLM
    when the output goes to a file (so that its import-time output goes there too)."""
    policy = _policy
    if policy is None or policy.directory is None:
        _forget_logging_config()
        if policy is None:
            os.environ.setdefault(LEVEL_ENV, "WARNING")
        return
    os.environ.setdefault(LEVEL_ENV, "INFO")
    path = _file(policy.directory)
    _logging_config(path)
    with _descriptors_to(path):
        import vllm  # noqa: F401  (anything it prints on import goes to the file)
    _attach(path)


@contextmanager
def engine_output() -> Iterator[Path | None]:
    """Around an engine construction: its processes' stdout/stderr go to the log file."""
    policy = _policy
    if policy is None or policy.directory is None:
        yield None
        return
    path = _file(policy.directory)
    _attach(path)
    with _descriptors_to(path):
        try:
            yield path
        finally:  # vLLM (re)configures its loggers while it builds an engine
            _attach(path)
