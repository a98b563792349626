"""User-facing errors, the one ExitCode enum, and remedies that frontends name.

Owns the typed errors a user can cause (bad config, bad command line or execution policy, bad
artifacts, a runtime that failed), the exit code each maps to, and their one-line rendering.
An error may carry a ``Remedy``: a code for "the execution policy must allow this", which each
frontend renders with its own flag spelling (the CLI's ``run`` flags, the plugin's
``--drift-*`` options); the core never writes a flag name. Knows nothing
about planning, execution, argparse or pytest; tracebacks are for bugs, these are for people.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Process exit codes of the CLI (and what each failure class maps to)."""

    OK = 0
    """Every case ended as expected (PASS unless an expectation says otherwise)."""
    UNEXPECTED_OUTCOME = 1
    """Some case ended with another outcome, or an attempt failed verification."""
    USAGE_ERROR = 2
    """A bad config, command line, execution policy or artifact (one line, no traceback)."""
    RUNTIME_FAILURE = 3
    """A runtime or the framework itself failed."""


class Remedy(enum.Enum):
    """What a user changes in the execution policy to get past a refusal; frontends map each
    to their own flag."""

    AUTHORIZE_TEST_OPERATORS = "authorize_test_operators"
    """Register and authorize temporary test-only operator backends."""


class DriftError(Exception):
    """Base of every error this package raises on purpose."""

    exit_code = ExitCode.RUNTIME_FAILURE
    remedy: Remedy | None = None

    def render(self) -> str:
        return str(self)


class ConfigError(DriftError):
    """A config file (or value derived from it) is wrong; ``path`` is its JSON path."""

    exit_code = ExitCode.USAGE_ERROR

    def __init__(self, path: str, message: str, *, source: str | None = None) -> None:
        self.path = path
        self.message = message
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        where = f"{self.source}: " if self.source else ""
        return f"{where}{self.path}: {self.message}"


class ConfigErrors(DriftError):
    """Several config faults found in one pass; each is a ConfigError."""

    exit_code = ExitCode.USAGE_ERROR

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = tuple(errors)
        super().__init__(self.render())

    def render(self) -> str:
        return "; ".join(e.render() for e in self.errors)


class UsageError(DriftError):
    """The command line or execution policy forbids what was asked."""

    exit_code = ExitCode.USAGE_ERROR

    def __init__(self, message: str, *, remedy: Remedy | None = None) -> None:
        self.remedy = remedy
        super().__init__(message)


class ArtifactError(DriftError):
    """An artifact on disk is missing, malformed or fails its seal."""

    exit_code = ExitCode.USAGE_ERROR

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}")


class RuntimeFailure(DriftError):
    """A runtime adapter or engine failed while executing a case."""

    exit_code = ExitCode.RUNTIME_FAILURE
