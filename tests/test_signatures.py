"""The drift signatures named on data planted from a real model's logits, and never on honest noise.

Every dataset is made here from ONE forward of the tiny Qwen3 through plain transformers
(module fixture): its logits, scaled to be as peaked as a policy's (mean top-token probability
about 0.76), give the trainer's logprobs of tokens sampled as vLLM samples
(``vllm/v1/sample/sampler.py``: logits / temperature, then ``apply_top_k_top_p_pytorch``'s
ascending-sort top-p mask keeping at least one token), and a planted cause gives the rollout's.
Honest noise is the rollout computed from the logits rounded to bfloat16. Every expected figure
(implied temperature, kept mass, samples, positions) is computed here in float64 from the planted
data, never by the detectors' own code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from pytest_logprob_drift.numerics.signature_record import Scope, SignatureId
from pytest_logprob_drift.numerics.signatures import run_signatures, step_signatures

pytestmark = pytest.mark.slow

SAMPLES, LENGTH = 16, 64
PEAKED = 4.0
"""The factor that makes the tiny model's logits as peaked as a policy's."""


@dataclass(frozen=True)
class Policy:
    """The policy logits ``[SAMPLES, LENGTH, V]`` (float64) and their bf16-rounded copy."""

    logits: Any
    bf16: Any


@pytest.fixture(scope="module")
def policy() -> Policy:
    import torch
    from transformers import AutoModelForCausalLM

    from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint

    path = resolve_checkpoint("tiny://qwen3-h64-v1", expected_digest=None).path
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(56)
    ids = torch.randint(10, model.config.vocab_size, (SAMPLES, LENGTH), generator=generator)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.to(torch.float64) * PEAKED
    return Policy(
        logits=logits.numpy(),
        bf16=logits.to(torch.bfloat16).to(torch.float64).numpy(),
    )


def log_softmax(z: Any) -> Any:
    top = z.max(axis=-1, keepdims=True)
    return z - top - np.log(np.exp(z - top).sum(axis=-1, keepdims=True))


def top_p_logits(z: Any, p: float) -> Any:
    """vLLM's ``apply_top_k_top_p_pytorch`` top-p: sort ascending, mask the tokens whose
    cumulative probability is at most ``1 - p``, keep the largest always."""
    order = np.argsort(z, axis=-1, kind="stable")
    ascending = np.take_along_axis(z, order, axis=-1)
    cumulative = np.cumsum(np.exp(log_softmax(ascending)), axis=-1)
    masked = cumulative <= 1 - p
    masked[..., -1] = False
    ascending = np.where(masked, -np.inf, ascending)
    out = np.empty_like(z)
    np.put_along_axis(out, order, ascending, axis=-1)
    return out


def sample(z: Any, seed: int) -> Any:
    """One token per position from ``softmax(z)`` (Gumbel-max, seeded)."""
    rng = np.random.default_rng(seed)
    return np.argmax(z + rng.gumbel(size=z.shape), axis=-1)


def pick(logprobs: Any, tokens: Any) -> Any:
    return np.take_along_axis(logprobs, tokens[..., None], axis=-1)[..., 0]


def honest(policy: Policy, seed: int) -> tuple[Any, Any]:
    """(training, rollout) of tokens the policy sampled: the rollout in bf16 logits."""
    tokens = sample(policy.logits, seed)
    return pick(log_softmax(policy.logits), tokens), pick(log_softmax(policy.bf16), tokens)


def all_active() -> Any:
    return np.ones((SAMPLES, LENGTH), dtype=bool)


def ids(found: list[Any]) -> list[tuple[SignatureId, int | None]]:
    """Each signature's id and sample, once its report sentence was written."""
    for s in found:
        assert _sentence(s.id, s.scope, 3, s.sample, s.evidence).startswith(f"{s.id.value} (step 3")
    return [(s.id, s.sample) for s in found]


def run_ids(found: list[Any]) -> list[tuple[SignatureId, int | None]]:
    for s in found:
        assert _sentence(s.id, Scope.RUN, s.step, None, s.evidence).startswith(
            f"{s.id.value} (the run): the step's mean |diff| "
        )
    return [(s.id, s.step) for s in found]


