"""The drift signatures: which known cause the logged logprobs alone point to.

Owns the detectors, pure functions of numpy arrays in float64 (torch-free). The step and
sample scope ones (``step_signatures``) read one ``[B, T]`` grid as token_diffs.pt seals it
(``training``, ``rollout``, ``active``; a row is a sample, a position counts from the row's
first active token); the run scope ones (``run_signatures``) read the steps' sealed
``mean_abs_diff`` in step order. ``d = rollout - training`` on the active tokens whose two
scores are finite. Each threshold is set so that honest bf16 noise (symmetric around 0, flat
over positions and steps, no sample far above the rest) does not reach it:

- ``zero_filled`` (sample): the rollout is exactly 0.0 on an active token where the trainer's
  logprob is at most ``ZERO_FILLED_TRAINING_AT_MOST`` (p <= 0.61); an honest engine returns
  exactly 0 only where p rounds to 1. Evidence: tokens, positions, the trainer's sum over them.
  These tokens are left out of every other detector (their cause is named).
- ``truncated_sampling`` (step): the rollout renormalised over a kept set (top-p / top-k),
  ``d = -log(kept mass) >= 0`` plus the noise: the mean of ``max(-d, 0)`` at most
  ``TRUNCATED_ASYMMETRY`` of the mean of ``max(d, 0)`` and the mean of ``exp(-d)`` (the kept
  mass, trl#7269's mean ratio) at most ``TRUNCATED_KEPT_MASS_AT_MOST``. Honest noise is
  symmetric (the two parts about equal); a temperature moves tokens both ways (0.4 to 0.7).
- ``tempered`` (step, when not truncated): the rollout from logits / T. Below the top token
  ``log p_T(y) = log p(y) / T + c`` (``c`` the position's normaliser), so on the tokens the
  trainer gives at most ``TEMPERED_TRAINING_AT_MOST`` (p <= 0.37, not the top one) the
  least-squares line of rollout on training has slope ``1/T``; named when ``|T - 1| >=
  TEMPERED_MIN_DEPARTURE`` and ``d`` follows the training logprob (``corr(d, training)^2 >=
  TEMPERED_MIN_R2``): honest noise does not. Evidence: the implied T (the ratio of the
  rollout's temperature to the trainer's).
- ``shifted`` (step): rollout[t] against training[t +- 1] on adjacent active pairs, mean
  |diff| at most ``SHIFTED_RATIO`` of the aligned mean |diff|, itself at least
  ``SHIFTED_MIN_ALIGNED`` (adjacent honest logprobs differ by far more than the noise). The
  others are not looked for on a shifted step (they would read the misalignment).
- ``sample_outliers`` (sample): each sample's mean |d|; sorted, the widest ratio between
  neighbours is at least ``OUTLIER_GAP``, the samples above it are at least
  ``OUTLIER_FLOOR`` and at least one sample stays below (the rest, at the noise level).
- ``position_growth`` (step): mean |d| over the first, middle and last third of the positions
  rises through the thirds and the last is at least ``GROWTH_RATIO`` times the first and at
  least ``GROWTH_FLOOR``. Evidence: the three means and the least-squares growth per 1K tokens.
- ``step_jump`` (run): a split of the steps (two each side at least) where each side is flat
  (max/min at most ``JUMP_FLATNESS``) and the sides are ``JUMP_RATIO`` apart (min of the higher
  over max of the lower). Evidence: the first step of the new level, both levels.
- ``step_trend`` (run, when no jump): Spearman's rank correlation of the figure with the step
  at least ``TREND_MIN_RHO`` and the mean of the last third of the steps at least
  ``TREND_RATIO`` times the first third's, over ``TREND_MIN_STEPS`` steps or more.

A detector with too few tokens, pairs, samples or steps names nothing. Never a verdict; knows
nothing about files, formats or how a signature is shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pytest_logprob_drift.numerics.signature_record import (
    Evidence,
    Scope,
    SealedSignature,
    SignatureId,
)

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

ZERO_FILLED_TRAINING_AT_MOST = -0.5
MIN_TOKENS = 32
"""Tokens a step-scope fit (truncated, tempered, position growth) needs."""
TIE = 1e-6
TRUNCATED_ASYMMETRY = 0.1
TRUNCATED_KEPT_MASS_AT_MOST = 0.99
TEMPERED_TRAINING_AT_MOST = -1.0
TEMPERED_MIN_DEPARTURE = 0.05
TEMPERED_MIN_R2 = 0.5
SHIFTED_MIN_PAIRS = 16
SHIFTED_RATIO = 0.25
SHIFTED_MIN_ALIGNED = 0.05
OUTLIER_MIN_SAMPLES = 3
OUTLIER_GAP = 10.0
OUTLIER_FLOOR = 1e-3
GROWTH_MIN_PER_THIRD = 16
GROWTH_RATIO = 3.0
GROWTH_FLOOR = 0.01
JUMP_FLATNESS = 2.0
JUMP_RATIO = 3.0
TREND_MIN_STEPS = 5
TREND_MIN_RHO = 0.8
TREND_RATIO = 2.0
SHOWN_POSITIONS = 16
"""Positions an evidence lists at most (the count says how many there are)."""
_TINY = 1e-300


@dataclass(frozen=True, slots=True, kw_only=True)
class _Grid:
    """The step's tokens the detectors read: ``d``, the training logprob, the row and the
    position of each token kept (active, finite, not zero-filled)."""

    d: Floats
    training: Floats
    rows: npt.NDArray[np.int64]
    positions: npt.NDArray[np.int64]


def _positions(active: Bools) -> npt.NDArray[np.int64]:
    """Each cell's position counted from its row's first active token."""
    first = np.where(active.any(axis=1), active.argmax(axis=1), 0)
    positions: npt.NDArray[np.int64] = np.arange(active.shape[1], dtype=np.int64)[None, :]
    return np.asarray(positions - first[:, None], dtype=np.int64)


def step_signatures(training: Floats, rollout: Floats, active: Bools) -> list[SealedSignature]:
    """The step and sample scope signatures of one ``[B, T]`` grid, in the order of
    ``SignatureId`` then sample (``ValueError`` on shapes that differ)."""
    if training.shape != rollout.shape or training.shape != active.shape or training.ndim != 2:
        raise ValueError(
            f"expected three [B, T] arrays of one shape, got {training.shape}, "
            f"{rollout.shape}, {active.shape}"
        )
    training = training.astype(np.float64)
    rollout = rollout.astype(np.float64)
    usable = active.astype(bool) & np.isfinite(training) & np.isfinite(rollout)
    zeroed = usable & (rollout == 0.0) & (training <= ZERO_FILLED_TRAINING_AT_MOST)
    positions = _positions(usable)
    kept = usable & ~zeroed
    rows, _ = np.nonzero(kept)
    grid = _Grid(
        d=(rollout - training)[kept],
        training=training[kept],
        rows=rows.astype(np.int64),
        positions=positions[kept],
    )
    with np.errstate(over="ignore", invalid="ignore"):  # a sentinel such as -65504: inf
        found = _zero_filled(training, zeroed, positions)
        shifted = _shifted(training, rollout, usable)
        if shifted:  # the scores are misaligned: what the others would read is that
            return found + shifted
        truncated = _truncated(grid)
        found += truncated or _tempered(grid, rollout[kept])
        found += _outliers(grid, int(training.shape[0]))
        found += _growth(grid)
    return found


def _shown(values: npt.NDArray[np.int64]) -> tuple[int, ...]:
    return tuple(int(v) for v in values[:SHOWN_POSITIONS])


def _zero_filled(
    training: Floats, zeroed: Bools, positions: npt.NDArray[np.int64]
) -> list[SealedSignature]:
    found = []
    for row in np.nonzero(zeroed.any(axis=1))[0]:
        cells = zeroed[row]
        found.append(
            SealedSignature(
                id=SignatureId.ZERO_FILLED,
                scope=Scope.SAMPLE,
                sample=int(row),
                evidence={
                    "tokens": int(cells.sum()),
                    "positions": _shown(positions[row][cells]),
                    "training_logprob_sum": float(training[row][cells].sum()),
                },
            )
        )
    return found


def _truncated(grid: _Grid) -> list[SealedSignature]:
    n = grid.d.size
    if n < MIN_TOKENS:
        return []
    above = float(np.maximum(grid.d, 0.0).mean())
    below = float(np.maximum(-grid.d, 0.0).mean())
    kept_mass = float(np.exp(-grid.d).mean())
    if not (below <= TRUNCATED_ASYMMETRY * above and kept_mass <= TRUNCATED_KEPT_MASS_AT_MOST):
        return []
    evidence: Evidence = {
        "tokens": n,
        "share_rollout_at_least_training": float((grid.d >= -TIE).mean()),
        "asymmetry": below / above,
        "kept_mass": kept_mass,
        "mean_log_kept_mass": float(-grid.d.mean()),
    }
    return [SealedSignature(id=SignatureId.TRUNCATED_SAMPLING, scope=Scope.STEP, evidence=evidence)]


def _tempered(grid: _Grid, rollout: Floats) -> list[SealedSignature]:
    below = grid.training <= TEMPERED_TRAINING_AT_MOST
    n = int(below.sum())
    if n < MIN_TOKENS:
        return []
    t, r, d = grid.training[below], rollout[below], grid.d[below]
    t_centred, r_centred, d_centred = t - t.mean(), r - r.mean(), d - d.mean()
    spread = float((t_centred * t_centred).sum())
    d_spread = float((d_centred * d_centred).sum())
    if spread <= _TINY or d_spread <= _TINY:
        return []
    slope = float((t_centred * r_centred).sum()) / spread
    r2 = float((t_centred * d_centred).sum()) ** 2 / (spread * d_spread)
    if slope <= 0.0:
        return []
    implied = 1.0 / slope
    if abs(implied - 1.0) < TEMPERED_MIN_DEPARTURE or r2 < TEMPERED_MIN_R2:
        return []
    evidence: Evidence = {
        "tokens": n,
        "implied_temperature": implied,
        "slope": slope,
        "r2": r2,
        "mean_diff": float(d.mean()),
    }
    return [SealedSignature(id=SignatureId.TEMPERED, scope=Scope.STEP, evidence=evidence)]


def _shifted(training: Floats, rollout: Floats, usable: Bools) -> list[SealedSignature]:
    pairs = usable[:, :-1] & usable[:, 1:]
    count = int(pairs.sum())
    if count < SHIFTED_MIN_PAIRS:
        return []
    aligned = float(np.abs(rollout - training)[usable].mean())
    ahead = np.abs(rollout[:, :-1] - training[:, 1:])  # rollout[t] against training[t + 1]
    behind = np.abs(rollout[:, 1:] - training[:, :-1])  # rollout[t] against training[t - 1]
    errors = {1: float(ahead[pairs].mean()), -1: float(behind[pairs].mean())}
    offset = min(errors, key=lambda k: errors[k])
    shifted = errors[offset]
    if aligned < SHIFTED_MIN_ALIGNED or shifted > SHIFTED_RATIO * aligned:
        return []
    per_row = ahead if offset == 1 else behind
    rows = [
        row
        for row in range(int(training.shape[0]))
        if pairs[row].any()
        and float(per_row[row][pairs[row]].mean())
        < float(np.abs(rollout[row] - training[row])[usable[row]].mean())
    ]
    evidence: Evidence = {
        "offset": offset,
        "pairs": count,
        "aligned_mean_abs_diff": aligned,
        "shifted_mean_abs_diff": shifted,
        "samples": tuple(rows),
    }
    return [SealedSignature(id=SignatureId.SHIFTED, scope=Scope.STEP, evidence=evidence)]


def _outliers(grid: _Grid, samples: int) -> list[SealedSignature]:
    counts = np.bincount(grid.rows, minlength=samples)
    sums = np.bincount(grid.rows, weights=np.abs(grid.d), minlength=samples)
    present = np.nonzero(counts)[0]
    if present.size < OUTLIER_MIN_SAMPLES:
        return []
    means = sums[present] / counts[present]
    order = np.argsort(means, kind="stable")
    ordered = means[order]
    ratios = ordered[1:] / np.maximum(ordered[:-1], _TINY)
    cut = int(np.argmax(ratios))
    if ratios[cut] < OUTLIER_GAP or ordered[cut + 1] < OUTLIER_FLOOR:
        return []
    rest = ordered[: cut + 1]
    rest_median = float(np.median(rest))
    found = []
    for index in sorted(int(i) for i in order[cut + 1 :]):
        row = int(present[index])
        found.append(
            SealedSignature(
                id=SignatureId.SAMPLE_OUTLIERS,
                scope=Scope.SAMPLE,
                sample=row,
                evidence={
                    "mean_abs_diff": float(means[index]),
                    "tokens": int(counts[row]),
                    "rest_median_mean_abs_diff": rest_median,
                    "rest_max_mean_abs_diff": float(rest[-1]),
                    "rest_samples": int(rest.size),
                },
            )
        )
    return found


def _growth(grid: _Grid) -> list[SealedSignature]:
    if grid.d.size < MIN_TOKENS:
        return []
    span = int(grid.positions.max()) + 1
    third = np.minimum(grid.positions * 3 // span, 2)
    magnitude = np.abs(grid.d)
    counts = np.bincount(third, minlength=3)
    if int(counts.min()) < GROWTH_MIN_PER_THIRD:
        return []
    means = np.bincount(third, weights=magnitude, minlength=3) / counts
    early, middle, late = (float(m) for m in means)
    if not (early <= middle <= late and late >= GROWTH_RATIO * early and late >= GROWTH_FLOOR):
        return []
    p = grid.positions.astype(np.float64)
    p_centred = p - p.mean()
    slope = float(
        (p_centred * (magnitude - magnitude.mean())).sum() / (p_centred * p_centred).sum()
    )
    evidence: Evidence = {
        "tokens": int(grid.d.size),
        "positions": span,
        "early_mean_abs_diff": early,
        "middle_mean_abs_diff": middle,
        "late_mean_abs_diff": late,
        "growth_per_1k_tokens": slope * 1000.0,
    }
    return [SealedSignature(id=SignatureId.POSITION_GROWTH, scope=Scope.STEP, evidence=evidence)]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSignature:
    """A run scope signature: computed at read time, never sealed. ``step`` is the step it
    points at (the first of the new level for a jump; None for a trend)."""

    id: SignatureId
    step: int | None
    evidence: Evidence


def run_signatures(figures: Sequence[tuple[int, float]]) -> list[RunSignature]:
    """``step_jump`` or else ``step_trend`` over ``(step, mean |diff|)`` in step order (the
    judged steps of an import)."""
    steps = [s for s, _ in figures]
    values = np.maximum(np.array([v for _, v in figures], dtype=np.float64), _TINY)
    jump = _jump(steps, values)
    if jump is not None:
        return [jump]
    trend = _trend(steps, values)
    return [] if trend is None else [trend]


def _jump(steps: Sequence[int], values: Floats) -> RunSignature | None:
    best: tuple[float, int] | None = None
    for k in range(2, values.size - 1):
        before, after = values[:k], values[k:]
        if before.max() > JUMP_FLATNESS * before.min() or after.max() > JUMP_FLATNESS * after.min():
            continue
        low, high = (before, after) if after.min() > before.max() else (after, before)
        ratio = float(high.min() / low.max())
        if ratio >= JUMP_RATIO and (best is None or ratio > best[0]):
            best = (ratio, k)
    if best is None:
        return None
    ratio, k = best
    evidence: Evidence = {
        "before_mean_abs_diff": float(np.median(values[:k])),
        "after_mean_abs_diff": float(np.median(values[k:])),
        "separation": ratio,
        "steps_before": k,
        "steps_after": int(values.size - k),
    }
    return RunSignature(id=SignatureId.STEP_JUMP, step=int(steps[k]), evidence=evidence)


def _ranks(values: Floats) -> Floats:
    """Average ranks (ties share the mean of their ranks)."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(values.size, dtype=np.float64)
    ranks[order] = np.arange(values.size, dtype=np.float64)
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def _trend(steps: Sequence[int], values: Floats) -> RunSignature | None:
    n = values.size
    if n < TREND_MIN_STEPS:
        return None
    x, y = _ranks(np.array(steps, dtype=np.float64)), _ranks(values)
    x, y = x - x.mean(), y - y.mean()
    denominator = float(np.sqrt((x * x).sum() * (y * y).sum()))
    if denominator <= 0.0:
        return None
    rho = float((x * y).sum()) / denominator
    third = max(n // 3, 1)
    first, last = float(values[:third].mean()), float(values[-third:].mean())
    if rho < TREND_MIN_RHO or last < TREND_RATIO * first:
        return None
    evidence: Evidence = {
        "spearman_rho": rho,
        "first_mean_abs_diff": first,
        "last_mean_abs_diff": last,
        "growth": last / first,
        "first_step": int(steps[0]),
        "last_step": int(steps[-1]),
    }
    return RunSignature(id=SignatureId.STEP_TREND, step=None, evidence=evidence)
