"""The frameworks' gates (issue 58): each figure against its framework's formula written here
in numpy float64 as its source computes it (loops over samples and tokens, not the package's
vectorized form), each bar's side of the comparison, and a grid that passes some gates and
fails others."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from framework_gates import miles_sides, nemo, pairs_of, prime, slime, verl_ess, verl_kl

from pytest_logprob_drift.numerics.gates import GATES, Passes, gate_results, holds


def _grid(seed: int, samples: int = 7, width: int = 40, drift: float = 1e-3):
    rng = np.random.default_rng(seed)
    rollout = -rng.exponential(1.0, size=(samples, width)).astype(np.float32)
    training = (rollout + rng.normal(0.0, drift, size=(samples, width))).astype(np.float32)
    active = np.zeros((samples, width), dtype=bool)
    for i in range(samples):
        start = int(rng.integers(1, width // 2))
        end = int(rng.integers(start + 1, width + 1))
        active[i, start:end] = rng.random(end - start) > 0.1
    active[-1] = False  # a sample without active tokens (masked by its run): still a sample
    training[0, ~active[0]] = np.nan  # inactive garbage is never read
    return training, rollout, active


def _results(training, rollout, active, **kwargs):
    results = gate_results(
        torch.from_numpy(training), torch.from_numpy(rollout), torch.from_numpy(active), **kwargs
    )
    return {r.key: r for r in results}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("drift", [1e-4, 0.05])
def test_each_gate_is_its_frameworks_formula(seed: int, drift: float) -> None:
    training, rollout, active = _grid(seed, drift=drift)
    got = _results(training, rollout, active)
    pairs = pairs_of(training, rollout, active)
    miles_t, miles_r = miles_sides(training, rollout, active)
    want = {
        "slime_ci": (slime(training, rollout, active), None),
        "miles_ci": (abs(miles_t - miles_r), math.isclose(miles_t, miles_r, abs_tol=0.03)),
        "nemo_rl_token_mult_prob_error": (nemo(pairs), None),
        "prime_rl_mismatch_kl": (prime(pairs), None),
        "verl_ess": (verl_ess(pairs), None),
        "verl_kl": (verl_kl(pairs), None),
    }
    bars = {
        "slime_ci": lambda v: v <= 0.1,
        "nemo_rl_token_mult_prob_error": lambda v: v < 1.05,
        "prime_rl_mismatch_kl": lambda v: v < 0.015,
        "verl_ess": lambda v: v >= 0.3,
        "verl_kl": lambda v: abs(v) <= 0.1,
    }
    assert set(got) == set(want) == {g.key for g in GATES}
    for key, (value, passed) in want.items():
        assert got[key].value is not None
        assert math.isclose(got[key].value, value, rel_tol=1e-9, abs_tol=1e-12), key
        assert got[key].passed is (passed if passed is not None else bars[key](value)), key


def test_slime_gate_takes_slimes_own_figure_when_recorded() -> None:
    training, rollout, active = _grid(3)
    assert _results(training, rollout, active, slime_figure=0.25)["slime_ci"].passed is False
    assert _results(training, rollout, active, slime_figure=0.1)["slime_ci"].passed is True


def test_some_gates_pass_and_others_fail_on_one_grid() -> None:
    """20 of 1,000 tokens with the trainer 2 nats above the rollout: slime's mean |diff| 0.04
    passes its 0.1, miles' 0.04 fails its 0.03, NeMo-RL's 1.128 fails 1.05, prime-rl's
    0.088 fails 0.015, verl's ESS 0.98 and KL -0.04 pass its advisories."""
    rollout = np.full((10, 100), -1.0, dtype=np.float32)
    training = rollout.copy()
    training[:, :2] += 2.0
    active = np.ones((10, 100), dtype=bool)
    got = _results(training, rollout, active)
    pairs = pairs_of(training, rollout, active)
    assert {k: r.passed for k, r in got.items()} == {
        "slime_ci": True,
        "miles_ci": False,
        "nemo_rl_token_mult_prob_error": False,
        "prime_rl_mismatch_kl": False,
        "verl_ess": True,
        "verl_kl": True,
    }
    assert math.isclose(got["nemo_rl_token_mult_prob_error"].value or 0.0, nemo(pairs))
    assert math.isclose(got["verl_ess"].value or 0.0, verl_ess(pairs))


def test_a_figure_past_float64_fails_its_bar_and_is_none() -> None:
    rollout = np.full((1, 4), -1.0)
    training = rollout.copy()
    training[0, 1] = 800.0  # exp(801) overflows
    got = _results(training, rollout, np.ones((1, 4), dtype=bool))
    assert got["nemo_rl_token_mult_prob_error"].value is None
    assert got["nemo_rl_token_mult_prob_error"].passed is False
    assert got["prime_rl_mismatch_kl"].passed is False


@pytest.mark.parametrize(
    ("passes", "value", "bar", "expected"),
    [
        (Passes.AT_MOST, 0.1, 0.1, True),  # slime: assert figure <= threshold
        (Passes.BELOW, 1.05, 1.05, False),  # NeMo-RL: max(...) < 1.05
        (Passes.BELOW, 0.015, 0.015, False),  # prime-rl: lower than 0.015
        (Passes.AT_LEAST, 0.3, 0.3, True),  # verl warns when ess < 0.3
        (Passes.ABS_AT_MOST, -0.1, 0.1, True),  # verl warns when abs(kl) > 0.1
        (Passes.ABS_AT_MOST, -0.11, 0.1, False),
        (Passes.AT_MOST, math.nan, 0.1, False),
    ],
)
def test_each_bar_sits_on_the_side_its_framework_compares(
    passes: Passes, value: float, bar: float, expected: bool
) -> None:
    assert holds(passes, value, bar) is expected


def test_every_gate_names_its_source_commit_and_bar() -> None:
    for gate in GATES:
        assert "@" in gate.source and len(gate.source.rsplit("@", 1)[1]) == 40, gate.key
        assert gate.bar > 0 and gate.formula and gate.figure
    assert [g.key for g in GATES if g.advisory] == ["verl_ess", "verl_kl"]