def _sentence(kind: Any, scope: Scope, step: int | None, sample: int | None, e: Any) -> str:
    from pytest_logprob_drift.report.signatures import NamedSignature

    named = NamedSignature(
        index=1, id=kind, scope=scope, step=step, sample=sample, case_id="c", label="l", evidence=e
    )
    better = NamedSignature(
        index=1,
        id=kind,
        scope=scope,
        step=step,
        sample=sample,
        case_id="c",
        label="l",
        evidence=e,
        better_seen=True,
    )
    assert better.words() == named.words() + (
        " (the case's semantic offset over the full vocabulary sees the cause better)"
    )
    assert named.to_json()["evidence"] == {
        k: list(v) if isinstance(v, tuple) else v for k, v in e.items()
    }
    return named.words()


def test_honest_bf16_noise_names_nothing(policy: Policy) -> None:
    for seed in range(3):
        training, rollout = honest(policy, seed)
        assert step_signatures(training, rollout, all_active()) == []


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_tempered_names_the_implied_temperature(policy: Policy, temperature: float) -> None:
    tempered = policy.logits / temperature
    tokens = sample(tempered, 7)
    training = pick(log_softmax(policy.logits), tokens)
    rollout = pick(log_softmax(tempered), tokens)  # processed logprobs at T
    found = step_signatures(training, rollout, all_active())
    assert ids(found) == [(SignatureId.TEMPERED, None)]
    assert found[0].scope is Scope.STEP
    implied = float(found[0].evidence["implied_temperature"])
    assert abs(implied - temperature) <= 0.05 * temperature, implied


@pytest.mark.parametrize("rounded", [False, True], ids=["exact", "bf16-rollout"])
def test_truncated_sampling_names_the_kept_mass(policy: Policy, rounded: bool) -> None:
    """top-p 0.8 as vLLM applies it, the rollout's processed logprobs renormalised over the
    kept tokens (of the bf16-rounded logits too: the noise then goes both ways)."""
    engine = policy.bf16 if rounded else policy.logits
    kept_logits = top_p_logits(engine, 0.8)
    tokens = sample(kept_logits, 8)
    full = log_softmax(policy.logits)
    training = pick(full, tokens)
    rollout = pick(log_softmax(kept_logits), tokens)
    found = step_signatures(training, rollout, all_active())
    assert ids(found) == [(SignatureId.TRUNCATED_SAMPLING, None)]
    kept = float(found[0].evidence["kept_mass"])
    assert kept == pytest.approx(np.exp(training - rollout).mean(), rel=1e-12)
    if not rounded:  # the mean ratio is the mean kept mass of the positions (trl#7269)
        mass = np.where(np.isfinite(kept_logits), np.exp(full), 0.0).sum(axis=-1)
        assert kept == pytest.approx(mass.mean(), rel=1e-9)
    assert 0.8 <= kept < 0.99


def test_shifted_names_the_offset(policy: Policy) -> None:
    training, rollout = honest(policy, 9)
    shifted = rollout.copy()
    shifted[:, :-1] = rollout[:, 1:]  # rollout[t] holds the score of token t + 1
    found = step_signatures(training, shifted, all_active())
    assert ids(found) == [(SignatureId.SHIFTED, None)]
    assert found[0].evidence["offset"] == 1
    assert found[0].evidence["samples"] == tuple(range(SAMPLES))


def test_zero_filled_names_the_tool_spans(policy: Policy) -> None:
    training, rollout = honest(policy, 10)
    tool = sample(np.zeros_like(policy.logits), 11)  # tool output: not the policy's tokens
    spans = {2: range(10, 18), 5: range(30, 36)}
    full = log_softmax(policy.logits)
    for row, span in spans.items():
        for t in span:
            training[row, t] = full[row, t, tool[row, t]]
            rollout[row, t] = 0.0
    found = step_signatures(training, rollout, all_active())
    assert ids(found) == [(SignatureId.ZERO_FILLED, 2), (SignatureId.ZERO_FILLED, 5)]
    for signature in found:
        row = signature.sample
        assert row is not None
        far = [t for t in spans[row] if training[row, t] <= -0.5]
        assert signature.evidence["positions"] == tuple(far)
        assert signature.evidence["tokens"] == len(far)
        assert float(signature.evidence["training_logprob_sum"]) == pytest.approx(
            sum(training[row, t] for t in far), rel=1e-12
        )


