"""Test support: the strings of a sealed document that hold another format (JSON or a Python
literal list/dict/tuple/set as text), found by walking every string of the document."""

from __future__ import annotations

import ast
import json
from typing import Any


def _holds_a_container(text: str) -> bool:
    """Whether ``text`` is a JSON array/object, or a Python literal list, dict, tuple or set."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{(":
        return False
    try:
        return isinstance(json.loads(stripped), (list, dict))
    except ValueError:
        pass
    try:
        return isinstance(ast.literal_eval(stripped), (list, dict, tuple, set))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


def text_in_strings(document: Any, path: str = "$") -> list[str]:
    """The JSON path of every string member of ``document`` (parsed JSON) that holds a
    container as text; empty when every list and object is nested JSON."""
    if isinstance(document, dict):
        return [p for k, v in document.items() for p in text_in_strings(v, f"{path}.{k}")]
    if isinstance(document, list):
        return [p for i, v in enumerate(document) for p in text_in_strings(v, f"{path}[{i}]")]
    if isinstance(document, str) and _holds_a_container(document):
        return [path]
    return []
