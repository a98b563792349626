"""The bars RL frameworks gate a run on, applied to a case's two sides' logprobs.

Owns ``GATES`` (each framework's figure, the formula it computes, its bar, whether a value on
the bar passes, and the file and commit it was read from) and ``gate_results``, which computes
every gate's figure as that framework does from ``(training [B, T], rollout [B, T], active
[B, T] bool)`` (what ``token_diffs.pt`` holds; rows are samples) in float64 and says whether
it passes. A gate is never a verdict: the contract's rule on the active tokens is the only
one; a gate says what a framework's own check would have said of the same tokens. Torch is
imported where the figures are computed, so the table is read without it. Knows nothing about
files, the store or how a gate is shown.

Where a framework's figure needs what a grid does not hold, the grid's rows stand in for it
and the gate says so (``Gate.assumes``): slime's and miles' per-sample means divide each
sample by its own loss-mask total (slime's ``rollout_mask_sums`` are not sealed; an imported
slime step's own figure, ``numerics.framework_figures``, is used when recorded) and count
every row as one sample of one training step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from pytest_logprob_drift.records import JsonObject

if TYPE_CHECKING:
    import torch


class Passes(Enum):
    """How a figure is held to its bar."""

    AT_MOST = "<="
    BELOW = "<"
    AT_LEAST = ">="
    ABS_AT_MOST = "|x| <="


@dataclass(frozen=True, slots=True, kw_only=True)
class Gate:
    key: str
    framework: str
    figure: str
    """The figure as the framework logs it."""
    formula: str
    passes: Passes
    bar: float
    advisory: bool
    """A warning the framework prints (verl), not a check that fails its run."""
    source: str
    """``owner/repo path@commit`` the formula and the bar were read from."""
    assumes: str = ""


GATES: tuple[Gate, ...] = (
    Gate(
        key="slime_ci",
        framework="slime",
        figure="train/train_rollout_logprob_abs_diff",
        formula=(
            "sum_i sum_t |log_probs - rollout_log_probs| * loss_mask / max(sum_t loss_mask, 1), "
            "divided by the step's samples (sum_of_sample_mean, reduced over the global batch)"
        ),
        passes=Passes.AT_MOST,
        bar=0.1,
        advisory=False,
        source=(
            "THUDM/slime slime/backends/megatron_utils/model.py (--ci-test asserts the figure "
            "<= --ci-train-rollout-logprob-abs-diff-threshold, default 0.1)"
            "@00b5ed0e6c1167e87804ac1c151787575d692354"
        ),
        assumes="each row its own rollout's sample, the step one training step",
    ),
    Gate(
        key="miles_ci",
        framework="miles",
        figure="|rollout/log_probs - rollout/rollout_log_probs|",
        formula=(
            "math.isclose(S(log_probs), S(rollout_log_probs), abs_tol=0.03), S(x) = sum_i "
            "sum_t x * loss_mask / max(sum_t loss_mask, 1) / samples (log_rollout_data's "
            "sum_of_sample_mean over the rollout)"
        ),
        passes=Passes.AT_MOST,
        bar=0.03,
        advisory=False,
        source=(
            "radixark/miles miles/backends/training_utils/log_utils.py log_rollout_data "
            "(--ci-test; every rollout)@31f1ca961a94cb860cec3b2dea34ec332bfa8f76"
        ),
        assumes="each row one sample, divided by its own loss-mask total",
    ),
    Gate(
        key="nemo_rl_token_mult_prob_error",
        framework="NeMo-RL",
        figure="train/token_mult_prob_error",
        formula=(
            "sum_t exp(|generation_logprobs - prev_logprobs| * mask) * mask / sum_t mask over "
            "the step's tokens"
        ),
        passes=Passes.BELOW,
        bar=1.05,
        advisory=False,
        source=(
            "NVIDIA-NeMo/RL nemo_rl/algorithms/loss/loss_functions.py (the figure), "
            "tests/functional/grpo_megatron.sh (max over steps < 1.05)"
            "@7ea279abfbeb698b092856d0dab61e7cf39bc909"
        ),
    ),
    Gate(
        key="prime_rl_mismatch_kl",
        framework="prime-rl",
        figure="mismatch_kl/all/mean",
        formula=(
            "mean over loss-mask tokens of exp(r) - r - 1, r = trainer_logprobs - "
            "inference_logprobs"
        ),
        passes=Passes.BELOW,
        bar=0.015,
        advisory=False,
        source=(
            "PrimeIntellect-ai/prime-rl src/prime_rl/trainer/rl/loss.py (the figure), "
            "docs/development.md (a new model's merge bar: every step below 0.015)"
            "@559b44772e471d1538537b8805cc77f3824a5e64"
        ),
    ),
    Gate(
        key="verl_ess",
        framework="verl",
        figure="rollout_corr/rollout_is_eff_sample_size",
        formula=(
            "1 / mean((w / (mean w + 1e-8))^2) over response tokens, w = exp(old_log_prob - "
            "rollout_log_prob) clamped to [0.5, 2.0] (rollout_is_threshold 2.0 and its "
            "reciprocal)"
        ),
        passes=Passes.AT_LEAST,
        bar=0.3,
        advisory=True,
        source=(
            "volcengine/verl verl/trainer/ppo/rollout_corr_helper.py (the figure), "
            "docs/algo/rollout_corr.md check_rollout_correction_health (warns below 0.3)"
            "@b178a3cd56f58b2d502255daba591e92833930a7"
        ),
    ),
    Gate(
        key="verl_kl",
        framework="verl",
        figure="rollout_corr/kl",
        formula="mean over response tokens of rollout_log_prob - old_log_prob",
        passes=Passes.ABS_AT_MOST,
        bar=0.1,
        advisory=True,
        source=(
            "volcengine/verl verl/trainer/ppo/rollout_corr_helper.py (the figure), "
            "docs/algo/rollout_corr.md check_rollout_correction_health (warns above 0.1)"
            "@b178a3cd56f58b2d502255daba591e92833930a7"
        ),
    ),
)
GATE_BY_KEY = {g.key: g for g in GATES}


@dataclass(frozen=True, slots=True, kw_only=True)
class GateResult:
    """One gate's figure for a case (None: past float64, which fails every bar) and whether
    it passes."""

    key: str
    value: float | None
    passed: bool

    @property
    def gate(self) -> Gate:
        return GATE_BY_KEY[self.key]

    def to_json(self) -> JsonObject:
        return {"gate": self.key, "value": self.value, "passed": self.passed}


def holds(passes: Passes, value: float, bar: float) -> bool:
    """Whether ``value`` passes ``bar`` (a non-finite value passes none)."""
    if not math.isfinite(value):
        return False
    if passes is Passes.AT_MOST:
        return value <= bar
    if passes is Passes.BELOW:
        return value < bar
    if passes is Passes.AT_LEAST:
        return value >= bar
    return abs(value) <= bar


def _result(key: str, value: float, passed: bool | None = None) -> GateResult:
    gate = GATE_BY_KEY[key]
    return GateResult(
        key=key,
        value=value if math.isfinite(value) else None,
        passed=holds(gate.passes, value, gate.bar) if passed is None else passed,
    )


def gate_results(
    training: torch.Tensor,
    rollout: torch.Tensor,
    active: torch.Tensor,
    *,
    slime_figure: float | None = None,
) -> tuple[GateResult, ...]:
    """Every gate of ``GATES`` for one judged case (finite scores on at least one active
    token); ``slime_figure``: slime's own figure of an imported slime step, used in place of
    the grid's."""
    import torch

    rows = active.shape[0]
    where = active.reshape(-1).nonzero().squeeze(1)  # the active tokens, row by row
    t = training.reshape(-1).index_select(0, where).to(torch.float64)
    r = rollout.reshape(-1).index_select(0, where).to(torch.float64)
    ratio = t - r
    tokens = ratio.numel()
    counts = active.sum(dim=1)
    row_sums = torch.segment_reduce(
        torch.stack((ratio.abs(), t, r), dim=1), "sum", lengths=counts, axis=0
    )
    per_sample = (row_sums / counts.clamp(min=1).unsqueeze(1)).sum(dim=0) / max(rows, 1)
    slime = float(per_sample[0]) if slime_figure is None else slime_figure
    miles_t, miles_r = float(per_sample[1]), float(per_sample[2])
    miles = abs(miles_t - miles_r)
    weight = torch.exp(ratio)
    mult = float(torch.where(ratio >= 0, weight, 1.0 / weight).sum()) / tokens
    kl = float((weight - ratio - 1.0).sum()) / tokens
    clamped = weight.clamp(min=0.5, max=2.0)
    normalized = clamped / (float(clamped.sum()) / tokens + 1e-8)
    ess = 1.0 / (float((normalized * normalized).sum()) / tokens)
    verl_kl = float(-ratio.sum()) / tokens
    return (
        _result("slime_ci", slime),
        _result(
            "miles_ci",
            miles,
            math.isfinite(miles) and math.isclose(miles_t, miles_r, abs_tol=0.03),
        ),
        _result("nemo_rl_token_mult_prob_error", mult),
        _result("prime_rl_mismatch_kl", kl),
        _result("verl_ess", ess),
        _result("verl_kl", verl_kl),
    )


def failing(results: tuple[GateResult, ...]) -> tuple[GateResult, ...]:
    """The gates ``results`` fail."""
    return tuple(r for r in results if not r.passed)
