"""``module:attr`` references: the one way the framework names code it imports lazily.

Owns parsing and resolving a reference such as
``pytest_logprob_drift.runtimes.transformers.adapter:HfAdapter`` (runtime adapters, operator
factories, kernels that a rank process imports by name). Resolution imports the module only
when called, so describing and planning never import torch. Knows nothing about what the
referenced object is for.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Any


class UnresolvedReference(Exception):
    """A ``module:attr`` reference is malformed or cannot be imported."""

    def __init__(self, reference: str, message: str) -> None:
        self.reference = reference
        self.message = message
        super().__init__(f"{reference!r}: {message}")


def split_reference(reference: str) -> tuple[str, str]:
    module_name, sep, attr = reference.partition(":")
    if not sep or not module_name or not attr:
        raise UnresolvedReference(reference, "expected 'module:attr'")
    return module_name, attr


def resolve_reference(reference: str) -> Any:
    """Import the module and return the (dotted) attribute."""
    module_name, attr = split_reference(reference)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnresolvedReference(reference, f"cannot import {module_name}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UnresolvedReference(reference, f"{module_name} has no attribute {attr}") from None
    return obj
