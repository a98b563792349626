"""Each framework's gate figure, written from its source in plain Python float64 loops over
samples and tokens (test support): the independent computation ``numerics.gates`` is held to.
Arguments are ``[B, T]`` arrays (rows are samples) and the active mask; ``pairs`` are the
``(training, rollout)`` values of the active tokens."""

from __future__ import annotations

import math


def slime(training, rollout, active) -> float:
    """slime's sum_of_sample_mean(|old_log_probs - rollout_log_probs|) over the step's
    samples, each divided by max(its loss-mask total, 1), then by the global batch size."""
    total = 0.0
    for t_row, r_row, m_row in zip(training, rollout, active, strict=True):
        s = sum(abs(float(t) - float(r)) for t, r, m in zip(t_row, r_row, m_row, strict=True) if m)
        total += s / max(int(m_row.sum()), 1)
    return total / len(active)


def miles_sides(training, rollout, active) -> tuple[float, float]:
    """miles' rollout/log_probs and rollout/rollout_log_probs: each side's
    sum_of_sample_mean over the samples divided by their count (gather_log_data's sum/count)."""
    sides = []
    for side in (training, rollout):
        total = 0.0
        for row, m_row in zip(side, active, strict=True):
            total += sum(float(v) for v, m in zip(row, m_row, strict=True) if m) / max(
                int(m_row.sum()), 1
            )
        sides.append(total / len(active))
    return sides[0], sides[1]


def token_mean(values) -> float:
    return math.fsum(values) / len(values)


def pairs_of(training, rollout, active):
    return [
        (float(t), float(r))
        for t_row, r_row, m_row in zip(training, rollout, active, strict=True)
        for t, r, m in zip(t_row, r_row, m_row, strict=True)
        if m
    ]


def nemo(pairs) -> float:
    """NeMo-RL's masked_mean(exp(|generation - prev| * mask), mask)."""
    return token_mean([math.exp(abs(r - t)) for t, r in pairs])


def prime(pairs) -> float:
    """prime-rl's mismatch_kl mean: exp(log_ratio) - log_ratio - 1, log_ratio = trainer -
    inference."""
    return token_mean([math.exp(t - r) - (t - r) - 1 for t, r in pairs])


def verl_ess(pairs) -> float:
    """verl's rollout_is_eff_sample_size: weights clamped to [0.5, 2], normalized by their
    mean + 1e-8, 1 / mean of the squares."""
    w = [min(max(math.exp(t - r), 0.5), 2.0) for t, r in pairs]
    mean = token_mean(w)
    return 1.0 / token_mean([(x / (mean + 1e-8)) ** 2 for x in w])


def verl_kl(pairs) -> float:
    """verl's rollout_corr/kl: masked_mean(rollout_log_prob - old_log_prob)."""
    return token_mean([r - t for t, r in pairs])
