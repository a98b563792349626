"""User-facing error types.

Owns the typed errors a user can cause (bad config, bad command line, bad artifacts) and their
one-line rendering. Knows nothing about planning, execution or pytest; tracebacks are for bugs,
these are for people.
"""

from __future__ import annotations


class DriftError(Exception):
    """Base of every error this package raises on purpose."""

    exit_code = 3

    def render(self) -> str:
        return str(self)


class ConfigError(DriftError):
    """A config file (or value derived from it) is wrong; ``path`` is its JSON path."""

    exit_code = 2

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

    exit_code = 2

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = tuple(errors)
        super().__init__(self.render())

    def render(self) -> str:
        return "; ".join(e.render() for e in self.errors)


class UsageError(DriftError):
    """The command line or execution policy forbids what was asked."""

    exit_code = 2


class ArtifactError(DriftError):
    """An artifact on disk is missing, malformed or fails its seal."""

    exit_code = 2

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}")


class RuntimeFailure(DriftError):
    """A runtime adapter or engine failed while executing a case."""

    exit_code = 3
