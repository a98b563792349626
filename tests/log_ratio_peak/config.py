"""The test diagnostic's own config key ``$.diagnostics.log_ratio_peak``: ``true``, or
``{"top": k}`` (1 .. 8, default 1); false or absent asks for nothing. Its execution-key member
is ``{"top": k}``. Declared torch-free, as a built-in folder's ``config`` is; the loader
accepts it only while the diagnostic is installed."""

from __future__ import annotations

from pytest_logprob_drift.diagnostics.config_key import ConfigKey

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pytest_logprob_drift.diagnostics.protocol import ConfigFields
    from pytest_logprob_drift.records import JsonValue

KEY = "log_ratio_peak"
TOP_LIMIT = 8


def _top(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 < v <= TOP_LIMIT


def parse(fields: ConfigFields, value: JsonValue, path: str) -> int | None:
    """The number of peaks asked for (None: ``false``, or a fault reported)."""
    if isinstance(value, bool):
        return 1 if value else None
    body = fields.members(value, path, ("top",))
    if body is None:
        return None
    top = fields.typed(body, "top", path, _top, f"a positive integer up to {TOP_LIMIT}", 1)
    return top if isinstance(top, int) else None


def contribution(top: object) -> JsonValue:
    assert isinstance(top, int)
    return {"top": top}


CONFIG_KEY = ConfigKey(key=KEY, parse=parse, contribution=contribution)
