"""The planted weight-sync bugs: test-only ways of getting the trainer-to-rollout push wrong.

Owns the registry of planted variants a case names as ``rollout.weight_sync=planted:NAME``
(``plan.knobs.PLANTED_SYNC_PREFIX``; planning refuses a name that is not here): each says what the
push leaves out, the dtype it pushes through, the tensors it sends from the previous policy, under
each other's names or with their initial value, whether the refit skips the prefix cache reset, and
which push it plants into (``trainer`` or ``trainer_refit``). The runner refuses such a case unless
the execution policy authorizes test-only backends, exactly as it refuses a test-only
``selected_logprob`` backend (the same flag: ``--allow-smoke-operators``). It lives in planning,
not in the smoke package, because planning checks the names and only the frontends may import the
smoke package. Torch-free and typing-free; knows nothing about engines (``execute.side_settings``
resolves the name once per case, ``runtimes.weight_push`` applies the variant).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Final

EMBEDDING: Final = "model.embed_tokens.weight"
LM_HEAD: Final = "lm_head.weight"
STALE_TENSOR: Final = "model.layers.0.mlp.down_proj.weight"
SWAPPED_EXPERT: Final = (
    "model.layers.1.mlp.experts.2.gate_proj.weight",
    "model.layers.1.mlp.experts.2.up_proj.weight",
)
"""One expert's gate and up halves of a mixture-of-experts checkpoint (the tiny MoE builds)."""
STALE_EXPERT: Final = tuple(
    f"model.layers.0.mlp.experts.1.{p}_proj.weight" for p in ("gate", "up", "down")
)
"""Every tensor of one expert of a mixture-of-experts checkpoint (the tiny MoE builds)."""
ROUTER_BIAS: Final = "mlp.gate.e_score_correction_bias"
"""The name ending of every MoE layer's router bias buffer (GLM4-MoE, DeepSeek-V3): zeros at
initialisation, learned in training, what verl#5801's push left at its initial value."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncVariant:
    """One planted sync bug (see the module docstring)."""

    name: str
    description: str
    push: str = "trainer"
    """The production value it plants into: ``trainer`` or ``trainer_refit``."""
    skip: tuple[str, ...] = ()
    through: str | None = None
    stale: tuple[str, ...] = ()
    swapped: tuple[tuple[str, str], ...] = ()
    """Pairs of tensors pushed under each other's names (an expert's ``[up; gate]``)."""
    keep_prefix_cache: bool = False
    initial: tuple[str, ...] = ()
    """Name endings of tensors pushed with their initial value (zeros), on every layer."""


SYNC_VARIANTS: Final[Mapping[str, SyncVariant]] = {
    v.name: v
    for v in (
        SyncVariant(
            name="drop_tied_embedding",
            description=f"the input embedding {EMBEDDING} (and the LM head tied to it) is "
            "left out of the push",
            skip=(EMBEDDING, LM_HEAD),
        ),
        SyncVariant(
            name="through_float16",
            description="every tensor is pushed through float16 before the rollout dtype",
            through="float16",
        ),
        SyncVariant(
            name="stale_tensor",
            description=f"{STALE_TENSOR} is pushed from the previous policy",
            stale=(STALE_TENSOR,),
        ),
        SyncVariant(
            name="swap_expert_gate_up",
            description=f"expert 2 of layer 1 is pushed as [up; gate]: {SWAPPED_EXPERT[0]} "
            f"and {SWAPPED_EXPERT[1]} under each other's names",
            swapped=(SWAPPED_EXPERT,),
        ),
        SyncVariant(
            name="refit_stale_expert",
            description="in the refit, expert 1 of layer 0 is pushed from the previous policy "
            f"(what the engine already held): {', '.join(STALE_EXPERT)}",
            push="trainer_refit",
            stale=STALE_EXPERT,
        ),
        SyncVariant(
            name="router_bias_initial",
            description=f"every MoE layer's router bias (*.{ROUTER_BIAS}) is pushed with its "
            "initial value, zeros, not the trained one (verl#5801)",
            initial=(ROUTER_BIAS,),
        ),
        SyncVariant(
            name="keep_prefix_cache",
            description="the prefix cache is not reset after the refit's push",
            push="trainer_refit",
            keep_prefix_cache=True,
        ),
    )
}


def sync_variant(name: str) -> SyncVariant:
    """The planted variant ``name``; ValueError naming the known ones otherwise."""
    try:
        return SYNC_VARIANTS[name]
    except KeyError:
        raise ValueError(
            f"no planted weight-sync variant {name!r} (known: {', '.join(sorted(SYNC_VARIANTS))})"
        ) from None
