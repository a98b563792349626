"""The JSON shape of the sealed documents beside ``comparison.json``, checked where they are read.

Owns a small declarative shape language (a JSON type; an object whose listed members must be
present, or may be absent, with their shapes; an array of one shape; a value that may be null)
with ``shape_problem``, which names the JSON path of the first value of another shape, and the
shapes of the fields that readers use in an attempt's ``requested.json``, ``identity.json``,
``actual.json`` and ``materialized.json`` (``DOCUMENT_SHAPES``), in a run's ``experiment.json``
and in a ``plan.jsonl`` row. ``store.resume.load_sealed_json`` applies them to every sealed
document it loads (a mismatch is the attempt's ``SealError`` naming the file and JSON path),
so no reader's ``.get`` meets a value of a type it does not expect. ``comparison.json`` has its
own typed read model (``numerics.comparison``); the attribution document's shape is
``attribution.sealed``'s. Knows nothing about what the fields mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_logprob_drift.errors import json_member
from pytest_logprob_drift.store import layout


@dataclass(frozen=True, slots=True)
class Nullable:
    """``shape``, or null."""

    shape: Any


@dataclass(frozen=True, slots=True)
class Absent:
    """An object member that may be missing; when present it has ``shape``."""

    shape: Any


NUMBER = float
"""A JSON number (an integer or not; never a boolean)."""
_NAMES: Mapping[Any, str] = {
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    dict: "an object",
    list: "an array",
}


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    for kind in (bool, int, float, str, list, dict):
        if isinstance(value, kind):
            return _NAMES[kind]
    return type(value).__name__


def shape_problem(value: Any, shape: Any, path: str = "$") -> str | None:
    """Where and how ``value`` is not of ``shape`` (None when it is). A shape is a JSON type
    (``str``, ``bool``, ``int``, ``NUMBER``, ``dict``: any object, ``list``: any array,
    ``object``: anything), a ``dict`` of member shapes (``Absent`` for optional members; other
    members are allowed), a one-element ``list`` (every item of that shape) or ``Nullable``."""
    if isinstance(shape, Nullable):
        return None if value is None else shape_problem(value, shape.shape, path)
    if shape is object:
        return None
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{path}: expected an object, found {_type_name(value)}"
        for key, member in shape.items():
            if key not in value:
                if isinstance(member, Absent):
                    continue
                return f"{json_member(path, key)}: missing"
            inner = member.shape if isinstance(member, Absent) else member
            problem = shape_problem(value[key], inner, json_member(path, key))
            if problem is not None:
                return problem
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"{path}: expected an array, found {_type_name(value)}"
        for index, item in enumerate(value):
            problem = shape_problem(item, shape[0], f"{path}[{index}]")
            if problem is not None:
                return problem
        return None
    if shape is NUMBER:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif shape is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, shape)
    return None if ok else f"{path}: expected {_NAMES[shape]}, found {_type_name(value)}"


DOCUMENT_SHAPES: Mapping[str, Any] = {
    layout.REQUESTED: {"changed": Absent([str]), "knobs": Absent(dict)},
    layout.IDENTITY: {
        "execution_key_payload": Absent(
            {
                "environment": Absent(Nullable(dict)),
                "contract": Absent(Nullable(dict)),
                "runtime": Absent(Nullable(str)),
            }
        ),
        "rollout": Absent(Nullable(dict)),
        "training": Absent(Nullable(dict)),
        "identity": Absent(Nullable({"checkpoint": Absent(Nullable(dict))})),
    },
    layout.ACTUAL: {
        "training_evidence": Absent(Nullable(dict)),
        "read_back": Absent(Nullable(dict)),
    },
    layout.MATERIALIZED: {},
}
"""The fields readers use in each sealed attempt document, and their shapes."""
EXPERIMENT_SHAPE: Any = {
    "experiment_id": Absent(str),
    "scenario_id": Absent(str),
    "scenario": Absent(Nullable(dict)),
    "strategy": Absent(str),
    "contract": Absent(Nullable(dict)),
}
"""The fields the report reads from a run's ``experiment.json``."""
PLAN_ROW_SHAPE: Any = {"case_id": str, "label": Absent(str), "changed": Absent([str])}
"""The fields the report reads from a ``plan.jsonl`` row."""
