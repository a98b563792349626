"""The importance-sampling view of one case: what the drift would cost an RL run.

Owns the figures an off-policy correction computes from the two sides' selected-token
logprobs, as a pure function of ``(training_logprobs [B, L], rollout_logprobs [B, L],
active_mask [B, L] bool)`` (what ``token_diffs.pt`` holds), and the one definition of the k1
and k3 KL estimates that the verdict's diagnostics also report. With the log-ratio
``r = training - rollout`` on each active token (training is the proximal "old" policy, rollout
the behaviour policy that sampled the tokens), the token weight is ``w = exp(r)``; a sample is a
row and its figures use only its active tokens (rows without any are not sequences).

Conventions, so that no figure is inf or nan for finite inputs:

- everything is float64 on float32 (or narrower) inputs, as the verdict is;
- every ratio is computed from its log (logsumexp), and every band test compares logs
  (``w > cap`` is ``r > log(cap)``);
- weights are not clamped: the ESS and chi2 are those of the raw weights; verl's clamped ESS
  is reported beside it under its own name (``ess_verl_clamped``, weights clamped to
  ``[VERL_ESS_LOWER, VERL_ESS_UPPER]`` first);
- a figure that is a plain number (not a log) and exceeds float64 (a weight ``exp(r)`` for
  r above about 709) is ``None`` in ``to_json()``; its log is always there.

Never a verdict: nothing here compares against the contract threshold. Knows nothing about
files, engines, the contract or how the figures are shown.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from pytest_logprob_drift.numerics.peer_corrections import (
    BAND_EDGES,
    PEER_CORRECTIONS,
    VERL_ESS_LOWER,
    VERL_ESS_UPPER,
    PeerCorrection,
    Statistic,
)
from pytest_logprob_drift.records import JsonObject

__all__ = [
    "BAND_EDGES",
    "PEER_CORRECTIONS",
    "VERL_ESS_LOWER",
    "VERL_ESS_UPPER",
    "PeerCorrection",
    "Statistic",
]


def approx_kl_k1(log_ratio: torch.Tensor) -> float:
    """k1 = mean(-r): KL(rollout || training) estimated from tokens the rollout sampled."""
    return float((-log_ratio).mean())


def approx_kl_k3(log_ratio: torch.Tensor) -> float:
    """k3 = mean(exp(r) - r - 1): the same KL, never negative per token (Schulman's k3)."""
    return float((torch.exp(log_ratio) - log_ratio - 1).mean())


def approx_kl_k2(log_ratio: torch.Tensor) -> float:
    """k2 = 0.5 * mean(r^2)."""
    return float(0.5 * (log_ratio * log_ratio).mean())


@dataclass(frozen=True, slots=True, kw_only=True)
class BandFraction:
    """Fractions of active tokens whose weight is strictly above / below ``edge``."""

    edge: float
    above: float
    below: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """min / mean / max over sequences of one per-sequence figure."""

    min: float
    mean: float
    max: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportanceSampling:
    """Every figure of one case. Token figures are over active tokens, sequence figures over
    rows with at least one active token."""

    active_tokens: int
    sequences: int
    weight_min: float
    weight_mean: float
    weight_max: float
    log_weight_min: float
    log_weight_mean: float
    log_weight_max: float
    band_fractions: tuple[BandFraction, ...]
    ess: float
    ess_verl_clamped: float
    chi2_token: float
    chi2_sequence: float
    ess_sequence: float
    log_sequence_ratio: Summary
    log_geometric_ratio: Summary
    max_geometric_deviation: float
    log_perplexity_ratio: Summary
    log_max_seq_mult_prob_error: float
    approx_kl_k1: float
    approx_kl_k2: float
    approx_kl_k3: float
    corrections: Mapping[str, float]

    def to_json(self) -> JsonObject:
        """JSON-safe: every float is finite or ``None`` (a plain number that overflows
        float64; its log is always present)."""

        def summary(s: Summary) -> dict[str, float | None]:
            return {"min": _finite(s.min), "mean": _finite(s.mean), "max": _finite(s.max)}

        return {
            "active_tokens": self.active_tokens,
            "sequences": self.sequences,
            "weights_clamped": False,
            "weight": {
                "min": _finite(self.weight_min),
                "mean": _finite(self.weight_mean),
                "max": _finite(self.weight_max),
            },
            "log_weight": {
                "min": self.log_weight_min,
                "mean": self.log_weight_mean,
                "max": self.log_weight_max,
            },
            "band_fractions": [
                {"edge": b.edge, "above": b.above, "below": b.below} for b in self.band_fractions
            ],
            "ess": self.ess,
            "ess_verl_clamped": self.ess_verl_clamped,
            "verl_clamp": [VERL_ESS_LOWER, VERL_ESS_UPPER],
            "chi2_token": self.chi2_token,
            "chi2_sequence": self.chi2_sequence,
            "ess_sequence": self.ess_sequence,
            "log_sequence_ratio": summary(self.log_sequence_ratio),
            "log_geometric_ratio": summary(self.log_geometric_ratio),
            "max_geometric_deviation": _finite(self.max_geometric_deviation),
            "log_perplexity_ratio": summary(self.log_perplexity_ratio),
            "perplexity_ratio": {
                "min": _finite(_exp(self.log_perplexity_ratio.min)),
                "max": _finite(_exp(self.log_perplexity_ratio.max)),
            },
            "log_max_seq_mult_prob_error": self.log_max_seq_mult_prob_error,
            "approx_kl_k1": _finite(self.approx_kl_k1),
            "approx_kl_k2": _finite(self.approx_kl_k2),
            "approx_kl_k3": _finite(self.approx_kl_k3),
            "corrections": {k: self.corrections[k] for k in sorted(self.corrections)},
        }


_LOG_MAX = math.log(torch.finfo(torch.float64).max)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _exp(log_value: float) -> float:
    """exp without an OverflowError: inf past float64 (``to_json`` writes it as None)."""
    return math.exp(log_value) if log_value <= _LOG_MAX else math.inf


def _expm1_abs(log_value: float) -> float:
    return abs(math.expm1(log_value)) if log_value <= _LOG_MAX else math.inf


def _logsumexp_rows(x: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """Per-row logsumexp over active entries (rows of all-inactive give -inf)."""
    return torch.logsumexp(x.masked_fill(~active, -math.inf), dim=1)


class _Counts:
    """How many of some logs lie strictly above and strictly below each of a fixed set of log
    edges, from two bucketizes and two bincounts (no pass per edge, no sort)."""

    __slots__ = ("above_counts", "below_counts", "count", "edges")

    def __init__(self, values: torch.Tensor, edges: tuple[float, ...]) -> None:
        self.edges = edges
        self.count = values.numel()
        bounds = torch.tensor([math.log(e) for e in edges], dtype=values.dtype)
        k = len(edges)
        # right=False: i = #edges strictly below the value, so value > edge[j] iff i > j
        over = torch.bincount(torch.bucketize(values, bounds, right=False), minlength=k + 1)
        # right=True: i = #edges at or below the value, so value < edge[j] iff i <= j
        under = torch.bincount(torch.bucketize(values, bounds, right=True), minlength=k + 1)
        self.above_counts = (self.count - over.cumsum(0)[:k]).tolist()
        self.below_counts = under.cumsum(0)[:k].tolist()

    def above(self, edge: float) -> int:
        return int(self.above_counts[self.edges.index(edge)])

    def below(self, edge: float) -> int:
        return int(self.below_counts[self.edges.index(edge)])

    def fraction_outside(self, low: float | None, high: float | None) -> float:
        """Fraction strictly outside ``[low, high]`` (an open side when None)."""
        outside = (self.above(high) if high is not None else 0) + (
            self.below(low) if low is not None else 0
        )
        return outside / self.count


def _edges(statistic: Statistic) -> tuple[float, ...]:
    return tuple(
        sorted(
            {
                e
                for p in PEER_CORRECTIONS
                if p.statistic is statistic
                for e in (p.low, p.high)
                if e is not None
            }
        )
    )


def _spread(log_w: torch.Tensor) -> tuple[float, float, float]:
    """(normalized ESS, chi2, lse) of the weights exp(log_w), with lse = logsumexp(log_w):
    ESS = 1 / mean((w / mean w)^2) = exp(2 lse(r) - log N - lse(2r)), in (0, 1];
    chi2 = mean(w^2) / mean(w)^2 - 1 = 1 / ESS - 1 = expm1(log N + lse(2r) - 2 lse(r)).
    Both logsumexps from one exp shifted by the largest log weight (e = exp(r - max) <= 1,
    each sum >= 1: what ``torch.logsumexp`` does, once for both)."""
    n = math.log(log_w.numel())
    top = float(log_w.max())
    e = torch.exp(log_w - top)
    lse1 = top + math.log(float(e.sum()))
    lse2 = 2 * top + math.log(float((e * e).sum()))
    return (
        min(1.0, math.exp(2 * lse1 - n - lse2)),
        max(0.0, math.expm1(n + lse2 - 2 * lse1)),
        lse1,
    )


def importance_sampling(
    training: torch.Tensor, rollout: torch.Tensor, active: torch.Tensor
) -> ImportanceSampling:
    """The figures of one case. Raises ``ValueError`` for inputs a verdict would not judge
    (shapes differ, a non-bool mask, no active token, a non-finite active score)."""
    if training.shape != rollout.shape or training.shape != active.shape or training.dim() != 2:
        raise ValueError(
            f"expected three [B, L] tensors of one shape, got {tuple(training.shape)}, "
            f"{tuple(rollout.shape)}, {tuple(active.shape)}"
        )
    if active.dtype != torch.bool:
        raise ValueError(f"active_mask has dtype {active.dtype}, expected torch.bool")
    lengths = active.sum(dim=1)
    count = int(lengths.sum())
    if count == 0:
        raise ValueError("no active tokens")
    ratio = (training.to(torch.float64) - rollout.to(torch.float64)).masked_fill(~active, 0.0)
    r = ratio[active]  # r on each active token; ratio is r, 0 where inactive
    r_min, r_max = float(r.min()), float(r.max())  # NaN propagates through min and max
    if not (math.isfinite(r_min) and math.isfinite(r_max)):
        raise ValueError("a log-ratio is non-finite at an active position")
    tokens = _Counts(r, BAND_EDGES)

    # token level
    ess, chi2_token, lse = _spread(r)
    log_mean = lse - math.log(count)
    bands = tuple(
        BandFraction(
            edge=edge,
            above=tokens.above(edge) / count,
            below=tokens.below(edge) / count,
        )
        for edge in BAND_EDGES
    )
    clamped = torch.exp(r.clamp(min=math.log(VERL_ESS_LOWER), max=math.log(VERL_ESS_UPPER)))
    ess_verl = float(1.0 / ((clamped / clamped.mean()) ** 2).mean())

    # sequence level: rows with at least one active token
    rows = lengths > 0
    n_rows = int(rows.sum())
    row_lengths = lengths[rows].to(torch.float64)
    seq_sum = ratio.sum(dim=1)[rows]  # log sequence ratio
    seq_mean = seq_sum / row_lengths  # log geometric ratio
    log_mult_error = _logsumexp_rows(ratio.abs(), active)[rows] - torch.log(row_lengths)
    ess_sequence, chi2_sequence, _ = _spread(seq_sum)

    def summary(x: torch.Tensor) -> Summary:
        return Summary(min=float(x.min()), mean=float(x.mean()), max=float(x.max()))

    statistic_values = {
        Statistic.TOKEN_RATIO: tokens,
        Statistic.GEOMETRIC_RATIO: _Counts(seq_mean, _edges(Statistic.GEOMETRIC_RATIO)),
        Statistic.SEQUENCE_RATIO: _Counts(seq_sum, _edges(Statistic.SEQUENCE_RATIO)),
        Statistic.MULT_PROB_ERROR: _Counts(log_mult_error, _edges(Statistic.MULT_PROB_ERROR)),
    }
    corrections = {
        p.key: statistic_values[p.statistic].fraction_outside(p.low, p.high)
        for p in PEER_CORRECTIONS
    }
    geo_min, geo_max = float(seq_mean.min()), float(seq_mean.max())
    return ImportanceSampling(
        active_tokens=count,
        sequences=n_rows,
        weight_min=_exp(r_min),
        weight_mean=_exp(log_mean),
        weight_max=_exp(r_max),
        log_weight_min=r_min,
        log_weight_mean=log_mean,
        log_weight_max=r_max,
        band_fractions=bands,
        ess=ess,
        ess_verl_clamped=min(1.0, ess_verl),
        chi2_token=chi2_token,
        chi2_sequence=chi2_sequence,
        ess_sequence=ess_sequence,
        log_sequence_ratio=summary(seq_sum),
        log_geometric_ratio=summary(seq_mean),
        max_geometric_deviation=max(_expm1_abs(geo_min), _expm1_abs(geo_max)),
        log_perplexity_ratio=summary(0.0 - seq_mean),  # 0.0 - : no -0.0 in the JSON
        log_max_seq_mult_prob_error=float(log_mult_error.max()),
        approx_kl_k1=approx_kl_k1(r),
        approx_kl_k2=approx_kl_k2(r),
        approx_kl_k3=approx_kl_k3(r),
        corrections=corrections,
    )
