"""The planted routing changes: test-only ways of getting the training side's MoE routing wrong.

Owns the registry of planted variants a case names as ``training.moe_routing=planted:NAME``
(``plan.knobs.PLANTED_ROUTING_PREFIX``; planning refuses a name that is not here): each says at
which MoE layer (0-based, in layer order) the training scorer's router swaps every token's
lowest-ranked chosen expert for the best expert it did not choose. Like the planted weight-sync
bugs (``plan.planted_sync``), the runner refuses such a case unless the execution policy
authorizes test-only backends (``--allow-smoke-operators``). Torch-free and typing-free; knows
nothing about engines (``runtimes.transformers.moe`` applies the variant).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Final


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutingVariant:
    """One planted routing change (see the module docstring)."""

    name: str
    description: str
    flip_layer: int


ROUTING_VARIANTS: Final[Mapping[str, RoutingVariant]] = {
    v.name: v
    for v in (
        RoutingVariant(
            name="flip-layer-1",
            description="at MoE layer 1 the training router swaps every token's lowest-ranked "
            "chosen expert for the best expert it did not choose",
            flip_layer=1,
        ),
    )
}


def routing_variant(name: str) -> RoutingVariant:
    """The planted variant ``name``; ValueError naming the known ones otherwise."""
    try:
        return ROUTING_VARIANTS[name]
    except KeyError:
        raise ValueError(
            f"no planted routing variant {name!r} (known: {', '.join(sorted(ROUTING_VARIANTS))})"
        ) from None
