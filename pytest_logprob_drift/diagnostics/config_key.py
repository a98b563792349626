"""A diagnostic's config key: ``$.diagnostics.<key>``, how its value is read, and its member of
the execution key.

Torch-free and typing-free (config loading is on ``plan``'s path): each built-in folder's
``__init__`` declares its ``CONFIG_KEY`` (or None) from a ``config`` module importing no
diagnostic, and ``registry.config_keys`` collects them without importing the diagnostics.
"""

from __future__ import annotations

from dataclasses import dataclass

TYPE_CHECKING = False  # typing is never imported at run time (config loading is on plan's path)
if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_logprob_drift.diagnostics.protocol import ConfigFields
    from pytest_logprob_drift.records import JsonValue


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigKey:
    """One diagnostic's config key (its name under ``$.diagnostics``, not always the
    diagnostic's: the path split is asked for by ``replay``)."""

    key: str
    parse: Callable[[ConfigFields, JsonValue, str], object | None]
    """``parse(fields, value, path)``: the asked-for value of ``value`` found at ``path``
    (``$.diagnostics.<key>``), None when it asks for nothing (``false``); each fault is
    reported through ``fields.fail(path, message)`` in the loader's style (and None returned)."""
    contribution: Callable[[object], JsonValue]
    """The execution key's ``diagnostics.<key>`` member for a parsed value (only present when
    asked for, so that the keys of experiments without it are unchanged)."""