def test_sample_outliers_names_exactly_the_outlying_samples(policy: Policy) -> None:
    training, rollout = honest(policy, 12)
    rng = np.random.default_rng(13)
    broken = policy.logits + rng.normal(scale=1.0, size=policy.logits.shape)
    tokens = sample(policy.logits, 12)
    for row in (3, 11):
        rollout[row] = pick(log_softmax(broken[row]), tokens[row])
    found = step_signatures(training, rollout, all_active())
    assert ids(found) == [(SignatureId.SAMPLE_OUTLIERS, 3), (SignatureId.SAMPLE_OUTLIERS, 11)]
    means = np.abs(rollout - training).mean(axis=1)
    for signature in found:
        assert signature.scope is Scope.SAMPLE
        assert float(signature.evidence["mean_abs_diff"]) == pytest.approx(
            means[signature.sample], rel=1e-12
        )


def test_position_growth_names_the_growth(policy: Policy) -> None:
    tokens = sample(policy.logits, 14)
    rng = np.random.default_rng(15)
    scale = 0.004 * np.arange(LENGTH, dtype=np.float64)[None, :, None]
    drifting = policy.logits + rng.normal(size=policy.logits.shape) * scale
    training = pick(log_softmax(policy.logits), tokens)
    rollout = pick(log_softmax(drifting), tokens)
    found = step_signatures(training, rollout, all_active())
    assert ids(found) == [(SignatureId.POSITION_GROWTH, None)]
    magnitude = np.abs(rollout - training)
    thirds = [magnitude[:, p].mean() for p in (slice(0, 22), slice(22, 43), slice(43, None))]
    evidence = found[0].evidence
    assert float(evidence["early_mean_abs_diff"]) == pytest.approx(thirds[0], rel=1e-12)
    assert float(evidence["late_mean_abs_diff"]) == pytest.approx(thirds[2], rel=1e-12)
    assert float(evidence["growth_per_1k_tokens"]) > 0


def _step_figures(policy: Policy, noise: list[float]) -> list[tuple[int, float]]:
    """Each step's mean |diff| of a rollout whose logits carry Gaussian noise of the step's
    scale (on top of bf16 rounding), steps numbered from 1."""
    figures = []
    for step, scale in enumerate(noise, start=1):
        rng = np.random.default_rng(100 + step)
        tokens = sample(policy.logits, 200 + step)
        rollout_logits = policy.bf16 + rng.normal(size=policy.logits.shape) * scale
        d = pick(log_softmax(rollout_logits), tokens) - pick(log_softmax(policy.logits), tokens)
        figures.append((step, float(np.abs(d).mean())))
    return figures


def test_step_jump_names_the_step_exactly(policy: Policy) -> None:
    figures = _step_figures(policy, [0.0] * 6 + [0.2] * 5)
    found = run_signatures(figures)
    assert run_ids(found) == [(SignatureId.STEP_JUMP, 7)]
    before = np.median([v for s, v in figures if s < 7])
    assert float(found[0].evidence["before_mean_abs_diff"]) == pytest.approx(before, rel=1e-12)


def test_step_jump_down_after_a_fix(policy: Policy) -> None:
    found = run_signatures(_step_figures(policy, [0.2] * 4 + [0.0] * 4))
    assert run_ids(found) == [(SignatureId.STEP_JUMP, 5)]


def test_step_trend_names_the_growth(policy: Policy) -> None:
    figures = _step_figures(policy, [0.01 * k for k in range(12)])
    found = run_signatures(figures)
    assert run_ids(found) == [(SignatureId.STEP_TREND, None)]
    values = [v for _, v in figures]
    assert float(found[0].evidence["last_mean_abs_diff"]) == pytest.approx(
        np.mean(values[-4:]), rel=1e-12
    )


def test_honest_steps_name_nothing(policy: Policy) -> None:
    assert run_signatures(_step_figures(policy, [0.0] * 8)) == []
    assert run_signatures(_step_figures(policy, [0.05] * 8)) == []
