"""The typed knob settings each side's engines are built from, derived once per case.

Owns ``RolloutSettings``, ``TrainingSettings`` and ``RequestSettings`` (one frozen, kw-only
dataclass per side, one field per knob of that side in the catalog, Enums where the value set
is closed), the typed ``WeightSync`` (the push, and the test-only planted variant planning
already resolved) and ``MoeRouting`` (natural, replay, or a test-only planted routing
change), and ``build_settings``: the catalog's default for every knob a case does not name,
each value typed by its field. The settings are for the engines only: the named knobs stay
what ``requested.json`` seals and what the construction fingerprints hash; nothing here is
sealed or hashed. A knob added later is one catalog entry plus one field here (or in a
subclass handed to ``execute.protocol.bind_case``). Knows nothing about engines or torch.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar, get_type_hints

from pytest_logprob_drift.plan.knobs import (
    KNOBS,
    KnobSpec,
    Side,
    planted_routing_name,
    planted_sync_name,
)
from pytest_logprob_drift.plan.planted_routing import RoutingVariant, routing_variant
from pytest_logprob_drift.plan.planted_sync import SyncVariant, sync_variant
from pytest_logprob_drift.records import KnobValue


class DType(enum.Enum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


class LmHeadDtype(enum.Enum):
    FLOAT32 = "float32"
    COMPUTE = "compute"


class AttentionBackend(enum.Enum):
    EAGER = "eager"
    SDPA = "sdpa"
    FLEX_ATTENTION = "flex_attention"
    FLASH_ATTENTION_2 = "flash_attention_2"


class Sharding(enum.Enum):
    NONE = "none"
    FSDP = "fsdp"


class LogprobsMode(enum.Enum):
    RAW_LOGPROBS = "raw_logprobs"
    PROCESSED_LOGPROBS = "processed_logprobs"


class LogprobSemantics(enum.Enum):
    RAW = "raw"
    PROCESSED = "processed"


class SyncPush(enum.Enum):
    """How the rollout engine gets the checkpoint's weights."""

    CHECKPOINT = "checkpoint"
    TRAINER = "trainer"
    TRAINER_REFIT = "trainer_refit"


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightSync:
    """``rollout.weight_sync`` typed: the push the engine runs and, for a test-only
    ``planted:NAME`` value, the planted variant (whose own ``push`` that is)."""

    push: SyncPush
    planted: SyncVariant | None = None

    @classmethod
    def from_knob(cls, value: KnobValue) -> WeightSync:
        """From a value planning normalized (a planted name it already checked)."""
        name = planted_sync_name(value)
        if name is None:
            return cls(push=SyncPush(value))
        variant = sync_variant(name)
        return cls(push=SyncPush(variant.push), planted=variant)

    @property
    def from_checkpoint(self) -> bool:
        """Whether the engine loads the checkpoint from disk (no push)."""
        return self.push is SyncPush.CHECKPOINT

    @property
    def knob_value(self) -> str:
        """The knob's value as requested (what the engine reads back once it is done)."""
        return self.push.value if self.planted is None else f"planted:{self.planted.name}"


class RouterDtype(enum.Enum):
    MODEL = "model"
    FLOAT32 = "float32"


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeRouting:
    """``training.moe_routing`` typed: ``replay`` (the rollout's expert ids, R3) or not, and
    for a test-only ``planted:NAME`` value the planted variant."""

    replay: bool = False
    planted: RoutingVariant | None = None

    @classmethod
    def from_knob(cls, value: KnobValue) -> MoeRouting:
        """From a value planning normalized (a planted name it already checked)."""
        name = planted_routing_name(value)
        if name is not None:
            return cls(planted=routing_variant(name))
        if value not in ("natural", "replay"):
            raise ValueError(f"training.moe_routing: expected natural or replay, got {value!r}")
        return cls(replay=value == "replay")

    @property
    def natural(self) -> bool:
        """The training router's own choice, untouched."""
        return not self.replay and self.planted is None

    @property
    def knob_value(self) -> str:
        """The knob's value as requested."""
        if self.planted is not None:
            return f"planted:{self.planted.name}"
        return "replay" if self.replay else "natural"


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutSettings:
    """Every ``rollout.*`` knob of a case, the catalog's default where it names none."""

    tensor_parallel_size: int
    context_parallel_size: int
    dtype: DType
    enable_prefix_caching: bool
    enforce_eager: bool
    logprobs_mode: LogprobsMode
    lm_head_dtype: LmHeadDtype
    weight_sync: WeightSync
    expert_parallel: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSettings:
    """Every ``training.*`` knob of a case, the catalog's default where it names none."""

    attention_backend: AttentionBackend
    compute_dtype: DType
    sharding: Sharding
    logprob_semantics: LogprobSemantics
    lm_head_dtype: LmHeadDtype
    moe_routing: MoeRouting
    router_dtype: RouterDtype

    @property
    def sharded(self) -> bool:
        return self.sharding is Sharding.FSDP


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestSettings:
    """The request-level knobs of a case (both sides), the catalog's default where it names
    none."""

    batch_size: int
    logp_backend: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SettingsTypes:
    """The settings class of each side that ``bind_case`` builds (a subclass adds a field for
    a knob the catalog it is handed adds)."""

    rollout: type[RolloutSettings] = RolloutSettings
    training: type[TrainingSettings] = TrainingSettings
    request: type[RequestSettings] = RequestSettings


SETTINGS_TYPES = SettingsTypes()

S = TypeVar("S")

_HINTS: dict[type, dict[str, Any]] = {}


def _typed(hint: Any, value: KnobValue, path: str) -> Any:
    from_knob = getattr(hint, "from_knob", None)
    if from_knob is not None:
        return from_knob(value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value)
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{path}: expected an integer, got {value!r}")
    if isinstance(hint, type) and not isinstance(value, hint):
        raise TypeError(f"{path}: expected {hint.__name__}, got {value!r}")
    return value


def build_settings(
    cls: type[S],
    side: Side,
    requested: Mapping[str, KnobValue],
    catalog: Mapping[str, KnobSpec] = KNOBS,
) -> S:
    """``cls`` from the knobs of ``side`` in ``catalog``: the requested value, else the
    entry's default, typed by the field of the same name. A field no knob fills, or a knob
    with no field, is a TypeError (a catalog and a settings class that disagree)."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = get_type_hints(cls)
    specs = {spec.field: spec for spec in catalog.values() if spec.side is side}
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    if names != set(specs):
        raise TypeError(
            f"{cls.__name__} has fields {sorted(names)}, the {side.value} knobs are {sorted(specs)}"
        )
    values = {}
    for name, spec in specs.items():
        path = spec.knob.path
        value = requested[path] if path in requested else spec.default
        values[name] = _typed(hints[name], value, path)
    return cls(**values)
