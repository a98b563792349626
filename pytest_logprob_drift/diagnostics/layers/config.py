"""The layers' config key ``$.diagnostics.layers`` and execution-key member.

``true`` or ``{"positions_per_row": k}`` (1 .. ``LAYER_POSITIONS_LIMIT``): a ``LayerSpec``;
its execution-key member is ``true`` (every position) or ``{"positions_per_row": k}``.
Torch-free and typing-free (config loading is on ``plan``'s path).
"""

from __future__ import annotations

from pytest_logprob_drift.diagnostics.config_key import ConfigKey
from pytest_logprob_drift.records import LAYER_POSITIONS_LIMIT, LayerSpec

TYPE_CHECKING = False  # typing is never imported at run time
if TYPE_CHECKING:
    from pytest_logprob_drift.diagnostics.protocol import ConfigFields
    from pytest_logprob_drift.records import JsonValue


def _limited(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 < v <= LAYER_POSITIONS_LIMIT


def parse(fields: ConfigFields, value: JsonValue, path: str) -> LayerSpec | None:
    """The spec ``value`` asks for (None: ``false``, or a fault reported)."""
    if isinstance(value, bool):
        return LayerSpec() if value else None
    if not isinstance(value, dict):
        fields.fail(path, f"expected a boolean or an object, got {fields.type_name(value)}")
        return None
    body = fields.members(value, path, ("positions_per_row",))
    if body is None:
        return None
    expected = f"a positive integer up to {LAYER_POSITIONS_LIMIT}"
    per_row = fields.typed(body, "positions_per_row", path, _limited, expected, None)
    if "positions_per_row" in body and not isinstance(per_row, int):
        return None
    return LayerSpec(positions_per_row=per_row if isinstance(per_row, int) else None)


def contribution(spec: object) -> JsonValue:
    """``true`` for every position, ``{"positions_per_row": k}`` for at most ``k`` per row."""
    assert isinstance(spec, LayerSpec)
    per_row = spec.positions_per_row
    return True if per_row is None else {"positions_per_row": per_row}


CONFIG_KEY = ConfigKey(key="layers", parse=parse, contribution=contribution)
