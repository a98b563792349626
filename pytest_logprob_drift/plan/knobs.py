"""The knob catalog: the exact allowlist, lifecycles, sides, defaults, aliases, normalization.

Owns the allowlisted knob paths (the contract's ten, then the sampling-semantics four:
``rollout.logprobs_mode``, ``training.logprob_semantics``, ``training.lm_head_dtype``,
``rollout.lm_head_dtype``, then ``rollout.weight_sync``, then the mixture-of-experts three:
``rollout.expert_parallel``, ``training.moe_routing``, ``training.router_dtype``) with their
lifecycles, meanings, sides (``Side``: which settings a value reaches,
``execute.side_settings``) and defaults (the value a case that names no value runs with), path
and value aliases (``rollout.tp``, ``bf16``, ``fa2``), normalizing a raw value into a canonical
``KnobValue`` (``InvalidKnobValue`` otherwise; a test-only ``planted:NAME`` weight sync is
checked against ``plan.planted_sync`` here, once, a planted routing against
``plan.planted_routing``), the dtypes and attention backends each device supports, and how a
knob value is spelled in a case label. Knows nothing about configs, cases or runtimes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pytest_logprob_drift.records import FrozenRecord, Knob, KnobValue, Lifecycle
from pytest_logprob_drift.registry.catalog import NATIVE_BACKEND

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Any

DTYPES = ("float32", "bfloat16", "float16")
ATTENTION_BACKENDS = ("eager", "sdpa", "flex_attention", "flash_attention_2")
SHARDINGS = ("none", "fsdp")
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
LOGPROB_SEMANTICS = ("raw", "processed")
LM_HEAD_DTYPES = ("float32", "compute")
WEIGHT_SYNCS = ("checkpoint", "trainer", "trainer_refit")
PLANTED_SYNC_PREFIX = "planted:"
"""``rollout.weight_sync=planted:NAME``: a test-only planted sync bug (its registry is the
runtimes' ``planted_sync``); executing one needs the test-only authorization."""

MOE_ROUTINGS = ("natural", "replay")
ROUTER_DTYPES = ("model", "float32")
PLANTED_ROUTING_PREFIX = "planted:"
"""``training.moe_routing=planted:NAME``: a test-only planted routing change (its registry is
``plan.planted_routing``); executing one needs the test-only authorization."""

DEVICE_DTYPES: Mapping[str, tuple[str, ...]] = {
    "cpu": ("float32", "bfloat16", "float16"),
    "cuda": DTYPES,
}
DEVICE_ATTENTION: Mapping[str, tuple[str, ...]] = {
    "cpu": ("eager", "sdpa", "flex_attention"),
    "cuda": ATTENTION_BACKENDS,
}

_DTYPE_ALIASES = {
    "fp32": "float32",
    "float": "float32",
    "f32": "float32",
    "torch.float32": "float32",
    "bf16": "bfloat16",
    "torch.bfloat16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "f16": "float16",
    "torch.float16": "float16",
}
_ATTENTION_ALIASES = {
    "fa2": "flash_attention_2",
    "flash_attn_2": "flash_attention_2",
    "flash-attention-2": "flash_attention_2",
    "flash_attn": "flash_attention_2",
    "flash_attention": "flash_attention_2",
    "flex": "flex_attention",
    "torch_sdpa": "sdpa",
    "math": "eager",
}
_SHARDING_ALIASES = {
    "unsharded": "none",
    "no_shard": "none",
    "ddp": "none",
    "fsdp2": "fsdp",
    "full_shard": "fsdp",
    "fully_shard": "fsdp",
}
_LOGPROBS_MODE_ALIASES = {"raw": "raw_logprobs", "processed": "processed_logprobs"}
_SEMANTICS_ALIASES = {"raw_logprobs": "raw", "processed_logprobs": "processed"}
_LM_HEAD_ALIASES = {
    "fp32": "float32",
    "f32": "float32",
    "torch.float32": "float32",
    "compute_dtype": "compute",
    "model": "compute",
}
_BOOL_ALIASES = {"true": True, "false": False, "on": True, "off": False, "yes": True, "no": False}

PATH_ALIASES: Mapping[str, str] = {
    "batch_size": "batch.size",
    "rollout.tp": "rollout.tensor_parallel_size",
    "rollout.tp_size": "rollout.tensor_parallel_size",
    "rollout.tensor_parallel": "rollout.tensor_parallel_size",
    "rollout.cp": "rollout.context_parallel_size",
    "rollout.cp_size": "rollout.context_parallel_size",
    "rollout.context_parallel": "rollout.context_parallel_size",
    "rollout.prefix_caching": "rollout.enable_prefix_caching",
    "rollout.eager": "rollout.enforce_eager",
    "training.dtype": "training.compute_dtype",
    "training.attn": "training.attention_backend",
    "training.attn_implementation": "training.attention_backend",
    "logp.impl": "logp.backend",
    "rollout.logprob_mode": "rollout.logprobs_mode",
    "training.semantics": "training.logprob_semantics",
    "training.cast_lm_head_to_fp32": "training.lm_head_dtype",
    "rollout.cast_lm_head_to_fp32": "rollout.lm_head_dtype",
    "rollout.weights": "rollout.weight_sync",
    "training.routing_replay": "training.moe_routing",
    "rollout.ep": "rollout.expert_parallel",
    "rollout.enable_expert_parallel": "rollout.expert_parallel",
    "training.moe_router_dtype": "training.router_dtype",
}


class InvalidKnobValue(Exception):
    """A raw value that a knob cannot take; the message says what it expected."""


def _positive_int(raw: Any) -> KnobValue:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw <= 0:
        raise InvalidKnobValue(f"expected a positive integer, got {raw!r}")
    return raw


def _boolean(raw: Any) -> KnobValue:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in _BOOL_ALIASES:
        return _BOOL_ALIASES[raw.strip().lower()]
    raise InvalidKnobValue(f"expected a boolean, got {raw!r}")


def _choice(choices: tuple[str, ...], aliases: Mapping[str, str]) -> Callable[[Any], KnobValue]:
    def normalize(raw: Any) -> KnobValue:
        if not isinstance(raw, str):
            raise InvalidKnobValue(f"expected one of {', '.join(choices)}, got {raw!r}")
        key = raw.strip().lower()
        value = aliases.get(key, key)
        if value not in choices:
            raise InvalidKnobValue(
                f"expected one of {', '.join(choices)} (or an alias), got {raw!r}"
            )
        return value

    return normalize


_WEIGHT_SYNC_ALIASES = {
    "disk": "checkpoint",
    "load": "checkpoint",
    "push": "trainer",
    "trainer_push": "trainer",
    "refit": "trainer_refit",
}


def _weight_sync(raw: Any) -> KnobValue:
    """One of ``WEIGHT_SYNCS`` (or an alias), or a test-only ``planted:NAME`` whose NAME is a
    planted variant (``plan.planted_sync``, imported only for such a value)."""
    if isinstance(raw, str) and raw.strip().startswith(PLANTED_SYNC_PREFIX):
        name = raw.strip()[len(PLANTED_SYNC_PREFIX) :]
        if not name.isidentifier():
            raise InvalidKnobValue(f"expected {PLANTED_SYNC_PREFIX}NAME, got {raw!r}")
        from pytest_logprob_drift.plan.planted_sync import SYNC_VARIANTS

        if name not in SYNC_VARIANTS:
            raise InvalidKnobValue(
                f"no planted weight-sync variant {name!r} "
                f"(known: {', '.join(sorted(SYNC_VARIANTS))})"
            )
        return raw.strip()
    return _choice(WEIGHT_SYNCS, _WEIGHT_SYNC_ALIASES)(raw)


def planted_sync_name(value: KnobValue | None) -> str | None:
    """The planted variant a normalized ``rollout.weight_sync`` value names (None: a
    production value); the one place the prefix is parsed."""
    if isinstance(value, str) and value.startswith(PLANTED_SYNC_PREFIX):
        return value[len(PLANTED_SYNC_PREFIX) :]
    return None


_MOE_ROUTING_ALIASES = {"r3": "replay", "rollout": "replay", "router": "natural"}
_ROUTER_DTYPE_ALIASES = {
    "fp32": "float32",
    "f32": "float32",
    "torch.float32": "float32",
    "compute": "model",
    "compute_dtype": "model",
}


def _moe_routing(raw: Any) -> KnobValue:
    """One of ``MOE_ROUTINGS`` (or an alias), or a test-only ``planted:NAME`` whose NAME is a
    planted routing variant (``plan.planted_routing``, imported only for such a value)."""
    if isinstance(raw, str) and raw.strip().startswith(PLANTED_ROUTING_PREFIX):
        name = raw.strip()[len(PLANTED_ROUTING_PREFIX) :]
        from pytest_logprob_drift.plan.planted_routing import ROUTING_VARIANTS

        if name not in ROUTING_VARIANTS:
            raise InvalidKnobValue(
                f"no planted routing variant {name!r} "
                f"(known: {', '.join(sorted(ROUTING_VARIANTS))})"
            )
        return raw.strip()
    return _choice(MOE_ROUTINGS, _MOE_ROUTING_ALIASES)(raw)


def planted_routing_name(value: KnobValue | None) -> str | None:
    """The planted variant a normalized ``training.moe_routing`` value names (None: a
    production value); the one place the prefix is parsed."""
    if isinstance(value, str) and value.startswith(PLANTED_ROUTING_PREFIX):
        return value[len(PLANTED_ROUTING_PREFIX) :]
    return None


def _backend_id(raw: Any) -> KnobValue:
    if not isinstance(raw, str) or not raw.strip():
        raise InvalidKnobValue(f"expected a selected_logprob backend id string, got {raw!r}")
    return raw.strip()


class Side(enum.Enum):
    """Which typed settings a knob's value reaches (``execute.side_settings``): the rollout
    engine's, the training scorer's, or the request's (both sides)."""

    REQUEST = "request"
    ROLLOUT = "rollout"
    TRAINING = "training"


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class KnobSpec(FrozenRecord):
    """A knob, how to normalize its values, the side it reaches and the value a case that
    names none runs with."""

    knob: Knob
    normalize: Callable[[Any], KnobValue]
    side: Side
    default: KnobValue

    @property
    def field(self) -> str:
        """Its name in its side's settings, and (rollout and training knobs) in the
        binding's named knobs: the path without the side's prefix (``rollout.dtype`` ->
        ``dtype``); a request knob's whole path (``batch.size`` -> ``batch_size``)."""
        path = self.knob.path
        if self.side is Side.REQUEST:
            return path.replace(".", "_")
        return path.removeprefix(f"{self.side.value}.")


KNOB_CATALOG: tuple[KnobSpec, ...] = (
    KnobSpec(
        knob=Knob(
            path="batch.size",
            lifecycle=Lifecycle.REQUEST,
            meaning="Canonical sample chunking only.",
        ),
        normalize=_positive_int,
        side=Side.REQUEST,
        default=1,
    ),
    KnobSpec(
        knob=Knob(
            path="rollout.tensor_parallel_size",
            lifecycle=Lifecycle.PROCESS,
            meaning="Rollout TP world.",
        ),
        normalize=_positive_int,
        side=Side.ROLLOUT,
        default=1,
    ),
    KnobSpec(
        knob=Knob(
            path="rollout.context_parallel_size",
            lifecycle=Lifecycle.PROCESS,
            meaning="Rollout CP world.",
        ),
        normalize=_positive_int,
        side=Side.ROLLOUT,
        default=1,
    ),
    KnobSpec(
        knob=Knob(
            path="rollout.dtype",
            lifecycle=Lifecycle.ENGINE_CONSTRUCTION,
            meaning="Rollout numerical dtype.",
        ),
        normalize=_choice(DTYPES, _DTYPE_ALIASES),
        side=Side.ROLLOUT,
        default="float32",
    ),
    KnobSpec(
        knob=Knob(
            path="rollout.enable_prefix_caching",
            lifecycle=Lifecycle.ENGINE_CONSTRUCTION,
            meaning="Engine cache policy.",
        ),
        normalize=_boolean,
        side=Side.ROLLOUT,
        default=False,
    ),
    KnobSpec(
        knob=Knob(
            path="rollout.enforce_eager",
            lifecycle=Lifecycle.ENGINE_CONSTRUCTION,
            meaning="Eager versus optimized/graph path.",
        ),
        normalize=_boolean,
        side=Side.ROLLOUT,
        default=True,
    ),
    KnobSpec(
        knob=Knob(
            path="training.attention_backend",
            lifecycle=Lifecycle.ENGINE_CONSTRUCTION,
            meaning="Training scorer attention implementation.",
        ),
        normalize=_choice(ATTENTION_BACKENDS, _ATTENTION_ALIASES),
        side=Side.TRAINING,
        default="sdpa",
    ),
    KnobSpec(
        knob=Knob(
            path="training.compute_dtype",
            lifecycle=Lifecycle.ENGINE_CONSTRUCTION,
            meaning="Training scorer compute dtype.",
        ),
        normalize=_choice(DTYPES, _DTYPE_ALIASES),
        side=Side.TRAINING,
        default="float32",
    ),
    KnobSpec(
        knob=Knob(
            path="logp.backend",
            lifecycle=Lifecycle.ENGINE_CONSTRUCTION,
            meaning="Both-sides selected-logprob shortcut.",
        ),
        normalize=_backend_id,
        side=Side.REQUEST,
        default=NATIVE_BACKEND,
    ),
    KnobSpec(
        knob=Knob(
            path="training.sharding",
            lifecycle=Lifecycle.PROCESS,
            meaning="Training topology, such as unsharded or FSDP.",
        ),
        normalize=_choice(SHARDINGS, _SHARDING_ALIASES),
        side=Side.TRAINING,
        default="none",
    ),
    KnobSpec(
        knob=Knob(
            path="rollout.logprobs_mode",
            lifecycle=Lifecycle.ENGINE_CONSTRUCTION,
            meaning="Rollout-reported logprobs: of the raw logits, or of the processed logits "
            "it samples from (temperature and truncation renormalization).",
        ),
        normalize=_choice(LOGPROBS_MODES, _LOGPROBS_MODE_ALIASES),
        side=Side.ROLLOUT,
        default="raw_logprobs",
    ),
    KnobSpec(
        knob=Knob(
            path="training.logprob_semantics",
            lifecycle=Lifecycle.ENGINE_CONSTRUCTION,
            meaning="Whether the trainer applies the sampler's temperature and truncation "
            "renormalization before the log-softmax.",
        ),
        normalize=_choice(LOGPROB_SEMANTICS, _SEMANTICS_ALIASES),
        side=Side.TRAINING,
        default="raw",
    ),
    KnobSpec(
        knob=Knob(
            path="training.lm_head_dtype",
            lifecycle=Lifecycle.ENGINE_CONSTRUCTION,
            meaning="Training LM head and logits in float32, or in training.compute_dtype.",
        ),
        normalize=_choice(LM_HEAD_DTYPES, _LM_HEAD_ALIASES),
        side=Side.TRAINING,
        default="compute",
    ),
    KnobSpec(
        knob=Knob(
            path="rollout.lm_head_dtype",
            lifecycle=Lifecycle.ENGINE_CONSTRUCTION,
            meaning="Rollout LM head and logits in float32, or in rollout.dtype; a runtime "
            "that cannot run its LM head in float32 declares so and refuses it.",
        ),
        normalize=_choice(LM_HEAD_DTYPES, _LM_HEAD_ALIASES),
        side=Side.ROLLOUT,
        default="compute",
    ),
    KnobSpec(
        knob=Knob(
            path="rollout.weight_sync",
            lifecycle=Lifecycle.ENGINE_CONSTRUCTION,
            meaning="How the rollout engine gets the checkpoint's weights: loaded from disk "
            "(checkpoint), pushed from the training side into an engine started without "
            "them (trainer), or pushed under a warm engine that served a previous policy "
            "first (trainer_refit); never which weights.",
        ),
        normalize=_weight_sync,
        side=Side.ROLLOUT,
        default="checkpoint",
    ),
    KnobSpec(
        knob=Knob(
            path="rollout.expert_parallel",
            lifecycle=Lifecycle.PROCESS,
            meaning="The rollout's MoE experts split over its tensor-parallel ranks "
            "(vLLM's enable_expert_parallel) instead of each expert sharded over them.",
        ),
        normalize=_boolean,
        side=Side.ROLLOUT,
        default=False,
    ),
    KnobSpec(
        knob=Knob(
            path="training.moe_routing",
            lifecycle=Lifecycle.REQUEST,
            meaning="Mixture-of-experts routing in the training scorer: its own router's "
            "choice (natural), or the rollout's expert ids per token and layer with their "
            "weights recomputed from its own router logits (replay, R3).",
        ),
        normalize=_moe_routing,
        side=Side.TRAINING,
        default="natural",
    ),
    KnobSpec(
        knob=Knob(
            path="training.router_dtype",
            lifecycle=Lifecycle.REQUEST,
            meaning="The training MoE router's gate GEMM in the model's dtype, or in float32 "
            "(input and weight upcast in a hook; the weight stays in the model dtype).",
        ),
        normalize=_choice(ROUTER_DTYPES, _ROUTER_DTYPE_ALIASES),
        side=Side.TRAINING,
        default="model",
    ),
)
KNOBS: Mapping[str, KnobSpec] = {spec.knob.path: spec for spec in KNOB_CATALOG}

FINGERPRINTED_WHEN_NAMED = frozenset({"rollout.expert_parallel"})
"""Process knobs added after the process fingerprints were fixed: part of a process
fingerprint only when a case names them, so that every other case keeps its own."""


def value_of(requested: Mapping[str, KnobValue], path: str) -> KnobValue:
    """The value a case runs ``path`` with: the one it names, else the catalog's default
    (planning's view; the engines get typed settings, ``execute.side_settings``)."""
    return requested[path] if path in requested else KNOBS[path].default


def knob_lifecycle(path: str) -> Lifecycle:
    return KNOBS[path].knob.lifecycle


def canonical_path(path: str) -> str:
    """Alias-normalized knob path (may still be unknown)."""
    stripped = path.strip()
    return PATH_ALIASES.get(stripped, stripped)


def format_value(value: KnobValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
