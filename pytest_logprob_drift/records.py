"""Immutable, versioned domain records and their canonical JSON form.

Owns the shapes every other module exchanges: the experiment config, the frozen scoring
identity, knobs and their lifecycles, planned cases, structured plan issues and knob
application records. Every record is a frozen, slotted, keyword-only dataclass whose
``canonical()`` form is plain JSON data; ``canonical_json`` serializes it with sorted keys and no
spaces, which is what gets hashed. Also owns ``FrozenRecord``, the base that gives records their
equality, hash and repr without a per-class ``exec`` at import (``plan`` start-up). Knows
nothing about parsing files, planning rules, torch or any runtime.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pytest_logprob_drift.errors import Remedy

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, TypeAlias, TypeVar

    V = TypeVar("V")

JSONScalar: TypeAlias = str | int | float | bool | None
JsonValue: TypeAlias = "JSONScalar | Sequence[JsonValue] | Mapping[str, JsonValue]"
"""A JSON value as a type checker sees it (read-only containers, so a ``dict[str, int]`` or a
tuple is one); annotations only: msgspec cannot type a recursive alias."""
JsonObject: TypeAlias = "dict[str, JsonValue]"
"""A JSON object being built or read (a report, an engine's evidence, a raw config)."""
KnobValue: TypeAlias = str | int | bool

CONFIG_SCHEMA_VERSION = "cross_config.experiment_config.v1"
PLAN_SCHEMA_VERSION = "cross_config.plan.v1"
CASE_SCHEMA_VERSION = "cross_config.case.v1"


_JSON_SCALAR_TYPES = frozenset({str, int, float, bool, type(None)})


_RECORD_FIELDS: dict[type, tuple[str, ...] | None] = {}
"""Per type: its dataclass field names, or None when it is not a dataclass (looked up once:
``dataclasses.is_dataclass`` on an enum member goes through the enum's slow ``__getattr__``)."""


def _record_fields(kind: type) -> tuple[str, ...] | None:
    if kind not in _RECORD_FIELDS:
        _RECORD_FIELDS[kind] = (
            tuple(f.name for f in dataclasses.fields(kind))
            if dataclasses.is_dataclass(kind)
            else None
        )
    return _RECORD_FIELDS[kind]


def canonical(value: Any) -> Any:
    """Plain-JSON form of a record, enum, mapping or sequence (recursively)."""
    kind = type(value)
    if kind in _JSON_SCALAR_TYPES:  # fast path: prompts can hold millions of token ids
        return value
    scalar = _JSON_SCALAR_TYPES  # inlined below: ids hash thousands of small values per plan
    names = _record_fields(kind)
    if names is not None:
        return {
            name: v if type(v := getattr(value, name)) in scalar else canonical(v) for name in names
        }
    if kind in _PLAIN_MAPPINGS or (not isinstance(value, enum.Enum) and isinstance(value, Mapping)):
        return {
            k: v if type(v) in scalar else canonical(v)
            for k, v in sorted([(str(k), v) for k, v in value.items()], key=_key_text)
        }
    if isinstance(value, enum.Enum):
        return canonical(value.value)
    if isinstance(value, (list, tuple)):
        return [v if type(v) in scalar else canonical(v) for v in value]
    return value


_PLAIN_MAPPINGS = frozenset({dict, MappingProxyType})
"""Mappings recognized by type before the (slower) ``Mapping`` ABC check."""

_key_text = operator.itemgetter(0)
"""Sort key of ``(str(key), value)``: the key text alone (never compares two values)."""


_CANONICAL_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
"""One encoder for every id and digest (``json.dumps`` with these options builds a new one per
call; a plan encodes a few per case)."""


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces, UTF-8 safe: the form that ids and digests are taken over."""
    return _CANONICAL_ENCODER.encode(canonical(value))


def sha256_hex(text: str | bytes) -> str:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def frozen_mapping(items: Mapping[str, V]) -> Mapping[str, V]:
    """A read-only, key-sorted view used for mapping fields of frozen records."""
    return MappingProxyType(dict(sorted(items.items())))


class FrozenRecord:
    """Equality, hashing and ``repr`` of a frozen record, taken from its dataclass fields.

    A record declared ``@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)``
    inherits these three instead of having ``dataclass`` generate them. They behave as the
    generated ones do: equal when of the same class with equal field tuples (``NotImplemented``
    for any other class), hashed over the same fields, shown as ``Name(field=value, ...)``, and
    a field with ``compare=False`` or ``repr=False`` is left out the same way. Python 3.11's
    ``dataclass`` compiles each generated method with its own ``exec``; for the 28 records that
    ``plan`` imports, these three cost 3 ms of its start-up (``benchmarks/bench_plan.py``).
    """

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        names = _record_methods(self.__class__).compared
        return tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, n) for n in _record_methods(self.__class__).hashed))

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{n}={getattr(self, n)!r}" for n in _record_methods(self.__class__).shown
        )
        return f"{self.__class__.__qualname__}({shown})"


class _RecordMethods:
    """The field names a record class compares, hashes and shows (read once per class)."""

    __slots__ = ("compared", "hashed", "shown")

    def __init__(self, kind: type) -> None:
        fields = dataclasses.fields(kind)
        self.compared = tuple(f.name for f in fields if f.compare)
        self.hashed = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))
        self.shown = tuple(f.name for f in fields if f.repr)


_RECORD_METHODS: dict[type, _RecordMethods] = {}


def _record_methods(kind: type) -> _RecordMethods:
    methods = _RECORD_METHODS.get(kind)
    if methods is None:
        methods = _RECORD_METHODS[kind] = _RecordMethods(kind)
    return methods


class Lifecycle(enum.Enum):
    """How deep a knob reaches: a request, an engine construction, or a process topology."""

    REQUEST = "request"
    ENGINE_CONSTRUCTION = "engine_construction"
    PROCESS = "process"

    @property
    def rank(self) -> int:
        return _LIFECYCLE_RANK[self]


_LIFECYCLE_RANK = {Lifecycle.REQUEST: 0, Lifecycle.ENGINE_CONSTRUCTION: 1, Lifecycle.PROCESS: 2}


class ScenarioLevel(enum.Enum):
    S0 = "S0"
    S1 = "S1"
    S2 = "S2"
    S3 = "S3"


class Strategy(enum.Enum):
    ONE_AT_A_TIME = "one_at_a_time"
    PAIRWISE = "pairwise"


class CaseKind(enum.Enum):
    BASELINE = "baseline"
    ONE_AT_A_TIME = "one_at_a_time"
    PAIRWISE = "pairwise"


class IssueSeverity(enum.Enum):
    ERROR = "error"
    WARNING = "warning"


class ApplicationStatus(enum.Enum):
    """What a runtime did with one requested knob value."""

    APPLIED = "applied"
    FALLBACK = "fallback"
    UNSUPPORTED = "unsupported"
    UNOBSERVABLE = "unobservable"
    ERROR = "error"


# ---------------------------------------------------------------------------- identity


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class CheckpointIdentity(FrozenRecord):
    """Immutable model weights: a local directory or a ``tiny://`` synthetic URI."""

    uri: str
    model_version: str
    digest: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class TokenizerIdentity(FrozenRecord):
    """The tokenizer both sides must use, and how prompts are encoded with it."""

    tokenizer_id: str
    add_special_tokens: bool = False
    chat_template: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class PromptSet(FrozenRecord):
    """Prompts as token ids; ``source`` records the file they came from, if any."""

    token_ids: tuple[tuple[int, ...], ...]
    source: str | None = None

    def canonical_identity(self) -> JsonObject:
        # The content is the identity; where it was read from is not.
        return {"token_ids": canonical(self.token_ids)}


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class SamplingSpec(FrozenRecord):
    """How the rollout samples. ``top_p``, ``top_k`` and ``min_p`` are None when the sampler
    does not truncate by them (then they are left out of the canonical identity, so a config
    without them keeps its case ids); both sides must apply the same values."""

    seed: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None

    def truncation(self) -> dict[str, float | int]:
        """The truncation parameters that are set, by name."""
        values = {"top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p}
        return {k: v for k, v in values.items() if v is not None}


SAMPLING_TRUNCATION = ("top_p", "top_k", "min_p")
"""The optional ``SamplingSpec`` fields, omitted from the canonical identity when None."""


class MaskPolicy(enum.Enum):
    """Which tokens are active (scored): generated tokens, through the first EOS inclusive."""

    RESPONSE_THROUGH_EOS = "response_through_eos"
    RESPONSE_BEFORE_EOS = "response_before_eos"


class PackingPolicy(enum.Enum):
    """How sequences are laid out for scoring; packing is deferred in V1."""

    PADDED = "padded"


class PositionPolicy(enum.Enum):
    FROM_ATTENTION_MASK = "from_attention_mask"


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class ScoringIdentity(FrozenRecord):
    """The frozen logical input both scorers must share (CONTRACT: identity before numerics)."""

    checkpoint: CheckpointIdentity
    tokenizer: TokenizerIdentity
    prompts: PromptSet
    sampling: SamplingSpec
    mask_policy: MaskPolicy = MaskPolicy.RESPONSE_THROUGH_EOS
    training_kv_cache: bool = False
    packing: PackingPolicy = PackingPolicy.PADDED
    positions: PositionPolicy = PositionPolicy.FROM_ATTENTION_MASK

    def canonical_identity(self) -> JsonObject:
        data = canonical(self)
        data["prompts"] = self.prompts.canonical_identity()
        for name in SAMPLING_TRUNCATION:
            if data["sampling"][name] is None:
                del data["sampling"][name]
        return dict(data)


# ---------------------------------------------------------------------------- config


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Scenario(FrozenRecord):
    """Metadata: which milestone the experiment belongs to and which device it names."""

    level: ScenarioLevel
    device: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Intervention(FrozenRecord):
    """One declared path and the values it takes, each in its own case (raw, pre-normalization)."""

    path: str
    values: tuple[Any, ...]
    json_path: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class BackendSelection(FrozenRecord):
    """A named backend and its options (as written in the config)."""

    backend: str
    options: Mapping[str, JsonValue] = field(default_factory=lambda: frozen_mapping({}))


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class OperatorSelection(FrozenRecord):
    """An explicit per-side backend choice for one semantic operator."""

    operation: str
    rollout: BackendSelection
    training: BackendSelection


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class FullVocabularySpec(FrozenRecord):
    """Opt-in full-vocabulary diagnostics (``$.diagnostics.full_vocabulary``): per active
    position KL both ways and total variation over the whole vocabulary, and the ``top_k``
    tokens carrying most of it at the ``worst_positions`` positions. Never changes a verdict;
    not part of the case id (it changes what is sealed, so it is part of the execution key)."""

    top_k: int = 5
    worst_positions: int = 5


LAYER_POSITIONS_LIMIT = 1 << 20
"""Most positions per row a layer diagnostic may ask for (the config's limit, and the range
comparison.json's ``diagnostics.layers.reduction.positions_per_row`` is read in)."""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class LayerSpec(FrozenRecord):
    """Opt-in layer diagnostics (``$.diagnostics.layers``: ``true`` or an object): which
    positions both sides capture. ``positions_per_row`` None: every position that scores an
    active token; ``k``: at most ``k`` of them per row, evenly spaced over the row's active
    positions, the last one always among them (``numerics.layer_reduction.capture_mask``).
    Never changes a verdict; not part of the case id (part of the execution key)."""

    positions_per_row: int | None = None


class AskedDiagnostics:
    """Typed access to the built-in diagnostics a record's ``diagnostics`` mapping (parsed
    values by config key) asks for, for the engines that capture them."""

    __slots__ = ()

    if TYPE_CHECKING:
        diagnostics: Mapping[str, object]

    @property
    def full_vocabulary(self) -> FullVocabularySpec | None:
        """``$.diagnostics.full_vocabulary``: both sides' full next-token distributions."""
        spec = self.diagnostics.get("full_vocabulary")
        return spec if isinstance(spec, FullVocabularySpec) else None

    @property
    def replay(self) -> bool:
        """``$.diagnostics.replay``: the rollout engine scores its own sampled sequences again
        on its prefill path (and replays its decode path where it can)."""
        return self.diagnostics.get("replay") is True

    @property
    def layers(self) -> LayerSpec | None:
        """``$.diagnostics.layers``: both sides' hidden states at every layer, reduced
        (``numerics.layer_reduction``) and sealed per side."""
        spec = self.diagnostics.get("layers")
        return spec if isinstance(spec, LayerSpec) else None

    @property
    def routing(self) -> bool:
        """``$.diagnostics.routing``: a mixture-of-experts model's expert choices per MoE
        layer on both sides (``numerics.routing``), sealed per side."""
        return self.diagnostics.get("routing") is True


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class ExperimentConfig(AskedDiagnostics, FrozenRecord):
    """A strictly loaded ``cross_config.experiment_config.v1`` document (values still raw)."""

    schema_version: str
    experiment_id: str
    scenario_id: str
    contract_source: str
    contract_version: str
    strategy: Strategy
    strict_fallback: bool
    identity: ScoringIdentity
    baseline: Mapping[str, JsonValue]
    """Flattened ``path -> raw value`` with the JSON path of each in ``baseline_json_paths``."""
    baseline_json_paths: Mapping[str, str]
    interventions: tuple[Intervention, ...]
    pairs: tuple[tuple[str, str], ...]
    operators: tuple[OperatorSelection, ...]
    scenario: Scenario
    source: str | None = None
    diagnostics: Mapping[str, object] = field(default_factory=lambda: frozen_mapping({}))
    """The opt-in diagnostics asked for (``$.diagnostics``): each installed diagnostic's parsed
    value by its config key (``diagnostics.config_key``), present only when asked for. Never
    changes a verdict; not part of the case id (it changes what is sealed: part of the
    execution key)."""


# ---------------------------------------------------------------------------- contract


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class ResolvedContract(FrozenRecord):
    """A numerical contract entry with ``current`` already resolved to a concrete version."""

    source: str
    version: str
    threshold: float
    unit: str
    digest: str
    minor_version: int = 0
    """Compatible revisions of the version (recorded, not part of case ids)."""


# ---------------------------------------------------------------------------- plan


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class PlanIssue(FrozenRecord):
    """A structured planning finding; errors stop execution, warnings do not."""

    severity: IssueSeverity
    code: str
    path: str
    message: str
    remedy: Remedy | None = None
    """What the execution policy must allow for this to pass; each frontend names its flag."""

    def render(self) -> str:
        return f"{self.severity.value} {self.code} at {self.path}: {self.message}"


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Knob(FrozenRecord):
    """One allowlisted configuration path and how deep it reaches."""

    path: str
    lifecycle: Lifecycle
    meaning: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class Case(FrozenRecord):
    """One planned configuration: the normalized requested knob values and what changed."""

    case_id: str
    label: str
    kind: CaseKind
    requested: Mapping[str, KnobValue]
    changed: tuple[str, ...]
    lifecycle: Lifecycle | None
    """Deepest lifecycle among the changed knobs (None for the baseline)."""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class ExperimentPlan(AskedDiagnostics, FrozenRecord):
    """The planned cases of one experiment, with the contract they are judged by."""

    schema_version: str
    experiment_id: str
    scenario_id: str
    scenario: Scenario
    contract: ResolvedContract
    strategy: Strategy
    strict_fallback: bool
    identity: ScoringIdentity
    cases: tuple[Case, ...]
    issues: tuple[PlanIssue, ...]
    operators: tuple[OperatorSelection, ...]
    diagnostics: Mapping[str, object] = field(default_factory=lambda: frozen_mapping({}))
    """The config's ``diagnostics`` (``ExperimentConfig.diagnostics``)."""

    @property
    def has_errors(self) -> bool:
        return any(i.severity is IssueSeverity.ERROR for i in self.issues)


# ---------------------------------------------------------------------------- runtime records


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class BuiltinCheckpoint(FrozenRecord):
    """A checkpoint a runtime builds from code instead of reading a directory, named by a URI
    with a scheme (``tiny://qwen3-h64-v1``), and what execution accepts of it: token ids below
    ``vocab_size``, prompt plus new tokens within ``max_positions`` (None: no fixed context),
    and, where the runtime seeds sample ``index``'s torch generator with
    ``seed * seed_multiplier + index``, seeds that keep that within torch's range. Declared in
    the description of every runtime that serves it; planning checks a config against the
    union of the registered runtimes' declarations."""

    uri: str
    vocab_size: int
    max_positions: int | None = None
    seed_multiplier: int | None = None
    model_type: str | None = None
    attention_heads: int | None = None
    kv_heads: int | None = None
    """The attention layout it is built with (``config.attention_layout``; None: undeclared)."""

    @property
    def scheme(self) -> str:
        """The URI up to and including ``://`` (``tiny://``); empty when it has none."""
        end = self.uri.find("://")
        return self.uri[: end + 3] if end > 0 else ""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class ContextParallelRule(FrozenRecord):
    """Where and for which checkpoints a runtime runs ``rollout.context_parallel_size`` > 1,
    and the engine setting it becomes there; anywhere else the case is refused with ``rule``
    (``plan.context_parallel``), never mapped onto another setting."""

    devices: tuple[str, ...]
    needs_mla: bool
    setting: str
    """The engine setting the knob becomes (e.g. vLLM's ``prefill_context_parallel_size``)."""
    rule: str
    """The engine's own rule, restated (what it runs, and which of its checks says so)."""
    not_substituted: str = ""
    """What the runtime does not turn the knob into instead, and why (stated in a refusal)."""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class KnobTrial(FrozenRecord):
    """One standard one-at-a-time intervention a runtime executes: the knob, the values it
    executes for it (a value equal to the baseline's is left out by whoever plans from it),
    and what the case tests, in a sentence (``logprob-drift init`` writes it as the
    intervention's ``description``)."""

    path: str
    values: tuple[KnobValue, ...]
    description: str


@dataclass(frozen=True, slots=True, kw_only=True, eq=False, repr=False)
class RuntimeInfo(FrozenRecord):
    """The static, torch-free description of one runtime: which scenario levels it executes on
    which device (``executes_on``: pairs, so that declaring a level on one device declares it
    nowhere else), the ``module:attr`` of its adapter factory (imported only when a case
    executes) and the built-in checkpoints it serves. A case whose scenario a runtime does not
    execute is PLAN_ONLY for it."""

    name: str
    executes_on: tuple[tuple[str, tuple[ScenarioLevel, ...]], ...]
    """``(device, levels)``: the scenario levels it executes on that device."""
    adapter: str
    """``module:attr`` of a zero-argument callable returning the RuntimeAdapter."""
    extra: str | None
    """The install extra that provides the runtime's engines, named when it is missing."""
    summary: str
    checkpoints: tuple[BuiltinCheckpoint, ...] = ()
    """The built-in checkpoints it serves (a local checkpoint directory needs no declaration)."""
    baseline: tuple[tuple[str, KnobValue], ...] = ()
    """Knob values of a starter baseline on it (beside the checkpoint's own dtype on both
    sides): what ``logprob-drift init`` writes."""
    interventions: tuple[KnobTrial, ...] = ()
    """The standard interventions it executes, one knob at a time (``logprob-drift init``)."""
    context_parallel: ContextParallelRule | None = None
    """Where it runs context parallelism (None: its adapter decides, as for any knob)."""
    rollout_spreads: bool = False
    """Its rollout runs on ``tensor_parallel_size`` x ``context_parallel_size`` devices (what a
    case needs of a machine, ``execute.machine_fit``)."""
    cuda_build: str | None = None
    """The engine package whose CUDA build it needs on ``cuda`` (checked before any engine)."""
    logp_refusals: tuple[tuple[str, str, str], ...] = ()
    """``(target, alignment property, reason)``: on that side this runtime cannot inject a
    ``selected_logprob`` backend whose descriptor declares that alignment property, and why.
    A case binding one there is not executable by this runtime (planning drops it from the
    case's ``executable_by``; the runner refuses it before any engine is built)."""

    @property
    def devices(self) -> tuple[str, ...]:
        """The devices it executes some level on, in declaration order."""
        return tuple(device for device, _ in self.executes_on)

    @property
    def levels(self) -> tuple[ScenarioLevel, ...]:
        """Every level it executes on some device, in level order."""
        found = {level for _, levels in self.executes_on for level in levels}
        return tuple(level for level in ScenarioLevel if level in found)

    def levels_on(self, device: str) -> tuple[ScenarioLevel, ...]:
        """The levels it executes on ``device`` (empty when none)."""
        return next((levels for d, levels in self.executes_on if d == device), ())

    def where(self) -> str:
        """What it executes where, e.g. ``S0/S1 on cpu; S0/S1/S2/S3 on cuda``."""
        return "; ".join(
            f"{'/'.join(level.value for level in levels)} on {device}"
            for device, levels in self.executes_on
        )

    def executes(self, scenario: Scenario) -> bool:
        return scenario.level in self.levels_on(scenario.device)

    def logp_refusal(self, target: str, backend: str, properties: tuple[str, ...]) -> str | None:
        """Why this runtime cannot inject ``backend`` (declaring ``properties``) on the
        ``target`` side; None when it can."""
        for side, prop, reason in self.logp_refusals:
            if side == target and prop in properties:
                return (
                    f"runtime {self.name!r} cannot inject {backend} ({prop}) on the {target} "
                    f"side: {reason}"
                )
        return None

    def plan_only_reason(self, scenario: Scenario) -> str:
        return (
            f"scenario {scenario.level.value} on {scenario.device} is plan-only for runtime "
            f"{self.name!r} (it executes {self.where()})"
        )
