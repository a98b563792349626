"""The typed read model of ``comparison.json``: the verdict, its diagnostics and the re-check.

Owns the frozen records a comparison is read into (the verdict's statistics and worst tokens,
the optional full-vocabulary summary or why it is unavailable, the optional semantic-offset
diagnosis, the optional importance-sampling figures, the knob records, the contract, and the
numeric re-check that execution and resume both build), the strict reader from the JSON
document (every wrong type, missing key or unknown key is a ``ComparisonShapeError`` naming its
JSON path) and ``to_json``, which gives back the document it was read from, value for value.
Knows nothing about torch, files, seals or how any number was computed; ``store.comparison``
turns a shape error into the attempt's seal error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pytest_logprob_drift.errors import json_type_name
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.records import (
    ApplicationStatus,
    JSONScalar,
    KnobApplication,
    KnobValue,
    Lifecycle,
    ResolvedContract,
    canonical,
)


class ComparisonShapeError(ValueError):
    """A comparison document that is not what the writer writes: ``path`` (``$`` is the
    document, ``diagnostics.full_vocabulary.positions``, ``records[2].knob``) and what is
    wrong there."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


# --------------------------------------------------------------------------- the records


@dataclass(frozen=True, slots=True, kw_only=True)
class Statistics:
    """The verdict's statistics of ``|training - rollout|`` over the active tokens, and the
    metrics RL frameworks log (never a verdict)."""

    mean_abs_diff: float
    p50_abs_diff: float
    p90_abs_diff: float
    p99_abs_diff: float
    max_abs_diff: float
    mismatch_ratio: float
    approx_kl_k1: float
    approx_kl_k3: float
    slime_mean_abs_logprob_diff: float
    nemo_rl_token_mult_prob_error: float
    verl_rollout_probs_diff_max: float

    def to_json(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in STATISTICS_KEYS}


