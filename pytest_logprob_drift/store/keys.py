"""The optional keyed seal: HMAC-SHA256 over every seal, with a key the user names.

Owns loading a seal key from a file or an environment variable (never from a config, never
printed: only its key id, an HMAC of a fixed label, is recorded), the key in effect for the
current execution or verification (a context variable the frontends set around a command or a
session), and computing and checking a seal's MAC.

Without a key a seal is a plain SHA-256 manifest: it detects corruption, partial writes and
any change to a sealed file that does not also rewrite ``COMPLETE``, but anyone who can write
the run directory can forge a consistent attempt. With a key every ``COMPLETE`` (and every
run seal of ``experiment.json``/``plan.jsonl``) carries ``mac``: resume reuses, and ``verify``
accepts, only seals whose MAC verifies under the key, so nobody without the key can forge or
alter an attempt undetected (deleting attempts, or restoring an older genuine one, remains
possible). Knows nothing about attempts' contents.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import hmac
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_logprob_drift.config.input_file import NotRegularInput, OversizedInput, read_input
from pytest_logprob_drift.errors import UsageError
from pytest_logprob_drift.records import JsonValue, canonical_json

MAC_ALGORITHM = "hmac-sha256"
MIN_KEY_BYTES = 16
MAX_KEY_FILE_BYTES = 1 << 16
_KEY_ID_LABEL = b"pytest-logprob-drift seal key id v1"
_MAC_LABEL = b"pytest-logprob-drift seal v1\n"


@dataclass(frozen=True, slots=True)
class SealKey:
    """A secret seal key and where it came from (the secret never appears in a repr)."""

    secret: bytes = field(repr=False)
    source: str

    @property
    def key_id(self) -> str:
        """A public name of the key: the first 16 hex digits of an HMAC of a fixed label."""
        return hmac.new(self.secret, _KEY_ID_LABEL, hashlib.sha256).hexdigest()[:16]

    def mac(self, document: Mapping[str, JsonValue]) -> dict[str, str]:
        """The ``mac`` entry that seals ``document`` (everything but ``mac`` itself)."""
        return {"algorithm": MAC_ALGORITHM, "key_id": self.key_id, "value": self._value(document)}

    def _value(self, document: Mapping[str, JsonValue]) -> str:
        message = _MAC_LABEL + canonical_json(dict(document)).encode("utf-8")
        return hmac.new(self.secret, message, hashlib.sha256).hexdigest()

    def problem(self, document: Mapping[str, JsonValue], mac: Any) -> str | None:
        """Why ``mac`` does not seal ``document`` under this key (None when it does)."""
        if mac is None:
            return f"not sealed with a key; {self.source} (key id {self.key_id}) is required"
        if (
            not isinstance(mac, dict)
            or set(mac) != {"algorithm", "key_id", "value"}
            or mac["algorithm"] != MAC_ALGORITHM
            or not isinstance(mac["value"], str)
        ):
            return "malformed keyed seal (mac)"
        if mac["key_id"] != self.key_id:
            return (
                f"sealed with another key (key id {mac['key_id']!r}), not {self.source} "
                f"(key id {self.key_id})"
            )
        if not hmac.compare_digest(mac["value"], self._value(document)):
            return "keyed seal does not verify: the seal was rewritten without the key"
        return None


_ACTIVE: contextvars.ContextVar[SealKey | None] = contextvars.ContextVar(
    "pytest_logprob_drift_seal_key", default=None
)


def active_key() -> SealKey | None:
    """The key new seals are made with and existing seals must verify under (None: unkeyed)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def sealing_with(key: SealKey | None) -> Iterator[None]:
    """Make ``key`` the active seal key for the duration of the block."""
    token = _ACTIVE.set(key)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def activate(key: SealKey | None) -> contextvars.Token[SealKey | None]:
    """Make ``key`` active until ``deactivate(token)`` (for a pytest session)."""
    return _ACTIVE.set(key)


def deactivate(token: contextvars.Token[SealKey | None]) -> None:
    _ACTIVE.reset(token)


def load_seal_key(
    *, file: str | None = None, env: str | None = None, flags: tuple[str, str]
) -> SealKey | None:
    """The key named by a file or an environment variable (``flags`` spell the two options in
    messages); None when neither is given. An empty name (what a CI script passes when its
    variable is unset), a missing, unreadable, non-regular, empty or short key is a UsageError
    (a run meant to be keyed must never silently run unkeyed)."""
    for value, flag in ((file, flags[0]), (env, flags[1])):
        if value is not None and not value.strip():
            raise UsageError(f"{flag} is empty: name a seal key or leave the option out")
    if file and env:
        raise UsageError(f"{flags[0]} and {flags[1]} both name a seal key; give one")
    if file:
        secret = _read_key_file(file, flags[0])
        return _checked(secret.strip(), f"the key in {file}", f"{flags[0]} {file}")
    if env:
        value = os.environ.get(env)
        if value is None:
            raise UsageError(f"{flags[1]} {env}: the environment variable is not set")
        return _checked(
            value.strip().encode("utf-8", "surrogateescape"),
            f"the key in ${env}",
            f"{flags[1]} {env}",
        )
    return None


def _read_key_file(file: str, flag: str) -> bytes:
    """The bytes of a regular key file, read as ``config.input_file`` reads every input: a FIFO,
    device or directory is refused before anything blocks on it."""
    try:
        return read_input(file, MAX_KEY_FILE_BYTES)
    except NotRegularInput:
        raise UsageError(f"{flag} {file}: not a regular file") from None
    except OversizedInput:
        raise UsageError(f"{flag} {file}: larger than {MAX_KEY_FILE_BYTES} bytes") from None
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise UsageError(f"{flag} {file}: cannot read the seal key: {reason}") from None


def _checked(secret: bytes, source: str, flag: str) -> SealKey:
    if len(secret) < MIN_KEY_BYTES:
        raise UsageError(
            f"{flag}: a seal key needs at least {MIN_KEY_BYTES} bytes, got {len(secret)}"
        )
    return SealKey(secret, source)
