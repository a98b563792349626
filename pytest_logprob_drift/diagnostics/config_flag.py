"""A config key that is a plain switch (``$.diagnostics.<key>``: a boolean; ``true`` asks for
the diagnostic, and its execution-key member is ``true``). Torch-free and typing-free."""

from __future__ import annotations

from pytest_logprob_drift.diagnostics.config_key import ConfigKey

TYPE_CHECKING = False  # typing is never imported at run time
if TYPE_CHECKING:
    from pytest_logprob_drift.diagnostics.protocol import ConfigFields
    from pytest_logprob_drift.records import JsonValue


def _parse(fields: ConfigFields, value: JsonValue, path: str) -> bool | None:
    if not isinstance(value, bool):
        fields.expected(path, "a boolean", value)
        return None
    return True if value else None


def _contribution(value: object) -> JsonValue:
    return True


def switch(key: str) -> ConfigKey:
    """The config key ``key`` as a switch."""
    return ConfigKey(key=key, parse=_parse, contribution=_contribution)
