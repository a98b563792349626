"""Comparator: every outcome, identity fields, the exact threshold boundary, offline recomputation.

The pass/fail rule is the contract's, evaluated in float64; these tests pin it at the boundary
with float32 neighbours found by ``nextafter``, check it against an independent numpy evaluation
(hypothesis), recompute the mask from a ``weights_only`` round trip, and show that diagnostics
are present but never decide the outcome.
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_logprob_drift.config.contract import resolve_contract
from pytest_logprob_drift.numerics import verdict as comparison_module
from pytest_logprob_drift.numerics.verdict import (
    IDENTITY_TENSORS,
    identity_violations,
    judge,
    mismatch_mask,
)
from pytest_logprob_drift.outcomes import Outcome

THRESHOLD = resolve_contract("ws1", "current").threshold
SETTINGS = settings(suppress_health_check=[HealthCheck.too_slow])

DIAGNOSTIC_KEYS = {
    "mean_abs_diff",
    "p50_abs_diff",
    "p90_abs_diff",
    "p99_abs_diff",
    "max_abs_diff",
    "mismatch_ratio",
    "approx_kl_k1",
    "approx_kl_k3",
    "slime_mean_abs_logprob_diff",
    "nemo_rl_token_mult_prob_error",
    "verl_rollout_probs_diff_max",
}


def test_threshold_is_the_contract_value() -> None:
    assert THRESHOLD == 1e-3


def _scores(values: list[list[float]], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def _all_active(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.ones(shape, dtype=torch.bool)


# --- outcomes -------------------------------------------------------------------------------


def test_pass() -> None:
    rollout = _scores([[-1.0, -2.0, -0.5], [-3.0, -0.1, -4.0]])
    training = rollout + 1e-5
    verdict = judge(training, rollout, _all_active((2, 3)), THRESHOLD)
    assert verdict.outcome is Outcome.PASS
    assert verdict.active_tokens == 6
    assert verdict.mismatches == 0
    assert verdict.identity_violations == ()
    assert "within" in verdict.reason


def test_mismatch_names_count_and_worst_token() -> None:
    rollout = _scores([[-1.0, -2.0, -0.5], [-3.0, -0.1, -4.0]])
    training = rollout.clone()
    training[1, 2] += 0.25
    training[0, 1] -= 0.002
    verdict = judge(training, rollout, _all_active((2, 3)), THRESHOLD)
    assert verdict.outcome is Outcome.MISMATCH
    assert verdict.mismatches == 2
    assert verdict.active_tokens == 6
    assert "2/6" in verdict.reason
    worst = verdict.worst_tokens[0]
    assert (worst["sample"], worst["position"]) == (1, 2)
    assert worst["abs_diff"] == pytest.approx(0.25, rel=1e-6)
    assert "sample 1 position 2" in verdict.reason


def test_only_active_tokens_count() -> None:
    rollout = _scores([[-1.0, -2.0, -0.5]])
    training = rollout.clone()
    training[0, 0] += 5.0  # a huge difference on an inactive (prompt) token
    training[0, 2] = float("nan")  # even a NaN, when inactive
    active = torch.tensor([[False, True, False]])
    verdict = judge(training, rollout, active, THRESHOLD)
    assert verdict.outcome is Outcome.PASS
    assert verdict.active_tokens == 1


def test_zero_active_tokens_is_never_a_pass() -> None:
    rollout = _scores([[-1.0, -2.0]])
    training = rollout + 3.0
    verdict = judge(training, rollout, torch.zeros((1, 2), dtype=torch.bool), THRESHOLD)
    assert verdict.outcome is Outcome.ZERO_ACTIVE_TOKENS
    assert verdict.active_tokens == 0
    assert verdict.mismatches == 0


def test_zero_active_tokens_with_empty_tensors() -> None:
    empty = torch.zeros((0, 0), dtype=torch.float32)
    verdict = judge(empty, empty, torch.zeros((0, 0), dtype=torch.bool), THRESHOLD)
    assert verdict.outcome is Outcome.ZERO_ACTIVE_TOKENS


@pytest.mark.parametrize("side", ["training", "rollout"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_active_score_is_invalid_artifact(side: str, bad: float) -> None:
    rollout = _scores([[-1.0, -2.0, -0.5]])
    training = rollout.clone()
    target = training if side == "training" else rollout
    target[0, 1] = bad
    verdict = judge(training, rollout, _all_active((1, 3)), THRESHOLD)
    assert verdict.outcome is Outcome.INVALID_ARTIFACT
    assert side in verdict.reason
    assert "non-finite" in verdict.reason
    assert "[0, 1]" in verdict.reason


@pytest.mark.parametrize("side", ["training", "rollout"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_non_floating_scores_are_invalid_artifact(side: str, dtype: torch.dtype) -> None:
    floats = _scores([[-1.0, -2.0]])
    ints = floats.to(dtype)
    training, rollout = (ints, floats) if side == "training" else (floats, ints)
    verdict = judge(training, rollout, _all_active((1, 2)), THRESHOLD)
    assert verdict.outcome is Outcome.INVALID_ARTIFACT
    assert side in verdict.reason
    assert "non-floating" in verdict.reason


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.float32])
def test_non_bool_active_mask_is_invalid_artifact(dtype: torch.dtype) -> None:
    rollout = _scores([[-1.0, -2.0]])
    verdict = judge(rollout.clone(), rollout, torch.ones((1, 2), dtype=dtype), THRESHOLD)
    assert verdict.outcome is Outcome.INVALID_ARTIFACT
    assert "active_mask" in verdict.reason
    assert "bool" in verdict.reason


def test_shape_disagreement_is_invalid_artifact() -> None:
    verdict = judge(
        _scores([[-1.0, -2.0]]), _scores([[-1.0, -2.0, -3.0]]), _all_active((1, 3)), THRESHOLD
    )
    assert verdict.outcome is Outcome.INVALID_ARTIFACT
    assert "shapes differ" in verdict.reason


def test_invalid_artifact_precedes_a_numerical_mismatch() -> None:
    rollout = _scores([[-1.0, -2.0, -0.5]])
    training = rollout + 1.0
    training[0, 2] = float("nan")
    verdict = judge(training, rollout, _all_active((1, 3)), THRESHOLD)
    assert verdict.outcome is Outcome.INVALID_ARTIFACT


# --- identity -------------------------------------------------------------------------------

EXPECTED_IDENTITY: dict[str, Any] = {
    "checkpoint_uri": "synthetic://cpu-smoke/v1",
    "model_version": "synthetic-v1",
    "checkpoint_digest": "ab" * 32,
    "tokenizer_id": "synthetic-ids",
    "packing": "padded",
    "positions": "from_attention_mask",
}


def _tensors() -> dict[str, torch.Tensor]:
    token_ids = torch.tensor([[1, 5, 9, 7, 0], [3, 3, 2, 0, 0]])
    attention = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    active = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]], dtype=torch.bool)
    positions = torch.tensor([[0, 1, 2, 3, 4], [0, 1, 2, 0, 0]])
    return {
        "token_ids": token_ids,
        "attention_mask": attention,
        "active_mask": active,
        "position_ids": positions,
    }


def _violations(
    *,
    rollout_identity: dict[str, Any] | None = None,
    training_identity: dict[str, Any] | None = None,
    rollout_tensors: dict[str, torch.Tensor] | None = None,
    consumed: dict[str, torch.Tensor] | None = None,
    readonly: tuple[str, ...] = (),
) -> list[str]:
    return identity_violations(
        EXPECTED_IDENTITY,
        rollout_identity if rollout_identity is not None else dict(EXPECTED_IDENTITY),
        training_identity if training_identity is not None else dict(EXPECTED_IDENTITY),
        rollout_tensors if rollout_tensors is not None else _tensors(),
        consumed if consumed is not None else _tensors(),
        readonly,
    )


def test_identical_inputs_have_no_violations() -> None:
    assert _violations() == []


@pytest.mark.parametrize("side", ["rollout", "training"])
@pytest.mark.parametrize("field", sorted(EXPECTED_IDENTITY))
def test_each_identity_field_is_named(field: str, side: str) -> None:
    changed = {**EXPECTED_IDENTITY, field: "something-else"}
    if side == "rollout":
        problems = _violations(rollout_identity=changed)
    else:
        problems = _violations(training_identity=changed)
    assert len(problems) == 1
    assert problems[0].startswith(f"{field}: {side} used 'something-else'")
    verdict = judge(
        _scores([[-1.0]]),
        _scores([[-1.0]]),
        _all_active((1, 1)),
        THRESHOLD,
        violations=tuple(problems),
    )
    assert verdict.outcome is Outcome.INVALID_IDENTITY
    assert verdict.reason.startswith(field)
    assert verdict.identity_violations == tuple(problems)


def test_side_only_identity_fields_must_agree_between_sides() -> None:
    """Fields the frozen identity does not fix (e.g. cache or mask policy) must still match."""
    rollout = {**EXPECTED_IDENTITY, "kv_cache_policy": "forbidden"}
    training = {**EXPECTED_IDENTITY, "kv_cache_policy": "allowed"}
    problems = _violations(rollout_identity=rollout, training_identity=training)
    assert problems == ["kv_cache_policy: rollout 'forbidden' != training 'allowed'"]
    missing = _violations(rollout_identity=rollout)
    assert missing and missing[0].startswith("kv_cache_policy")


@pytest.mark.parametrize("name", IDENTITY_TENSORS)
def test_each_identity_tensor_is_named_when_it_differs(name: str) -> None:
    consumed = _tensors()
    flat = consumed[name].view(-1)
    flat[3] = ~flat[3] if flat.dtype == torch.bool else flat[3] + 1
    problems = _violations(consumed=consumed)
    assert len(problems) == 1
    assert problems[0].startswith(f"{name}: differs between rollout and training at [0, 3]")


@pytest.mark.parametrize("name", IDENTITY_TENSORS)
def test_each_identity_tensor_is_named_when_missing_or_reshaped(name: str) -> None:
    consumed = _tensors()
    del consumed[name]
    assert _violations(consumed=consumed) == [f"{name}: missing on the training side"]
    rollout = _tensors()
    del rollout[name]
    assert _violations(rollout_tensors=rollout) == [f"{name}: missing on the rollout side"]
    reshaped = _tensors()
    reshaped[name] = reshaped[name][:, :4]
    problems = _violations(consumed=reshaped)
    assert problems == [f"{name}: shape (2, 5) (rollout) != (2, 4) (training)"]


def test_read_only_violations_are_identity_violations() -> None:
    problems = _violations(readonly=("parameters/buffers changed during scoring: param:head",))
    assert problems == ["read-only scorer: parameters/buffers changed during scoring: param:head"]


def test_identity_wins_over_every_numerical_outcome() -> None:
    problems = ("token_ids: differs between rollout and training at [0, 3]",)
    rollout = _scores([[-1.0, -2.0]])
    for training, active in (
        (rollout + 1.0, _all_active((1, 2))),  # mismatch
        (rollout.clone(), torch.zeros((1, 2), dtype=torch.bool)),  # zero
        (rollout.to(torch.int64), _all_active((1, 2))),  # artifact
        (rollout + float("nan"), _all_active((1, 2))),
    ):
        verdict = judge(training, rollout, active, THRESHOLD, violations=problems)
        assert verdict.outcome is Outcome.INVALID_IDENTITY
        assert verdict.reason == problems[0]


# --- the threshold boundary -----------------------------------------------------------------


def _f64_diff(training: np.float32, rollout: np.float32) -> float:
    return float(np.float64(training) - np.float64(rollout))


def _boundary_neighbours(rollout: float) -> tuple[np.float32, np.float32]:
    """The float32 training values whose float64 distance above ``rollout`` is closest to the
    threshold from below-or-equal and from strictly above."""
    r32 = np.float32(rollout)
    start = np.float32(np.float64(r32) + THRESHOLD)
    candidates = [start]
    low = high = start
    for _ in range(8):
        low = np.nextafter(low, np.float32(-np.inf))
        high = np.nextafter(high, np.float32(np.inf))
        candidates += [low, high]
    below = max(
        (c for c in candidates if _f64_diff(c, r32) <= THRESHOLD), key=lambda c: _f64_diff(c, r32)
    )
    above = min(
        (c for c in candidates if _f64_diff(c, r32) > THRESHOLD), key=lambda c: _f64_diff(c, r32)
    )
    assert np.nextafter(below, np.float32(np.inf)) == above  # adjacent float32 values
    return below, above


@pytest.mark.parametrize("rollout", [0.0, -0.5, -1.0, -2.5, -7.25, -13.0, -31.5])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_float32_neighbours_of_the_threshold(rollout: float, sign: float) -> None:
    """Adjacent float32 values straddling ``rollout + threshold`` land on either side."""
    below, above = _boundary_neighbours(rollout)
    r32 = np.float32(rollout)

    # mirror for training below rollout: same magnitudes of difference
    def pair(t: np.float32) -> tuple[torch.Tensor, torch.Tensor]:
        if sign > 0:
            return torch.tensor([[float(t)]]), torch.tensor([[float(r32)]])
        return torch.tensor([[float(r32)]]), torch.tensor([[float(t)]])

    training, roll = pair(below)
    assert training.dtype == torch.float32
    verdict = judge(training, roll, _all_active((1, 1)), THRESHOLD)
    assert verdict.outcome is Outcome.PASS, _f64_diff(below, r32)
    training, roll = pair(above)
    verdict = judge(training, roll, _all_active((1, 1)), THRESHOLD)
    assert verdict.outcome is Outcome.MISMATCH, _f64_diff(above, r32)
    assert verdict.mismatches == 1


def test_float32_rounding_of_the_comparison_cannot_flip_the_verdict() -> None:
    """float32(1e-3) is above 1e-3; comparing in float32 would call it equal (a pass)."""
    training = torch.tensor([[np.float32(THRESHOLD)]], dtype=torch.float32)
    rollout = torch.zeros((1, 1), dtype=torch.float32)
    assert float(np.float64(np.float32(THRESHOLD))) > THRESHOLD
    naive = torch.abs(training - rollout) > THRESHOLD  # evaluated in float32
    assert not bool(naive.any())
    verdict = judge(training, rollout, _all_active((1, 1)), THRESHOLD)
    assert verdict.outcome is Outcome.MISMATCH


def _exact_float64_pairs() -> list[tuple[float, float]]:
    pairs = []
    for rollout in [0.0, -(2.0**-10), -(2.0**-11), -0.001, -0.002, -1e-4, -3e-4, -0.0375]:
        for training in (rollout + THRESHOLD, rollout - THRESHOLD):
            if abs(training - rollout) == THRESHOLD:
                pairs.append((training, rollout))
    return pairs


def test_difference_exactly_equal_to_the_threshold_is_not_a_mismatch() -> None:
    pairs = _exact_float64_pairs()
    assert len(pairs) >= 4
    training = torch.tensor([[t for t, _ in pairs]], dtype=torch.float64)
    rollout = torch.tensor([[r for _, r in pairs]], dtype=torch.float64)
    assert bool((torch.abs(training - rollout) == THRESHOLD).all())
    verdict = judge(training, rollout, _all_active(tuple(training.shape)), THRESHOLD)
    assert verdict.outcome is Outcome.PASS
    assert verdict.mismatches == 0
    bumped = training.clone()
    bumped[0, 0] = np.nextafter(
        bumped[0, 0].item(), math.inf if pairs[0][0] > pairs[0][1] else -math.inf
    )
    assert (
        judge(bumped, rollout, _all_active(tuple(training.shape)), THRESHOLD).outcome
        is Outcome.MISMATCH
    )


# --- property tests: offline recomputation, the contract formula ----------------------------


@st.composite
def scored_batches(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    batch = draw(st.integers(1, 4))
    length = draw(st.integers(1, 12))
    n = batch * length
    rollout = np.array(
        draw(st.lists(st.floats(-30.0, 0.0, width=32), min_size=n, max_size=n)), dtype=np.float32
    )
    kinds = draw(
        st.lists(st.sampled_from(["near", "random", "same", "far"]), min_size=n, max_size=n)
    )
    training = np.empty(n, dtype=np.float32)
    for i, kind in enumerate(kinds):
        r = rollout[i]
        sign = draw(st.sampled_from([1.0, -1.0]))
        if kind == "near":  # within a few float32 ulps of r +- threshold
            t = np.float32(np.float64(r) + sign * THRESHOLD)
            for _ in range(draw(st.integers(0, 3))):
                t = np.nextafter(t, np.float32(draw(st.sampled_from([np.inf, -np.inf]))))
        elif kind == "random":
            t = np.float32(r + sign * draw(st.floats(0.0, 3 * THRESHOLD)))
        elif kind == "same":
            t = r
        else:
            t = np.float32(r + sign * draw(st.floats(0.01, 5.0)))
        training[i] = t
    active = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    shape = (batch, length)
    return training.reshape(shape), rollout.reshape(shape), active.reshape(shape)


@SETTINGS
@given(scored_batches())
def test_offline_mask_equals_runtime_mask_and_the_contract_formula(
    data: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    training_np, rollout_np, active_np = data
    training = torch.from_numpy(training_np.copy())
    rollout = torch.from_numpy(rollout_np.copy())
    active = torch.from_numpy(active_np.copy())
    runtime_mask = mismatch_mask(training, rollout, active, THRESHOLD)

    # the contract formula, evaluated independently in float64 with numpy
    formula = active_np & (
        np.abs(training_np.astype(np.float64) - rollout_np.astype(np.float64)) > THRESHOLD
    )
    assert np.array_equal(runtime_mask.numpy(), formula)

    # offline: exactly what token_diffs.pt holds, through a weights_only round trip
    buffer = io.BytesIO()
    torch.save(
        {
            "training_logprobs": training,
            "rollout_logprobs": rollout,
            "active_mask": active,
            "threshold": torch.tensor(THRESHOLD, dtype=torch.float64),
        },
        buffer,
    )
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    offline_threshold = float(loaded["threshold"].item())
    assert offline_threshold == THRESHOLD
    offline_mask = mismatch_mask(
        loaded["training_logprobs"],
        loaded["rollout_logprobs"],
        loaded["active_mask"],
        offline_threshold,
    )
    assert torch.equal(offline_mask, runtime_mask)

    verdict = judge(training, rollout, active, THRESHOLD)
    offline = judge(
        loaded["training_logprobs"],
        loaded["rollout_logprobs"],
        loaded["active_mask"],
        offline_threshold,
    )
    assert offline.to_json() == verdict.to_json()
    active_count = int(active_np.sum())
    if active_count == 0:
        assert verdict.outcome is Outcome.ZERO_ACTIVE_TOKENS
    else:
        assert verdict.mismatches == int(formula.sum())
        assert verdict.active_tokens == active_count
        assert verdict.outcome is (Outcome.MISMATCH if formula.any() else Outcome.PASS)


# --- diagnostics ----------------------------------------------------------------------------


def test_diagnostics_are_present_and_correct() -> None:
    rollout = np.array([[-1.0, -2.0, -0.5, -4.0], [-0.2, -3.0, -1.5, -9.0]], dtype=np.float32)
    delta = np.array([[0.0, 2e-4, -5e-4, 0.03], [1e-6, -0.2, 0.0, 7.0]], dtype=np.float32)
    training = (rollout + delta).astype(np.float32)
    active = np.array([[True, True, True, True], [True, True, True, False]])
    verdict = judge(
        torch.from_numpy(training), torch.from_numpy(rollout), torch.from_numpy(active), THRESHOLD
    )
    d = verdict.diagnostics
    assert set(d) == DIAGNOSTIC_KEYS
    t = training.astype(np.float64)[active]
    r = rollout.astype(np.float64)[active]
    diff = np.abs(t - r)
    assert d["mean_abs_diff"] == pytest.approx(diff.mean(), rel=1e-12)
    assert d["slime_mean_abs_logprob_diff"] == pytest.approx(diff.mean(), rel=1e-12)
    for key, q in (("p50_abs_diff", 50), ("p90_abs_diff", 90), ("p99_abs_diff", 99)):
        assert d[key] == pytest.approx(np.percentile(diff, q), rel=1e-12)
    assert d["max_abs_diff"] == pytest.approx(diff.max(), rel=1e-12)
    assert d["mismatch_ratio"] == pytest.approx(2 / 7)
    assert d["approx_kl_k1"] == pytest.approx(np.mean(r - t), rel=1e-12)
    assert d["approx_kl_k3"] == pytest.approx(np.mean(np.exp(t - r) - (t - r) - 1), rel=1e-12)
    assert d["nemo_rl_token_mult_prob_error"] == pytest.approx(np.mean(np.exp(diff)), rel=1e-12)
    assert d["verl_rollout_probs_diff_max"] == pytest.approx(
        np.max(np.abs(np.exp(t) - np.exp(r))), rel=1e-12
    )
    assert verdict.outcome is Outcome.MISMATCH
    assert verdict.mismatches == 2  # the inactive 7.0 does not count
    assert [(w["sample"], w["position"]) for w in verdict.worst_tokens][:2] == [(1, 1), (0, 3)]
    assert len(verdict.worst_tokens) == 5
    as_json = verdict.to_json()
    assert as_json["diagnostics"] == dict(d)
    assert as_json["outcome"] == "MISMATCH"


def test_diagnostics_never_change_the_outcome() -> None:
    """Large averages below the threshold pass; one token above it fails, however diluted."""
    n = 10_000
    rollout = torch.full((1, n), -2.0, dtype=torch.float32)
    all_active = _all_active((1, n))
    # every token just below the threshold: large mean, KL and ratio-like numbers, still PASS
    training = rollout + torch.tensor(np.float32(0.00099))
    heavy = judge(training, rollout, all_active, THRESHOLD)
    assert heavy.outcome is Outcome.PASS
    assert heavy.diagnostics["mean_abs_diff"] > 9e-4
    # a single token above it among 10k identical ones: ratio 1e-4, mean ~0, still MISMATCH
    diluted = rollout.clone()
    diluted[0, 1234] += 0.0011
    light = judge(diluted, rollout, all_active, THRESHOLD)
    assert light.outcome is Outcome.MISMATCH
    assert light.mismatches == 1
    assert light.diagnostics["mismatch_ratio"] == pytest.approx(1e-4)
    assert light.diagnostics["mean_abs_diff"] < heavy.diagnostics["mean_abs_diff"]


@pytest.mark.parametrize("garbage", [float("nan"), 0.0, 1e9])
def test_outcome_does_not_read_diagnostics(monkeypatch: pytest.MonkeyPatch, garbage: float) -> None:
    rollout = _scores([[-1.0, -2.0, -0.5, -3.0]])
    cases = [(rollout + 1e-5, Outcome.PASS, 0), (rollout + 0.01, Outcome.MISMATCH, 4)]
    real = [judge(t, rollout, _all_active((1, 4)), THRESHOLD) for t, _, _ in cases]

    def fake(
        training: torch.Tensor, rollout: torch.Tensor, active: torch.Tensor
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        worst = [
            {
                "sample": 0,
                "position": 0,
                "rollout_logprob": garbage,
                "training_logprob": garbage,
                "abs_diff": garbage,
            }
        ]
        return {key: garbage for key in DIAGNOSTIC_KEYS}, worst

    monkeypatch.setattr(comparison_module, "_diagnostics", fake)
    for (training, outcome, mismatches), before in zip(cases, real, strict=True):
        verdict = judge(training, rollout, _all_active((1, 4)), THRESHOLD)
        assert verdict.outcome is outcome is before.outcome
        assert verdict.mismatches == mismatches == before.mismatches