STATISTICS_KEYS = tuple(Statistics.__dataclass_fields__)
"""The keys the verdict writes into comparison.json's diagnostics, all of them or none."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorstToken:
    """One of the active tokens with the largest ``|diff|``."""

    sample: int
    position: int
    rollout_logprob: float
    training_logprob: float
    abs_diff: float

    def to_json(self) -> dict[str, JSONScalar]:
        return {
            "sample": self.sample,
            "position": self.position,
            "rollout_logprob": self.rollout_logprob,
            "training_logprob": self.training_logprob,
            "abs_diff": self.abs_diff,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ReductionStats:
    """One full-vocabulary reduction over the active positions: mean / p99 / max over the
    finite values (None when none is), and how many are infinite or NaN."""

    mean: float | None
    p99: float | None
    max: float | None
    infinite: int
    nan: int

    def statistic(self, name: str) -> float | None:
        """``mean``, ``p99`` or ``max`` by name (``STATISTIC_NAMES``)."""
        if name == "mean":
            return self.mean
        if name == "p99":
            return self.p99
        if name == "max":
            return self.max
        raise KeyError(name)

    def to_json(self) -> dict[str, JSONScalar]:
        return {
            "mean": self.mean,
            "p99": self.p99,
            "max": self.max,
            "infinite": self.infinite,
            "nan": self.nan,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class TopToken:
    """A token at a worst position: both sides' logprobs (None: not finite) and its share of
    the position's total variation."""

    token_id: int
    rollout_logprob: float | None
    training_logprob: float | None
    tv_share: float

    def to_json(self) -> dict[str, JSONScalar]:
        return {
            "token_id": self.token_id,
            "rollout_logprob": self.rollout_logprob,
            "training_logprob": self.training_logprob,
            "tv_share": self.tv_share,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class WorstPosition:
    """A position with the largest total variation, its reductions and top tokens."""

    sample: int
    position: int
    kl_rollout_training: float | None
    kl_training_rollout: float | None
    total_variation: float | None
    top_tokens: tuple[TopToken, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "sample": self.sample,
            "position": self.position,
            "kl_rollout_training": self.kl_rollout_training,
            "kl_training_rollout": self.kl_training_rollout,
            "total_variation": self.total_variation,
            "top_tokens": [t.to_json() for t in self.top_tokens],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class FullVocabulary:
    """The full-vocabulary summary (``numerics.divergence_file.summarize``)."""

    positions: int
    kl_rollout_training: ReductionStats
    kl_training_rollout: ReductionStats
    total_variation: ReductionStats
    truncated_positions: int
    worst_positions: tuple[WorstPosition, ...]

    def reduction(self, key: str) -> ReductionStats:
        """The reduction named ``key`` (one of ``REDUCTION_KEYS``)."""
        if key == "kl_rollout_training":
            return self.kl_rollout_training
        if key == "kl_training_rollout":
            return self.kl_training_rollout
        if key == "total_variation":
            return self.total_variation
        raise KeyError(key)

    def to_json(self) -> dict[str, Any]:
        return {
            "positions": self.positions,
            **{key: self.reduction(key).to_json() for key in REDUCTION_KEYS},
            "truncated_positions": self.truncated_positions,
            "worst_positions": [w.to_json() for w in self.worst_positions],
        }


REDUCTION_KEYS = ("kl_rollout_training", "kl_training_rollout", "total_variation")
"""The reductions a full-vocabulary summary holds statistics of."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FullVocabularyUnavailable:
    """Full-vocabulary diagnostics were asked for but could not be computed, and why."""

    reason: str

    def to_json(self) -> dict[str, str]:
        return {"unavailable": self.reason}


@dataclass(frozen=True, slots=True, kw_only=True)
class SemanticOffsetSummary:
    """Whether the sampling semantics explain ``training - rollout``, and which explanation:
    what ``numerics.semantic_offset.semantic_offset`` returns and comparison.json records."""

    fires: bool
    explanation: str | None
    explained_fraction: float
    truncated_positions: int
    tolerance: float
    message: str
    reproduces: str | None = None
    """Optional (absent from comparisons written before it): which sampler the processed
    distributions were recomputed as (``numerics.sampling``: vLLM's CPU sampler's rules)
    against the sampler the rollout ran on its platform. Execution evidence, not part of what
    ``verify`` recomputes from the sealed tensors."""

    def to_json(self) -> dict[str, JSONScalar]:
        out: dict[str, JSONScalar] = {
            "fires": self.fires,
            "explanation": self.explanation,
            "explained_fraction": self.explained_fraction,
            "truncated_positions": self.truncated_positions,
            "tolerance": self.tolerance,
            "message": self.message,
        }
        if self.reproduces is not None:
            out["reproduces"] = self.reproduces
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayStatus:
    """What became of one replay (``diagnostics.path_split.prefill`` / ``.decode_replay``):
    ``replay_ran`` with what the engine did (``evidence``); ``replay_incomparable``: it ran,
    but its logprobs are not the kind the decode path reported (raw against processed), with
    the evidence and the ``reason``; ``replay_unavailable`` with the engine's reason. A
    diagnostic status: never a knob status (``unsupported`` / ``unobservable``), never a
    verdict."""

    status: str
    evidence: dict[str, JSONScalar] | None = None
    reason: str | None = None

    @property
    def ran(self) -> bool:
        return self.status in (REPLAY_RAN, REPLAY_INCOMPARABLE)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status}
        if self.ran:
            out["evidence"] = dict(self.evidence or {})
        if self.status != REPLAY_RAN:
            out["reason"] = self.reason
        return out


REPLAY_RAN = "replay_ran"
REPLAY_INCOMPARABLE = "replay_incomparable"
REPLAY_UNAVAILABLE = "replay_unavailable"
REPLAY_STATUSES = (REPLAY_RAN, REPLAY_INCOMPARABLE, REPLAY_UNAVAILABLE)


@dataclass(frozen=True, slots=True, kw_only=True)
class AbsDiffStats:
    """max / mean / p99 of one pair's |difference| on the active tokens (None on none)."""

    max: float | None
    mean: float | None
    p99: float | None

    def to_json(self) -> dict[str, float | None]:
        return {"max": self.max, "mean": self.mean, "p99": self.p99}


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeReplayFigures:
    """The decode replay against the sampled logprobs (the rollout's own run-to-run noise)."""

    max: float | None
    mean: float | None
    p99: float | None
    bitwise_equal_fraction: float | None

    def to_json(self) -> dict[str, float | None]:
        return {
            "max": self.max,
            "mean": self.mean,
            "p99": self.p99,
            "bitwise_equal_fraction": self.bitwise_equal_fraction,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class PathSplitFigures:
    """``numerics.path_split.path_split``'s figures: each pair's statistics (None when its two
    sides are not comparable), the bitwise-equal share of decode and prefill and, per sample,
    the first active position where they differ."""

    active_tokens: int
    decode_prefill: AbsDiffStats | None
    prefill_training: AbsDiffStats | None
    decode_training: AbsDiffStats | None
    bitwise_equal_fraction: float | None
    first_difference: tuple[int | None, ...] | None
    decode_replay_decode: DecodeReplayFigures | None = None

    def pair(self, key: str) -> AbsDiffStats | None:
        """The statistics of pair ``key`` (one of ``PATH_PAIRS``)."""
        if key not in PATH_PAIRS:
            raise KeyError(key)
        value: AbsDiffStats | None = getattr(self, key)
        return value

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"active_tokens": self.active_tokens}
        for key in PATH_PAIRS:
            stats = self.pair(key)
            out[key] = None if stats is None else stats.to_json()
        out["bitwise_equal_fraction"] = self.bitwise_equal_fraction
        out["first_difference"] = (
            None if self.first_difference is None else list(self.first_difference)
        )
        if self.decode_replay_decode is not None:
            out["decode_replay_decode"] = self.decode_replay_decode.to_json()
        return out


PATH_PAIRS = ("decode_prefill", "prefill_training", "decode_training")
"""The path split's pairs (``numerics.path_split.PAIRS``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PathSplit:
    """comparison.json's ``diagnostics.path_split`` (opt-in ``diagnostics.replay``): what
    became of each replay, which pairs compare like with like, and the figures (None when the
    prefill replay did not run)."""

    prefill: ReplayStatus
    decode_replay: ReplayStatus
    comparable: dict[str, bool]
    figures: PathSplitFigures | None

    def to_json(self) -> dict[str, Any]:
        return {
            "prefill": self.prefill.to_json(),
            "decode_replay": self.decode_replay.to_json(),
            "comparable": dict(self.comparable),
            "figures": None if self.figures is None else self.figures.to_json(),
        }


LAYERS_CAPTURED = "layers_captured"
LAYERS_UNAVAILABLE = "layers_unavailable"
LAYER_STATUSES = (LAYERS_CAPTURED, LAYERS_UNAVAILABLE)
LAYER_SIDES = ("training", "rollout")


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerStatus:
    """What became of one side's layer capture (``diagnostics.layers.training`` /
    ``.rollout``): ``layers_captured`` with its evidence, or ``layers_unavailable`` with the
    side's reason. A diagnostic status: never a knob status, never a verdict."""

    status: str
    evidence: dict[str, JSONScalar] | None = None
    reason: str | None = None

    @property
    def captured(self) -> bool:
        return self.status == LAYERS_CAPTURED

    def to_json(self) -> dict[str, Any]:
        if self.captured:
            return {"status": self.status, "evidence": dict(self.evidence or {})}
        return {"status": self.status, "reason": self.reason}


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerStateFigures:
    """One state's figures (``numerics.layer_reduction.compare``)."""

    state: str
    bitwise_equal_share: float
    median_rel_error: float
    max_rel_error: float
    median_cosine: float

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "bitwise_equal_share": self.bitwise_equal_share,
            "median_rel_error": self.median_rel_error,
            "max_rel_error": self.max_rel_error,
            "median_cosine": self.median_cosine,
        }


