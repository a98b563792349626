"""User-facing errors, the one ExitCode enum, and remedies that frontends name.

Owns the typed errors a user can cause (bad config, bad command line or execution policy, bad
artifacts, a runtime that failed), the exit code each maps to, their one-line rendering, and how
a message names a JSON value's type (``json_type_name``).
An error may carry a ``Remedy``: a code for "the execution policy must allow this", which each
frontend renders with its own flag spelling (the CLI's ``run`` flags, the plugin's
``--drift-*`` options); the core never writes a flag name. Knows nothing
about planning, execution, argparse or pytest; tracebacks are for bugs, these are for people.
"""

from __future__ import annotations

import enum
import errno
import re
from collections.abc import Mapping


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
    SIGNATURE = 4
    """``import --follow --exit-on``: a named drift signature or gate was first crossed (the
    step that crossed it is sealed), so a training job's sidecar can act."""


class Remedy(enum.Enum):
    """What a user changes in the execution policy to get past a refusal; frontends map each
    to their own flag."""

    AUTHORIZE_TEST_OPERATORS = "authorize_test_operators"
    """Register and authorize temporary test-only operator backends."""
    EXPAND_PAIRS = "expand_pairs"
    """Expand the config's listed path pairs (pairwise planning)."""


def _escaped(ch: str) -> str:
    code = ord(ch)
    if ch in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[ch]
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def json_type_name(value: object) -> str:
    """How an error message names a JSON value's type: ``null``, ``a boolean``, ``a number``,
    ``a string``, ``an array``, ``an object`` (else the Python type's name)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def one_line(text: str) -> str:
    """``text`` with every non-printable character escaped (line breaks, terminal escape
    sequences, bidirectional overrides, lone surrogates...): what a user-facing message is
    printed as, so that one error is exactly one line and never drives the terminal."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escaped(ch) for ch in text)


_PLAIN_MEMBER = re.compile(r"[A-Za-z0-9_-]+")


def json_member(parent: str, key: str) -> str:
    """The JSON path of member ``key`` of the object at ``parent``: ``$.a.b`` for plain keys,
    ``$.a["odd key"]`` (a JSON string) for any other, so a path is unambiguous and one line."""
    if _PLAIN_MEMBER.fullmatch(key):
        return f"{parent}.{key}"
    return f"{parent}[{_json_string(key)}]"


def _json_string(text: str) -> str:
    body = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{one_line(body)}"'


class DriftError(Exception):
    """Base of every error this package raises on purpose."""

    exit_code = ExitCode.RUNTIME_FAILURE
    remedy: Remedy | None = None

    def render(self) -> str:
        return one_line(str(self))


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
        return one_line(f"{where}{self.path}: {self.message}")


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


class InvalidRunError(ArtifactError):
    """A run directory whose sealed files contradict themselves (a sealed line of
    ``plan.jsonl`` that is not a plan row): invalid, as ``verify`` says (exit 1)."""

    exit_code = ExitCode.UNEXPECTED_OUTCOME


class RuntimeFailure(DriftError):
    """A runtime adapter or engine failed while executing a case."""

    exit_code = ExitCode.RUNTIME_FAILURE


USAGE_ERRNOS = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.EEXIST,
        errno.ENOENT,
        errno.ENAMETOOLONG,
        errno.ELOOP,
    }
)
"""File-system errors that mean "this location cannot hold a run" (exit 2); any other
(a full disk, an I/O error) is a runtime failure (exit 3)."""


class StorageError(DriftError, OSError):
    """The artifact store could not read or write a path: a location that cannot hold a run
    (not a directory, read-only, permission denied: exit 2) or an I/O failure such as a full
    disk (exit 3). Also an ``OSError`` carrying the original errno, so callers that handle
    file-system errors keep working."""

    def __init__(self, path: object, doing: str, error: OSError) -> None:
        self.path = str(path)
        self.doing = doing
        self.message = f"{self.path}: cannot {doing}: {error.strerror or error}"
        OSError.__init__(self, error.errno, self.message)
        self.exit_code = (
            ExitCode.USAGE_ERROR if error.errno in USAGE_ERRNOS else ExitCode.RUNTIME_FAILURE
        )

    def __str__(self) -> str:
        return self.message
