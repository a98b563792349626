"""The typed read model of ``comparison.json``: the verdict, its diagnostics and the re-check.

Owns the ``msgspec.Struct`` records a comparison is decoded into, each the JSON it is sealed as
(``store.comparison`` decodes the sealed bytes once with ``store.decode``; a wrong type, a
missing or unknown member is refused there with its JSON path): the verdict's statistics
(flattened into ``diagnostics``: all or none) and worst tokens, the optional full-vocabulary
summary or why it is unavailable (one JSON member of two shapes, decoded by variant), the
optional semantic-offset diagnosis, path split, importance-sampling figures and layer
diagnostics, the knob records, the contract, and the numeric re-check that execution and
resume both build. A sealed number outside its documented range (a layer reduction's
``positions_per_row`` below 1, say) is refused by its type. What is not a type (a replay's
status and which members it has, the statistics all or none, a first unequal state that
names a state) is a ``__post_init__`` rule, which msgspec reports with the JSON path too.
``to_json`` gives back the document a record was decoded from, value for value (an integer
stays one: numbers are ``int | float``). ``from_builtins`` makes a record of plain JSON data a
numerics function computed. Knows nothing about torch, files, seals or how any number was
computed.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Final, Literal, TypeAlias, TypeVar

import msgspec

from pytest_logprob_drift.numerics.signature_record import SealedSignature
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.records import (
    LAYER_POSITIONS_LIMIT,
    ApplicationStatus,
    JSONScalar,
    KnobValue,
    Lifecycle,
    ResolvedContract,
)

T = TypeVar("T")
TYPE_CHECKING = False
if TYPE_CHECKING:
    Absent: TypeAlias = T | None
    """A member that may be absent (None here); JSON null is refused."""
else:

    class Absent:
        """``Absent[X]`` is ``X`` to msgspec (null refused; absent: the default, None) and
        ``X | None`` to mypy."""

        def __class_getitem__(cls, item: Any) -> Any:
            return item


Number: TypeAlias = int | float
"""A JSON number kept as written: an integer stays one, so ``to_json`` gives it back."""
Count: TypeAlias = Annotated[int, msgspec.Meta(ge=0)]
"""A non-negative integer (counts, indices, token ids)."""


class Record(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, omit_defaults=True
):
    """A record of comparison.json: frozen, every member declared (an unknown key is refused),
    the options of ``store.decode.Document``; an absent member (``Absent``, None) is left out
    of ``to_json``."""

    def to_json(self) -> Any:
        """The JSON object this record is sealed as (arrays as lists)."""
        return _lists(msgspec.to_builtins(self))


def _lists(value: Any) -> Any:
    """``msgspec.to_builtins``' output with its tuples as lists."""
    if isinstance(value, dict):
        return {key: _lists(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_lists(item) for item in value]
    return value


def from_builtins(value: object, kind: type[T]) -> T:
    """``value`` (plain JSON data a numerics function computed) as the record ``kind``,
    strictly: a ``ValueError`` naming the JSON path of a number that is not finite, a wrong
    type, or a missing or unknown member."""
    path = _non_finite(value)
    if path is not None:
        raise ValueError(f"{path}: expected a finite number")
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        message, marker, where = str(exc).rpartition(" - at `")
        raise ValueError(f"{where.rstrip('`')}: {message}" if marker else f"$: {exc}") from None


def _non_finite(root: object) -> str | None:
    stack: list[tuple[object, str]] = [(root, "$")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return path
        if isinstance(value, dict):
            stack.extend((v, f"{path}.{k}") for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
    return None


def _member(name: str, value: object, kind: type[T]) -> T:
    """A member a ``__post_init__`` decodes by variant: ``kind`` from its JSON, a failure
    naming the member's path below its struct (``store.decode`` joins it to the struct's)."""
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        message, marker, where = str(exc).rpartition(" - at `$")
        if not marker:
            message, where = str(exc), "`"
        raise ValueError(f"{message} - at `$.{name}{where}") from None


# --------------------------------------------------------------------------- the records


class Statistics(Record, frozen=True):
    """The verdict's statistics of ``|training - rollout|`` over the active tokens, and the
    metrics RL frameworks log (never a verdict); sealed flattened into ``diagnostics``."""

    mean_abs_diff: Number
    p50_abs_diff: Number
    p90_abs_diff: Number
    p99_abs_diff: Number
    max_abs_diff: Number
    mismatch_ratio: Number
    approx_kl_k1: Number
    approx_kl_k3: Number | None
    slime_mean_abs_logprob_diff: Number
    nemo_rl_token_mult_prob_error: Number | None
    verl_rollout_probs_diff_max: Number | None


OVERFLOWING_STATISTICS = (
    "approx_kl_k3",
    "nemo_rl_token_mult_prob_error",
    "verl_rollout_probs_diff_max",
)
"""The statistics that exponentiate a logprob or a difference: null (None) where the result
overflows float64 (a |diff| above about 709 nats), as the importance-sampling figures record
theirs; the verdict, computed from the differences alone, is unaffected. Comparisons sealed
before this was allowed hold a number here."""
STATISTICS_KEYS: tuple[str, ...] = Statistics.__struct_fields__
"""The keys the verdict writes into comparison.json's diagnostics, all of them or none."""


class WorstToken(Record, frozen=True):
    """One of the active tokens with the largest ``|diff|``."""

    sample: Count
    position: Count
    rollout_logprob: Number
    training_logprob: Number
    abs_diff: Number


class ReductionStats(Record, frozen=True):
    """One full-vocabulary reduction over the active positions: mean / p99 / max over the
    finite values (None when none is), and how many are infinite or NaN."""

    mean: Number | None
    p99: Number | None
    max: Number | None
    infinite: Count
    nan: Count

    def statistic(self, name: str) -> float | None:
        """``mean``, ``p99`` or ``max`` by name (``STATISTIC_NAMES``)."""
        if name not in ("mean", "p99", "max"):
            raise KeyError(name)
        value: float | None = getattr(self, name)
        return value


class TopToken(Record, frozen=True):
    """A token at a worst position: both sides' logprobs (None: not finite) and its share of
    the position's total variation."""

    token_id: Count
    rollout_logprob: Number | None
    training_logprob: Number | None
    tv_share: Number


class WorstPosition(Record, frozen=True):
    """A position with the largest total variation, its reductions and top tokens."""

    sample: Count
    position: Count
    kl_rollout_training: Number | None
    kl_training_rollout: Number | None
    total_variation: Number | None
    top_tokens: tuple[TopToken, ...]


REDUCTION_KEYS = ("kl_rollout_training", "kl_training_rollout", "total_variation")
"""The reductions a full-vocabulary summary holds statistics of."""


class FullVocabulary(Record, frozen=True):
    """The full-vocabulary summary (``numerics.divergence_file.summarize``)."""

    positions: Count
    kl_rollout_training: ReductionStats
    kl_training_rollout: ReductionStats
    total_variation: ReductionStats
    truncated_positions: Count
    worst_positions: tuple[WorstPosition, ...]

    def reduction(self, key: str) -> ReductionStats:
        """The reduction named ``key`` (one of ``REDUCTION_KEYS``)."""
        if key not in REDUCTION_KEYS:
            raise KeyError(key)
        value: ReductionStats = getattr(self, key)
        return value


class FullVocabularyUnavailable(Record, frozen=True):
    """Full-vocabulary diagnostics were asked for but could not be computed, and why."""

    reason: str = msgspec.field(name="unavailable")


if TYPE_CHECKING:
    FullVocabularyEntry: TypeAlias = FullVocabulary | FullVocabularyUnavailable
else:
    FullVocabularyEntry = dict[str, Any]
    """To msgspec an object, decoded by variant in ``Diagnostics.__post_init__`` (an object
    with ``unavailable`` is the one, any other the summary: msgspec has no untagged union of
    two objects)."""


class SemanticOffsetSummary(Record, frozen=True):
    """Whether the sampling semantics explain ``training - rollout``, and which explanation:
    what ``numerics.semantic_offset.semantic_offset`` returns and comparison.json records."""

    fires: bool
    explanation: str | None
    explained_fraction: Number
    truncated_positions: Count
    tolerance: Number
    message: str
    reproduces: Absent[str] = None
    """Optional (absent from comparisons written before it): which sampler the processed
    distributions were recomputed as (``numerics.sampling``: vLLM's CPU sampler's rules)
    against the sampler the rollout ran on its platform. Execution evidence, not part of what
    ``verify`` recomputes from the sealed tensors."""


REPLAY_RAN: Final = "replay_ran"
REPLAY_INCOMPARABLE: Final = "replay_incomparable"
REPLAY_UNAVAILABLE: Final = "replay_unavailable"
REPLAY_STATUSES = (REPLAY_RAN, REPLAY_INCOMPARABLE, REPLAY_UNAVAILABLE)


def _members(
    status: str,
    evidence: object,
    reason: object,
    *,
    evidence_with: tuple[str, ...],
    reason_with: tuple[str, ...],
) -> None:
    """A status record holds ``evidence`` exactly for the statuses ``evidence_with`` and a
    ``reason`` exactly for ``reason_with``."""
    for name, value, with_it in (
        ("evidence", evidence, evidence_with),
        ("reason", reason, reason_with),
    ):
        if (value is not None) != (status in with_it):
            raise ValueError(f"{status} {'has no' if value is None else 'takes no'} {name}")


class ReplayStatus(Record, frozen=True):
    """What became of one replay (``diagnostics.path_split.prefill`` / ``.decode_replay``):
    ``replay_ran`` with what the engine did (``evidence``); ``replay_incomparable``: it ran,
    but its logprobs are not the kind the decode path reported (raw against processed), with
    the evidence and the ``reason``; ``replay_unavailable`` with the engine's reason. A
    diagnostic status: never a knob status (``unsupported`` / ``unobservable``), never a
    verdict."""

    status: Literal["replay_ran", "replay_incomparable", "replay_unavailable"]
    evidence: Absent[dict[str, JSONScalar]] = None
    reason: Absent[str] = None

    def __post_init__(self) -> None:
        _members(
            self.status,
            self.evidence,
            self.reason,
            evidence_with=(REPLAY_RAN, REPLAY_INCOMPARABLE),
            reason_with=(REPLAY_INCOMPARABLE, REPLAY_UNAVAILABLE),
        )

    @property
    def ran(self) -> bool:
        return self.status in (REPLAY_RAN, REPLAY_INCOMPARABLE)


class AbsDiffStats(Record, frozen=True):
    """max / mean / p99 of one pair's |difference| on the active tokens (None on none)."""

    max: Number | None
    mean: Number | None
    p99: Number | None


class DecodeReplayFigures(Record, frozen=True):
    """The decode replay against the sampled logprobs (the rollout's own run-to-run noise)."""

    max: Number | None
    mean: Number | None
    p99: Number | None
    bitwise_equal_fraction: Number | None


PATH_PAIRS = ("decode_prefill", "prefill_training", "decode_training")
"""The path split's pairs (``numerics.path_split.PAIRS``)."""


def _keys(
    name: str, mapping: dict[str, Any], required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> None:
    """``mapping`` (the member ``name``) has every key of ``required`` and no other key than
    those and ``optional``."""
    missing = [key for key in required if key not in mapping]
    if missing:
        raise ValueError(f"Object missing required field `{missing[0]}` - at `$.{name}`")
    unknown = sorted(key for key in mapping if key not in required and key not in optional)
    if unknown:
        raise ValueError(f"Object contains unknown field `{unknown[0]}` - at `$.{name}`")


class PathSplitFigures(Record, frozen=True):
    """``numerics.path_split.path_split``'s figures: each pair's statistics (None when its two
    sides are not comparable), the bitwise-equal share of decode and prefill and, per sample,
    the first active position where they differ."""

    active_tokens: Count
    decode_prefill: AbsDiffStats | None
    prefill_training: AbsDiffStats | None
    decode_training: AbsDiffStats | None
    bitwise_equal_fraction: Number | None
    first_difference: tuple[Count | None, ...] | None
    decode_replay_decode: Absent[DecodeReplayFigures] = None

    def pair(self, key: str) -> AbsDiffStats | None:
        """The statistics of pair ``key`` (one of ``PATH_PAIRS``)."""
        if key not in PATH_PAIRS:
            raise KeyError(key)
        value: AbsDiffStats | None = getattr(self, key)
        return value


class PathSplit(Record, frozen=True):
    """comparison.json's ``diagnostics.path_split`` (opt-in ``diagnostics.replay``): what
    became of each replay, which pairs compare like with like, and the figures (None when the
    prefill replay did not run)."""

    prefill: ReplayStatus
    decode_replay: ReplayStatus
    comparable: dict[str, bool]
    """Each of ``PATH_PAIRS``, no other."""
    figures: PathSplitFigures | None

    def __post_init__(self) -> None:
        _keys("comparable", self.comparable, PATH_PAIRS)


LAYERS_CAPTURED: Final = "layers_captured"
LAYERS_UNAVAILABLE: Final = "layers_unavailable"
LAYER_STATUSES = (LAYERS_CAPTURED, LAYERS_UNAVAILABLE)
LAYER_SIDES = ("training", "rollout")


class LayerStatus(Record, frozen=True):
    """What became of one side's layer capture (``diagnostics.layers.training`` /
    ``.rollout``): ``layers_captured`` with its evidence, or ``layers_unavailable`` with the
    side's reason. A diagnostic status: never a knob status, never a verdict."""

    status: Literal["layers_captured", "layers_unavailable"]
    evidence: Absent[dict[str, JSONScalar]] = None
    reason: Absent[str] = None

    def __post_init__(self) -> None:
        _members(
            self.status,
            self.evidence,
            self.reason,
            evidence_with=(LAYERS_CAPTURED,),
            reason_with=(LAYERS_UNAVAILABLE,),
        )

    @property
    def captured(self) -> bool:
        return self.status == LAYERS_CAPTURED


class LayerStateFigures(Record, frozen=True):
    """One state's figures (``numerics.layer_reduction.compare``)."""

    state: str
    bitwise_equal_share: Number
    median_rel_error: Number
    max_rel_error: Number
    median_cosine: Number


class LayerFigures(Record, frozen=True):
    """The rollout side's states against the training side's at the same positions."""

    positions: Count
    states: tuple[LayerStateFigures, ...]
    first_unequal_state: str | None

    def __post_init__(self) -> None:
        first = self.first_unequal_state
        if first is not None and first not in [s.state for s in self.states]:
            raise ValueError(f"first_unequal_state names no state: {first!r:.40}")


Positive: TypeAlias = Annotated[int, msgspec.Meta(ge=1)]
"""A positive integer."""


class LayerReduction(Record, frozen=True):
    """``diagnostics.layers.reduction``: the parameters the sides' states were reduced with
    (``numerics.layer_reduction``; ``check.layers_check`` compares them with those of the
    sealed reductions), and ``positions_per_row`` when the capture read at most that many
    positions per row (``numerics.layer_reduction.capture_mask``; the config's range,
    1 .. ``LAYER_POSITIONS_LIMIT``)."""

    projection_dim: Positive
    projection_seed: Count
    digest_bytes: Positive
    positions_per_row: Absent[Annotated[int, msgspec.Meta(ge=1, le=LAYER_POSITIONS_LIMIT)]] = None


class LayerDiagnostics(Record, frozen=True):
    """comparison.json's ``diagnostics.layers`` (opt-in ``diagnostics.layers``): each side's
    capture status, the reduction's parameters and the figures (None unless both captured)."""

    training: LayerStatus
    rollout: LayerStatus
    reduction: LayerReduction
    figures: LayerFigures | None

    def side(self, name: str) -> LayerStatus:
        return self.training if name == "training" else self.rollout


ROUTING_CAPTURED: Final = "routing_captured"
ROUTING_UNAVAILABLE: Final = "routing_unavailable"


class RoutingStatus(Record, frozen=True):
    """What became of one side's routing capture (``diagnostics.routing.training`` /
    ``.rollout``): ``routing_captured`` with its evidence, or ``routing_unavailable`` with the
    side's reason. A diagnostic status: never a knob status, never a verdict."""

    status: Literal["routing_captured", "routing_unavailable"]
    evidence: Absent[dict[str, JSONScalar]] = None
    reason: Absent[str] = None

    def __post_init__(self) -> None:
        _members(
            self.status,
            self.evidence,
            self.reason,
            evidence_with=(ROUTING_CAPTURED,),
            reason_with=(ROUTING_UNAVAILABLE,),
        )

    @property
    def captured(self) -> bool:
        return self.status == ROUTING_CAPTURED


class RoutingDriftClass(Record, frozen=True):
    """The active tokens of one class of the drift split (``numerics.routing``)."""

    tokens: Count
    mismatch_share: Number | None
    mean_abs_diff: Number | None
    max_abs_diff: Number | None


class RoutingDrift(Record, frozen=True):
    flip: RoutingDriftClass
    no_flip: RoutingDriftClass
    unknown: RoutingDriftClass


class RoutingWorstToken(Record, frozen=True):
    """One of the active tokens with the largest |diff|, with where routing flipped before it."""

    row: Count
    position: Count
    abs_diff: Number
    routing: Literal["flip", "no_flip", "unknown"]
    first_flip_position: Absent[Count] = None
    first_flip_layer: Absent[Count] = None


class RoutingFigures(Record, frozen=True):
    """The routing view of a case (``numerics.routing.figures``)."""

    moe_layers: Count
    top_k: Count
    positions_compared: Count
    positions_training_only: Count
    agreement_by_layer: tuple[Number | None, ...]
    flip_share: Number | None
    first_differing_layer_counts: tuple[Count, ...]
    drift: RoutingDrift
    worst: tuple[RoutingWorstToken, ...]


class RoutingDiagnostics(Record, frozen=True):
    """comparison.json's ``diagnostics.routing`` (opt-in ``diagnostics.routing``): each side's
    capture status and the figures (None unless both captured)."""

    training: RoutingStatus
    rollout: RoutingStatus
    figures: RoutingFigures | None


class FigureRange(Record, frozen=True):
    """min / mean / max of one importance-sampling figure (None: a plain number past float64;
    its log is always recorded beside it)."""

    min: Number | None
    mean: Number | None
    max: Number | None


class LogRange(Record, frozen=True):
    """min / mean / max of a log: always finite numbers."""

    min: Number
    mean: Number
    max: Number


class FigureExtremes(Record, frozen=True):
    """min / max of a figure whose mean is not recorded (``perplexity_ratio``)."""

    min: Number | None
    max: Number | None

    @property
    def mean(self) -> None:
        return None


class WeightBand(Record, frozen=True):
    """Fractions of active tokens whose weight is strictly above / below ``edge``."""

    edge: Number
    above: Number
    below: Number


class ImportanceSamplingFigures(Record, frozen=True):
    """The importance-sampling figures of a case (``numerics.importance_sampling``'s
    ``ImportanceSampling.to_json``): what an off-policy correction would make of the drift,
    never a verdict. ``corrections`` maps each peer correction's key to its fraction."""

    active_tokens: Count
    sequences: Count
    weights_clamped: bool
    weight: FigureRange
    log_weight: LogRange
    band_fractions: tuple[WeightBand, ...]
    ess: Number
    ess_verl_clamped: Number
    verl_clamp: tuple[Number, Number]
    chi2_token: Number
    chi2_sequence: Number
    ess_sequence: Number
    log_sequence_ratio: FigureRange
    log_geometric_ratio: FigureRange
    max_geometric_deviation: Number | None
    log_perplexity_ratio: FigureRange
    perplexity_ratio: FigureExtremes
    log_max_seq_mult_prob_error: Number
    approx_kl_k1: Number | None
    approx_kl_k2: Number | None
    approx_kl_k3: Number | None
    corrections: dict[str, Number]

    def correction(self, key: str) -> float | None:
        """The fraction a peer correction (``PEER_CORRECTIONS`` key) affects; None when this
        record has no such key."""
        return self.corrections.get(key)


class MaskedByRun(Record, frozen=True):
    """The tokens a run masked itself (NeMo-RL: ``sample_loss_mask`` 0 while ``token_loss_mask``
    is 1, for drift or another reason), judged apart by the contract's rule and never counted
    in the verdict: samples, tokens, mismatches, the largest finite |diff| (None: none) and the
    non-finite tokens."""

    samples: Count
    tokens: Count
    mismatches: Count
    max_abs_diff: Number | None
    nonfinite_tokens: Count


class Diagnostics(Record, frozen=True):
    """comparison.json's ``diagnostics`` as today's release declares it: each part present or
    not (a verdict without numerics has no statistics; full-vocabulary parts only when they
    were asked for). The verdict's statistics are its members (``STATISTICS_KEYS``), all of
    them or none. These members stay declared so that runs sealed by today's release decode;
    the type a run seals and decodes is ``diagnostics.registry.diagnostics_type()``, this one
    with a member for each installed diagnostic's part it does not declare (after these, in
    the registry's order)."""

    mean_abs_diff: Absent[Number] = None
    p50_abs_diff: Absent[Number] = None
    p90_abs_diff: Absent[Number] = None
    p99_abs_diff: Absent[Number] = None
    max_abs_diff: Absent[Number] = None
    mismatch_ratio: Absent[Number] = None
    approx_kl_k1: Absent[Number] = None
    approx_kl_k3: Number | msgspec.UnsetType | None = msgspec.UNSET
    slime_mean_abs_logprob_diff: Absent[Number] = None
    nemo_rl_token_mult_prob_error: Number | msgspec.UnsetType | None = msgspec.UNSET
    verl_rollout_probs_diff_max: Number | msgspec.UnsetType | None = msgspec.UNSET
    slime_train_rollout_logprob_abs_diff: Absent[Number] = None
    """slime's ``train_rollout_logprob_abs_diff`` as slime computes it by default (per-sample
    means over the step's rollouts, ``numerics.framework_figures``): an imported slime step
    of one training step only. ``slime_mean_abs_logprob_diff``, sealed before it, is the token
    mean, which slime logs only with ``--calculate-per-token-loss``."""
    slime_train_rollout_logprob_abs_diff_per_token_loss: Absent[Number] = None
    """The same with ``--calculate-per-token-loss`` (the same steps)."""
    masked_by_run: Absent[MaskedByRun] = None
    """An imported step whose run masked some tokens itself (absent when it masked none)."""
    full_vocabulary: Absent[FullVocabularyEntry] = None
    semantic_offset: Absent[SemanticOffsetSummary] = None
    path_split: Absent[PathSplit] = None
    importance_sampling: Absent[ImportanceSamplingFigures] = None
    """Absent in comparisons sealed before it existed and for cases without scores."""
    layers: Absent[LayerDiagnostics] = None
    signatures: Absent[tuple[SealedSignature, ...]] = None
    """The step and sample scope drift signatures of a judged case (``numerics.signatures``;
    empty: none). Absent in comparisons sealed before they existed and for cases without
    scores."""
    routing: Absent[RoutingDiagnostics] = None
    """Opt-in ``diagnostics.routing`` of a mixture-of-experts case; absent otherwise."""

    def _has(self, key: str) -> bool:
        """Whether statistic ``key`` is sealed (an ``OVERFLOWING_STATISTICS`` member may be
        null: sealed, as an overflow)."""
        value = getattr(self, key)
        if key in OVERFLOWING_STATISTICS:
            return value is not msgspec.UNSET
        return value is not None

    def __post_init__(self) -> None:
        present = [key for key in STATISTICS_KEYS if self._has(key)]
        if present and len(present) < len(STATISTICS_KEYS):
            missing = next(key for key in STATISTICS_KEYS if not self._has(key))
            raise ValueError(f"Object missing required field `{missing}` (statistics: all or none)")
        full: object = self.full_vocabulary
        if isinstance(full, dict):
            kind = FullVocabularyUnavailable if "unavailable" in full else FullVocabulary
            entry = _member("full_vocabulary", full, kind)
            msgspec.structs.force_setattr(self, "full_vocabulary", entry)

    @classmethod
    def of(cls, statistics: Statistics | None = None, **parts: Any) -> Diagnostics:
        """Diagnostics of the verdict's ``statistics`` (None: none) and the other ``parts``."""
        members = {} if statistics is None else statistics.to_json()
        return cls(**members, **parts)

    @property
    def statistics(self) -> Statistics | None:
        """The verdict's statistics (None: a verdict without numerics)."""
        if self.max_abs_diff is None:
            return None
        return Statistics(**{key: getattr(self, key) for key in STATISTICS_KEYS})

    @property
    def full_summary(self) -> FullVocabulary | None:
        """The full-vocabulary summary when it was computed."""
        full = self.full_vocabulary
        return full if isinstance(full, FullVocabulary) else None

    @property
    def unavailable(self) -> str | None:
        """Why full-vocabulary diagnostics are unavailable (None: computed or not asked)."""
        full = self.full_vocabulary
        return full.reason if isinstance(full, FullVocabularyUnavailable) else None

    def statistic(self, key: str) -> float | None:
        """The verdict's statistic ``key`` (one of ``STATISTICS_KEYS``; a report's columns
        name them), None when the verdict has no statistics."""
        if key not in STATISTICS_KEYS:
            raise KeyError(key)
        if not self._has(key):
            return None
        value: float | None = getattr(self, key)
        return value


class NumericCheck(Record, frozen=True):
    """The numerical verdict alone (identity aside), which ``verify`` and resume recompute
    from ``token_diffs.pt`` and compare with the recorded one."""

    outcome: Outcome
    mismatches: Count
    active_tokens: Count
    threshold: Number
    nonfinite_tokens: Absent[Count] = None
    """INVALID_ARTIFACT for non-finite active scores: how many of the active tokens are;
    absent for every other outcome and in checks sealed before it was counted."""

    def as_sealed(self, recorded: NumericCheck | None) -> NumericCheck:
        """This recomputed check in the form ``recorded`` was sealed in: an INVALID_ARTIFACT
        sealed with ``active_tokens`` 0 and no ``nonfinite_tokens`` is the earlier form (it
        recorded no count), so the recomputed one is compared in that form."""
        if (
            recorded is not None
            and self.nonfinite_tokens is not None
            and recorded.outcome is Outcome.INVALID_ARTIFACT
            and recorded.nonfinite_tokens is None
            and recorded.active_tokens == 0
        ):
            return msgspec.structs.replace(self, active_tokens=0, nonfinite_tokens=None)
        return self


NUMERIC_CHECK_KEYS: tuple[str, ...] = NumericCheck.__struct_fields__


class Contract(Record, frozen=True):
    """The contract a comparison was judged under, as sealed (``records.ResolvedContract``)."""

    source: str
    version: str
    threshold: Number
    unit: str
    digest: str
    minor_version: Count

    @classmethod
    def of(cls, contract: ResolvedContract) -> Contract:
        return cls(
            source=contract.source,
            version=contract.version,
            threshold=contract.threshold,
            unit=contract.unit,
            digest=contract.digest,
            minor_version=contract.minor_version,
        )


class KnobRecord(Record, frozen=True):
    """requested -> materialized -> actual for one knob, with evidence for the status: built
    by ``execute.protocol.application_records``, sealed as it is."""

    knob: str
    lifecycle: Lifecycle
    requested: KnobValue
    materialized: JSONScalar
    actual: JSONScalar
    status: ApplicationStatus
    evidence: str


class Comparison(Record, frozen=True):
    """One attempt's ``comparison.json``."""

    case_id: str
    label: str
    contract: Contract
    outcome: Outcome
    reason: str
    threshold: Number
    active_tokens: Count
    mismatches: Count
    diagnostics: Diagnostics
    worst_tokens: tuple[WorstToken, ...]
    identity_violations: tuple[str, ...]
    records: tuple[KnobRecord, ...]
    numerical: Absent[NumericCheck] = None
    """Absent when neither side scored (a refusal came first)."""
    nonfinite_tokens: Absent[Count] = None
    """INVALID_ARTIFACT for non-finite active scores: how many active tokens are (absent
    otherwise, and in comparisons sealed before it was counted, whose ``active_tokens`` is 0)."""

    def to_json(self) -> Any:
        """The JSON object sealed (``Diagnostics.to_json`` for its diagnostics)."""
        out = super().to_json()
        out["diagnostics"] = self.diagnostics.to_json()
        return out