LAYER_STATE_KEYS = (
    "state",
    "bitwise_equal_share",
    "median_rel_error",
    "max_rel_error",
    "median_cosine",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerFigures:
    """The rollout side's states against the training side's at the same positions."""

    positions: int
    states: tuple[LayerStateFigures, ...]
    first_unequal_state: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "positions": self.positions,
            "states": [s.to_json() for s in self.states],
            "first_unequal_state": self.first_unequal_state,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerDiagnostics:
    """comparison.json's ``diagnostics.layers`` (opt-in ``diagnostics.layers``): each side's
    capture status, the reduction's parameters and the figures (None unless both captured)."""

    training: LayerStatus
    rollout: LayerStatus
    reduction: dict[str, int]
    """``projection_dim``, ``projection_seed``, ``digest_bytes``, and ``positions_per_row``
    when the capture read a subset of the positions (``numerics.layer_reduction.capture_mask``)."""
    figures: LayerFigures | None

    def side(self, name: str) -> LayerStatus:
        return self.training if name == "training" else self.rollout

    def to_json(self) -> dict[str, Any]:
        return {
            "training": self.training.to_json(),
            "rollout": self.rollout.to_json(),
            "reduction": dict(self.reduction),
            "figures": None if self.figures is None else self.figures.to_json(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class FigureRange:
    """min / mean / max of one importance-sampling figure (None: a plain number past float64;
    its log is always recorded beside it). ``mean`` is None where only the extremes are
    recorded (``perplexity_ratio``)."""

    min: float | None
    mean: float | None
    max: float | None

    def to_json(self, *, with_mean: bool = True) -> dict[str, float | None]:
        out = {"min": self.min, "mean": self.mean, "max": self.max}
        if not with_mean:
            del out["mean"]
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightBand:
    """Fractions of active tokens whose weight is strictly above / below ``edge``."""

    edge: float
    above: float
    below: float

    def to_json(self) -> dict[str, float]:
        return {"edge": self.edge, "above": self.above, "below": self.below}


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportanceSamplingFigures:
    """The importance-sampling figures of a case (``numerics.importance_sampling``'s
    ``ImportanceSampling.to_json``): what an off-policy correction would make of the drift,
    never a verdict. ``corrections`` maps each peer correction's key to its fraction, in the
    order written (sorted by key)."""

    active_tokens: int
    sequences: int
    weights_clamped: bool
    weight: FigureRange
    log_weight: FigureRange
    band_fractions: tuple[WeightBand, ...]
    ess: float
    ess_verl_clamped: float
    verl_clamp: tuple[float, float]
    chi2_token: float
    chi2_sequence: float
    ess_sequence: float
    log_sequence_ratio: FigureRange
    log_geometric_ratio: FigureRange
    max_geometric_deviation: float | None
    log_perplexity_ratio: FigureRange
    perplexity_ratio: FigureRange
    log_max_seq_mult_prob_error: float
    approx_kl_k1: float | None
    approx_kl_k2: float | None
    approx_kl_k3: float | None
    corrections: tuple[tuple[str, float], ...]

    def correction(self, key: str) -> float | None:
        """The fraction a peer correction (``PEER_CORRECTIONS`` key) affects; None when this
        record has no such key."""
        return dict(self.corrections).get(key)

    def to_json(self) -> dict[str, Any]:
        return {
            "active_tokens": self.active_tokens,
            "sequences": self.sequences,
            "weights_clamped": self.weights_clamped,
            "weight": self.weight.to_json(),
            "log_weight": self.log_weight.to_json(),
            "band_fractions": [b.to_json() for b in self.band_fractions],
            "ess": self.ess,
            "ess_verl_clamped": self.ess_verl_clamped,
            "verl_clamp": list(self.verl_clamp),
            "chi2_token": self.chi2_token,
            "chi2_sequence": self.chi2_sequence,
            "ess_sequence": self.ess_sequence,
            "log_sequence_ratio": self.log_sequence_ratio.to_json(),
            "log_geometric_ratio": self.log_geometric_ratio.to_json(),
            "max_geometric_deviation": self.max_geometric_deviation,
            "log_perplexity_ratio": self.log_perplexity_ratio.to_json(),
            "perplexity_ratio": self.perplexity_ratio.to_json(with_mean=False),
            "log_max_seq_mult_prob_error": self.log_max_seq_mult_prob_error,
            "approx_kl_k1": self.approx_kl_k1,
            "approx_kl_k2": self.approx_kl_k2,
            "approx_kl_k3": self.approx_kl_k3,
            "corrections": dict(self.corrections),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnostics:
    """comparison.json's ``diagnostics``: each part present or not (a verdict without
    numerics has no statistics; full-vocabulary parts only when they were asked for)."""

    statistics: Statistics | None = None
    full_vocabulary: FullVocabulary | FullVocabularyUnavailable | None = None
    semantic_offset: SemanticOffsetSummary | None = None
    path_split: PathSplit | None = None
    importance_sampling: ImportanceSamplingFigures | None = None
    """Absent in comparisons sealed before it existed and for cases without scores."""
    layers: LayerDiagnostics | None = None

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

    @property
    def max_abs_diff(self) -> float | None:
        return None if self.statistics is None else self.statistics.max_abs_diff

    def statistic(self, key: str) -> float | None:
        """The verdict's statistic ``key`` (one of ``STATISTICS_KEYS``; a report's columns
        name them), None when the verdict has no statistics."""
        if key not in STATISTICS_KEYS:
            raise KeyError(key)
        value: float | None = None if self.statistics is None else getattr(self.statistics, key)
        return value

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.statistics is None else dict(self.statistics.to_json())
        if self.full_vocabulary is not None:
            out["full_vocabulary"] = self.full_vocabulary.to_json()
        if self.semantic_offset is not None:
            out["semantic_offset"] = self.semantic_offset.to_json()
        if self.path_split is not None:
            out["path_split"] = self.path_split.to_json()
        if self.importance_sampling is not None:
            out["importance_sampling"] = self.importance_sampling.to_json()
        if self.layers is not None:
            out["layers"] = self.layers.to_json()
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class NumericCheck:
    """The numerical verdict alone (identity aside), which ``verify`` and resume recompute
    from ``token_diffs.pt`` and compare with the recorded one."""

    outcome: Outcome
    mismatches: int
    active_tokens: int
    threshold: float

    def to_json(self) -> dict[str, JSONScalar]:
        return {
            "outcome": self.outcome.value,
            "mismatches": self.mismatches,
            "active_tokens": self.active_tokens,
            "threshold": self.threshold,
        }


NUMERIC_CHECK_KEYS = ("outcome", "mismatches", "active_tokens", "threshold")


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """One attempt's ``comparison.json``."""

    case_id: str
    label: str
    contract: ResolvedContract
    outcome: Outcome
    reason: str
    threshold: float
    active_tokens: int
    mismatches: int
    diagnostics: Diagnostics
    worst_tokens: tuple[WorstToken, ...]
    identity_violations: tuple[str, ...]
    records: tuple[KnobApplication, ...]
    numerical: NumericCheck | None = None
    """Absent when neither side scored (a refusal came first)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "case_id": self.case_id,
            "label": self.label,
            "contract": canonical(self.contract),
            "outcome": self.outcome.value,
            "reason": self.reason,
            "threshold": self.threshold,
            "active_tokens": self.active_tokens,
            "mismatches": self.mismatches,
            "diagnostics": self.diagnostics.to_json(),
            "worst_tokens": [w.to_json() for w in self.worst_tokens],
            "identity_violations": list(self.identity_violations),
            "records": [canonical(r) for r in self.records],
        }
        if self.numerical is not None:
            out["numerical"] = self.numerical.to_json()
        return out


# --------------------------------------------------------------------------- the reader


def _object(value: object, path: str, keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> Any:
    """``value`` as a JSON object with exactly ``keys`` (and any of ``optional``)."""
    if not isinstance(value, dict):
        raise ComparisonShapeError(path, f"expected an object, got {json_type_name(value)}")
    for key in keys:
        if key not in value:
            raise ComparisonShapeError(_at(path, key), "missing required key")
    unknown = sorted(str(k) for k in value if k not in keys and k not in optional)
    if unknown:
        raise ComparisonShapeError(_at(path, unknown[0]), "unknown key")
    return value


def _at(path: str, key: str) -> str:
    return key if path == "$" else f"{path}.{key}"


def _array(value: object, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise ComparisonShapeError(path, f"expected an array, got {json_type_name(value)}")
    return value


def _string(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise ComparisonShapeError(path, f"expected a string, got {json_type_name(value)}")
    return value


def _boolean(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise ComparisonShapeError(path, f"expected a boolean, got {json_type_name(value)}")
    return value


def _count(value: object, path: str) -> int:
    """A non-negative integer (counts, indices, token ids)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ComparisonShapeError(
            path, f"expected a non-negative integer, got {json_type_name(value)} {value!r:.40}"
        )
    return value


def _number(value: object, path: str) -> float:
    """A finite number, kept as written (an integer stays one, so ``to_json`` gives it back)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ComparisonShapeError(path, f"expected a number, got {json_type_name(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ComparisonShapeError(path, f"expected a finite number, got {value!r}")
    return value


def _optional_number(value: object, path: str) -> float | None:
    return None if value is None else _number(value, path)


def _scalar(value: object, path: str) -> JSONScalar:
    if value is None or isinstance(value, (str, bool)):
        return value
    return _number(value, path)


def _enum_value(value: object, path: str, kind: type[Any]) -> Any:
    text = _string(value, path)
    try:
        return kind(text)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in kind)
        raise ComparisonShapeError(path, f"expected one of {choices}, got {text!r:.60}") from None


def _statistics(document: dict[str, Any], path: str) -> Statistics | None:
    present = [key for key in STATISTICS_KEYS if key in document]
    if not present:
        return None
    missing = [key for key in STATISTICS_KEYS if key not in document]
    if missing:
        raise ComparisonShapeError(_at(path, missing[0]), "missing required key")
    return Statistics(**{key: _number(document[key], _at(path, key)) for key in STATISTICS_KEYS})


def _worst_token(value: object, path: str) -> WorstToken:
    keys = ("sample", "position", "rollout_logprob", "training_logprob", "abs_diff")
    document = _object(value, path, keys)
    return WorstToken(
        sample=_count(document["sample"], f"{path}.sample"),
        position=_count(document["position"], f"{path}.position"),
        rollout_logprob=_number(document["rollout_logprob"], f"{path}.rollout_logprob"),
        training_logprob=_number(document["training_logprob"], f"{path}.training_logprob"),
        abs_diff=_number(document["abs_diff"], f"{path}.abs_diff"),
    )


def _reduction(value: object, path: str) -> ReductionStats:
    document = _object(value, path, ("mean", "p99", "max", "infinite", "nan"))
    return ReductionStats(
        mean=_optional_number(document["mean"], f"{path}.mean"),
        p99=_optional_number(document["p99"], f"{path}.p99"),
        max=_optional_number(document["max"], f"{path}.max"),
        infinite=_count(document["infinite"], f"{path}.infinite"),
        nan=_count(document["nan"], f"{path}.nan"),
    )


def _top_token(value: object, path: str) -> TopToken:
    keys = ("token_id", "rollout_logprob", "training_logprob", "tv_share")
    document = _object(value, path, keys)
    return TopToken(
        token_id=_count(document["token_id"], f"{path}.token_id"),
        rollout_logprob=_optional_number(document["rollout_logprob"], f"{path}.rollout_logprob"),
        training_logprob=_optional_number(document["training_logprob"], f"{path}.training_logprob"),
        tv_share=_number(document["tv_share"], f"{path}.tv_share"),
    )


def _worst_position(value: object, path: str) -> WorstPosition:
    keys = ("sample", "position", *REDUCTION_KEYS, "top_tokens")
    document = _object(value, path, keys)
    tokens = _array(document["top_tokens"], f"{path}.top_tokens")
    return WorstPosition(
        sample=_count(document["sample"], f"{path}.sample"),
        position=_count(document["position"], f"{path}.position"),
        kl_rollout_training=_optional_number(
            document["kl_rollout_training"], f"{path}.kl_rollout_training"
        ),
        kl_training_rollout=_optional_number(
            document["kl_training_rollout"], f"{path}.kl_training_rollout"
        ),
        total_variation=_optional_number(document["total_variation"], f"{path}.total_variation"),
        top_tokens=tuple(_top_token(t, f"{path}.top_tokens[{i}]") for i, t in enumerate(tokens)),
    )


def _full_vocabulary(value: object, path: str) -> FullVocabulary | FullVocabularyUnavailable:
    if isinstance(value, dict) and "unavailable" in value:
        document = _object(value, path, ("unavailable",))
        return FullVocabularyUnavailable(
            reason=_string(document["unavailable"], f"{path}.unavailable")
        )
    keys = ("positions", *REDUCTION_KEYS, "truncated_positions", "worst_positions")
    document = _object(value, path, keys)
    worst = _array(document["worst_positions"], f"{path}.worst_positions")
    return FullVocabulary(
        positions=_count(document["positions"], f"{path}.positions"),
        kl_rollout_training=_reduction(
            document["kl_rollout_training"], f"{path}.kl_rollout_training"
        ),
        kl_training_rollout=_reduction(
            document["kl_training_rollout"], f"{path}.kl_training_rollout"
        ),
        total_variation=_reduction(document["total_variation"], f"{path}.total_variation"),
        truncated_positions=_count(document["truncated_positions"], f"{path}.truncated_positions"),
        worst_positions=tuple(
            _worst_position(w, f"{path}.worst_positions[{i}]") for i, w in enumerate(worst)
        ),
    )


def _semantic_offset(value: object, path: str) -> SemanticOffsetSummary:
    keys = (
        "fires",
        "explanation",
        "explained_fraction",
        "truncated_positions",
        "tolerance",
        "message",
    )
    document = _object(value, path, keys, optional=("reproduces",))
    explanation = document["explanation"]
    reproduces = "reproduces" in document
    return SemanticOffsetSummary(
        reproduces=_string(document["reproduces"], f"{path}.reproduces") if reproduces else None,
        fires=_boolean(document["fires"], f"{path}.fires"),
        explanation=None if explanation is None else _string(explanation, f"{path}.explanation"),
        explained_fraction=_number(document["explained_fraction"], f"{path}.explained_fraction"),
        truncated_positions=_count(document["truncated_positions"], f"{path}.truncated_positions"),
        tolerance=_number(document["tolerance"], f"{path}.tolerance"),
        message=_string(document["message"], f"{path}.message"),
    )


def _replay_status(value: object, path: str) -> ReplayStatus:
    status = value.get("status") if isinstance(value, dict) else None
    keys = {
        REPLAY_RAN: ("status", "evidence"),
        REPLAY_INCOMPARABLE: ("status", "evidence", "reason"),
    }.get(status if isinstance(status, str) else "", ("status", "reason"))
    document = _object(value, path, keys)
    status = _string(document["status"], f"{path}.status")
    if status not in REPLAY_STATUSES:
        raise ComparisonShapeError(
            f"{path}.status", f"expected one of {', '.join(map(repr, REPLAY_STATUSES))}"
        )
    evidence: dict[str, JSONScalar] | None = None
    if "evidence" in document:
        raw = document["evidence"]
        if not isinstance(raw, dict):
            raise ComparisonShapeError(
                f"{path}.evidence", f"expected an object, got {json_type_name(raw)}"
            )
        evidence = {str(k): _scalar(v, f"{path}.evidence.{k}") for k, v in raw.items()}
    reason = _string(document["reason"], f"{path}.reason") if "reason" in document else None
    return ReplayStatus(status=status, evidence=evidence, reason=reason)


def _abs_diff_stats(value: object, path: str) -> AbsDiffStats | None:
    if value is None:
        return None
    document = _object(value, path, ("max", "mean", "p99"))
    return AbsDiffStats(
        max=_optional_number(document["max"], f"{path}.max"),
        mean=_optional_number(document["mean"], f"{path}.mean"),
        p99=_optional_number(document["p99"], f"{path}.p99"),
    )


def _decode_replay_figures(value: object, path: str) -> DecodeReplayFigures:
    document = _object(value, path, ("max", "mean", "p99", "bitwise_equal_fraction"))
    return DecodeReplayFigures(
        max=_optional_number(document["max"], f"{path}.max"),
        mean=_optional_number(document["mean"], f"{path}.mean"),
        p99=_optional_number(document["p99"], f"{path}.p99"),
        bitwise_equal_fraction=_optional_number(
            document["bitwise_equal_fraction"], f"{path}.bitwise_equal_fraction"
        ),
    )


def _figure_range(value: object, path: str, *, with_mean: bool = True) -> FigureRange:
    keys = ("min", "mean", "max") if with_mean else ("min", "max")
    document = _object(value, path, keys)
    return FigureRange(
        min=_optional_number(document["min"], f"{path}.min"),
        mean=_optional_number(document["mean"], f"{path}.mean") if with_mean else None,
        max=_optional_number(document["max"], f"{path}.max"),
    )


def _logs(value: object, path: str) -> FigureRange:
    """A range of logs: always finite numbers."""
    document = _object(value, path, ("min", "mean", "max"))
    return FigureRange(
        min=_number(document["min"], f"{path}.min"),
        mean=_number(document["mean"], f"{path}.mean"),
        max=_number(document["max"], f"{path}.max"),
    )


def _weight_band(value: object, path: str) -> WeightBand:
    document = _object(value, path, ("edge", "above", "below"))
    return WeightBand(
        edge=_number(document["edge"], f"{path}.edge"),
        above=_number(document["above"], f"{path}.above"),
        below=_number(document["below"], f"{path}.below"),
    )


IMPORTANCE_SAMPLING_KEYS = (
    "active_tokens",
    "sequences",
    "weights_clamped",
    "weight",
    "log_weight",
    "band_fractions",
    "ess",
    "ess_verl_clamped",
    "verl_clamp",
    "chi2_token",
    "chi2_sequence",
    "ess_sequence",
    "log_sequence_ratio",
    "log_geometric_ratio",
    "max_geometric_deviation",
    "log_perplexity_ratio",
    "perplexity_ratio",
    "log_max_seq_mult_prob_error",
    "approx_kl_k1",
    "approx_kl_k2",
    "approx_kl_k3",
    "corrections",
)


def read_importance_sampling(
    value: object, path: str = "diagnostics.importance_sampling"
) -> ImportanceSamplingFigures:
    """comparison.json's ``diagnostics.importance_sampling`` as its record, strictly."""
    d = _object(value, path, IMPORTANCE_SAMPLING_KEYS)
    bands = _array(d["band_fractions"], f"{path}.band_fractions")
    clamp = _array(d["verl_clamp"], f"{path}.verl_clamp")
    if len(clamp) != 2:
        raise ComparisonShapeError(f"{path}.verl_clamp", "expected [lower, upper]")
    corrections = d["corrections"]
    if not isinstance(corrections, dict):
        raise ComparisonShapeError(
            f"{path}.corrections", f"expected an object, got {json_type_name(corrections)}"
        )

    def number(key: str) -> float:
        return _number(d[key], f"{path}.{key}")

    def optional(key: str) -> float | None:
        return _optional_number(d[key], f"{path}.{key}")

    return ImportanceSamplingFigures(
        active_tokens=_count(d["active_tokens"], f"{path}.active_tokens"),
        sequences=_count(d["sequences"], f"{path}.sequences"),
        weights_clamped=_boolean(d["weights_clamped"], f"{path}.weights_clamped"),
        weight=_figure_range(d["weight"], f"{path}.weight"),
        log_weight=_logs(d["log_weight"], f"{path}.log_weight"),
        band_fractions=tuple(
            _weight_band(b, f"{path}.band_fractions[{i}]") for i, b in enumerate(bands)
        ),
        ess=number("ess"),
        ess_verl_clamped=number("ess_verl_clamped"),
        verl_clamp=(
            _number(clamp[0], f"{path}.verl_clamp[0]"),
            _number(clamp[1], f"{path}.verl_clamp[1]"),
        ),
        chi2_token=number("chi2_token"),
        chi2_sequence=number("chi2_sequence"),
        ess_sequence=number("ess_sequence"),
        log_sequence_ratio=_figure_range(d["log_sequence_ratio"], f"{path}.log_sequence_ratio"),
        log_geometric_ratio=_figure_range(d["log_geometric_ratio"], f"{path}.log_geometric_ratio"),
        max_geometric_deviation=optional("max_geometric_deviation"),
        log_perplexity_ratio=_figure_range(
            d["log_perplexity_ratio"], f"{path}.log_perplexity_ratio"
        ),
        perplexity_ratio=_figure_range(
            d["perplexity_ratio"], f"{path}.perplexity_ratio", with_mean=False
        ),
        log_max_seq_mult_prob_error=number("log_max_seq_mult_prob_error"),
        approx_kl_k1=optional("approx_kl_k1"),
        approx_kl_k2=optional("approx_kl_k2"),
        approx_kl_k3=optional("approx_kl_k3"),
        corrections=tuple(
            (str(k), _number(v, f"{path}.corrections.{k}")) for k, v in corrections.items()
        ),
    )


def _path_split_figures(value: object, path: str) -> PathSplitFigures | None:
    if value is None:
        return None
    keys = ("active_tokens", *PATH_PAIRS, "bitwise_equal_fraction", "first_difference")
    replay = "decode_replay_decode"
    document = _object(value, path, keys, optional=(replay,))
    first = document["first_difference"]
    firsts = (
        None
        if first is None
        else tuple(
            None if f is None else _count(f, f"{path}.first_difference[{i}]")
            for i, f in enumerate(_array(first, f"{path}.first_difference"))
        )
    )
    stats = {key: _abs_diff_stats(document[key], f"{path}.{key}") for key in PATH_PAIRS}
    return PathSplitFigures(
        active_tokens=_count(document["active_tokens"], f"{path}.active_tokens"),
        decode_prefill=stats["decode_prefill"],
        prefill_training=stats["prefill_training"],
        decode_training=stats["decode_training"],
        bitwise_equal_fraction=_optional_number(
            document["bitwise_equal_fraction"], f"{path}.bitwise_equal_fraction"
        ),
        first_difference=firsts,
        decode_replay_decode=(
            _decode_replay_figures(document[replay], f"{path}.{replay}")
            if replay in document
            else None
        ),
    )


def read_path_split(value: object, path: str = "diagnostics.path_split") -> PathSplit:
    """``diagnostics.path_split`` as its record, strictly."""
    document = _object(value, path, ("prefill", "decode_replay", "comparable", "figures"))
    comparable = _object(document["comparable"], f"{path}.comparable", PATH_PAIRS)
    return PathSplit(
        prefill=_replay_status(document["prefill"], f"{path}.prefill"),
        decode_replay=_replay_status(document["decode_replay"], f"{path}.decode_replay"),
        comparable={
            key: _boolean(comparable[key], f"{path}.comparable.{key}") for key in PATH_PAIRS
        },
        figures=_path_split_figures(document["figures"], f"{path}.figures"),
    )


def read_diagnostics(value: object, path: str = "diagnostics") -> Diagnostics:
    """comparison.json's ``diagnostics`` object as its typed parts."""
    document = _object(
        value,
        path,
        (),
        optional=(
            *STATISTICS_KEYS,
            "full_vocabulary",
            "semantic_offset",
            "path_split",
            "importance_sampling",
            "layers",
        ),
    )
    full, offset, split = "full_vocabulary", "semantic_offset", "path_split"
    weights = "importance_sampling"
    return Diagnostics(
        statistics=_statistics(document, path),
        full_vocabulary=(
            _full_vocabulary(document[full], _at(path, full)) if full in document else None
        ),
        semantic_offset=(
            _semantic_offset(document[offset], _at(path, offset)) if offset in document else None
        ),
        path_split=read_path_split(document[split], _at(path, split))
        if split in document
        else None,
        importance_sampling=(
            read_importance_sampling(document[weights], _at(path, weights))
            if weights in document
            else None
        ),
        layers=read_layers(document["layers"], _at(path, "layers"))
        if "layers" in document
        else None,
    )


def _layer_status(value: object, path: str) -> LayerStatus:
    status = value.get("status") if isinstance(value, dict) else None
    keys = ("status", "evidence") if status == LAYERS_CAPTURED else ("status", "reason")
    document = _object(value, path, keys)
    status = _string(document["status"], f"{path}.status")
    if status not in LAYER_STATUSES:
        raise ComparisonShapeError(
            f"{path}.status", f"expected one of {', '.join(map(repr, LAYER_STATUSES))}"
        )
    if "evidence" in document:
        raw = document["evidence"]
        if not isinstance(raw, dict):
            raise ComparisonShapeError(
                f"{path}.evidence", f"expected an object, got {json_type_name(raw)}"
            )
        evidence = {str(k): _scalar(v, f"{path}.evidence.{k}") for k, v in raw.items()}
        return LayerStatus(status=status, evidence=evidence)
    return LayerStatus(status=status, reason=_string(document["reason"], f"{path}.reason"))


def _layer_figures(value: object, path: str) -> LayerFigures | None:
    if value is None:
        return None
    document = _object(value, path, ("positions", "states", "first_unequal_state"))
    states = []
    for i, item in enumerate(_array(document["states"], f"{path}.states")):
        where = f"{path}.states[{i}]"
        row = _object(item, where, LAYER_STATE_KEYS)
        states.append(
            LayerStateFigures(
                state=_string(row["state"], f"{where}.state"),
                bitwise_equal_share=_number(
                    row["bitwise_equal_share"], f"{where}.bitwise_equal_share"
                ),
                median_rel_error=_number(row["median_rel_error"], f"{where}.median_rel_error"),
                max_rel_error=_number(row["max_rel_error"], f"{where}.max_rel_error"),
                median_cosine=_number(row["median_cosine"], f"{where}.median_cosine"),
            )
        )
    first = document["first_unequal_state"]
    names = [s.state for s in states]
    if first is not None and _string(first, f"{path}.first_unequal_state") not in names:
        raise ComparisonShapeError(f"{path}.first_unequal_state", f"no state {first!r:.40}")
    return LayerFigures(
        positions=_count(document["positions"], f"{path}.positions"),
        states=tuple(states),
        first_unequal_state=first,
    )


def read_layers(value: object, path: str = "diagnostics.layers") -> LayerDiagnostics:
    """``diagnostics.layers`` as its record, strictly."""
    document = _object(value, path, ("training", "rollout", "reduction", "figures"))
    reduction = _object(
        document["reduction"],
        f"{path}.reduction",
        ("projection_dim", "projection_seed", "digest_bytes"),
        ("positions_per_row",),
    )
    return LayerDiagnostics(
        training=_layer_status(document["training"], f"{path}.training"),
        rollout=_layer_status(document["rollout"], f"{path}.rollout"),
        reduction={k: _count(v, f"{path}.reduction.{k}") for k, v in reduction.items()},
        figures=_layer_figures(document["figures"], f"{path}.figures"),
    )


def _contract(value: object, path: str) -> ResolvedContract:
    keys = ("source", "version", "threshold", "unit", "digest", "minor_version")
    document = _object(value, path, keys)
    return ResolvedContract(
        source=_string(document["source"], f"{path}.source"),
        version=_string(document["version"], f"{path}.version"),
        threshold=_number(document["threshold"], f"{path}.threshold"),
        unit=_string(document["unit"], f"{path}.unit"),
        digest=_string(document["digest"], f"{path}.digest"),
        minor_version=_count(document["minor_version"], f"{path}.minor_version"),
    )


def _knob_value(value: object, path: str) -> KnobValue:
    if isinstance(value, (str, bool)) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise ComparisonShapeError(
        path, f"expected a string, integer or boolean, got {json_type_name(value)}"
    )


def _record(value: object, path: str) -> KnobApplication:
    keys = ("knob", "lifecycle", "requested", "materialized", "actual", "status", "evidence")
    document = _object(value, path, keys)
    return KnobApplication(
        knob=_string(document["knob"], f"{path}.knob"),
        lifecycle=_enum_value(document["lifecycle"], f"{path}.lifecycle", Lifecycle),
        requested=_knob_value(document["requested"], f"{path}.requested"),
        materialized=_scalar(document["materialized"], f"{path}.materialized"),
        actual=_scalar(document["actual"], f"{path}.actual"),
        status=_enum_value(document["status"], f"{path}.status", ApplicationStatus),
        evidence=_string(document["evidence"], f"{path}.evidence"),
    )


def read_numeric_check(value: object, path: str = "numerical") -> NumericCheck:
    document = _object(value, path, NUMERIC_CHECK_KEYS)
    return NumericCheck(
        outcome=_enum_value(document["outcome"], f"{path}.outcome", Outcome),
        mismatches=_count(document["mismatches"], f"{path}.mismatches"),
        active_tokens=_count(document["active_tokens"], f"{path}.active_tokens"),
        threshold=_number(document["threshold"], f"{path}.threshold"),
    )


COMPARISON_KEYS = (
    "case_id",
    "label",
    "contract",
    "outcome",
    "reason",
    "threshold",
    "active_tokens",
    "mismatches",
    "diagnostics",
    "worst_tokens",
    "identity_violations",
    "records",
)
"""The keys every comparison.json has; ``numerical`` is the one optional key."""


def read_comparison(value: object) -> Comparison:
    """A comparison.json document as its record, strictly: every wrong type, missing required
    key or unknown key raises ``ComparisonShapeError`` naming its JSON path."""
    document = _object(value, "$", COMPARISON_KEYS, optional=("numerical",))
    worst = _array(document["worst_tokens"], "worst_tokens")
    violations = _array(document["identity_violations"], "identity_violations")
    records = _array(document["records"], "records")
    return Comparison(
        case_id=_string(document["case_id"], "case_id"),
        label=_string(document["label"], "label"),
        contract=_contract(document["contract"], "contract"),
        outcome=_enum_value(document["outcome"], "outcome", Outcome),
        reason=_string(document["reason"], "reason"),
        threshold=_number(document["threshold"], "threshold"),
        active_tokens=_count(document["active_tokens"], "active_tokens"),
        mismatches=_count(document["mismatches"], "mismatches"),
        diagnostics=read_diagnostics(document["diagnostics"]),
        worst_tokens=tuple(_worst_token(w, f"worst_tokens[{i}]") for i, w in enumerate(worst)),
        identity_violations=tuple(
            _string(v, f"identity_violations[{i}]") for i, v in enumerate(violations)
        ),
        records=tuple(_record(r, f"records[{i}]") for i, r in enumerate(records)),
        numerical=(read_numeric_check(document["numerical"]) if "numerical" in document else None),
    )
