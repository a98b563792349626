"""The importance-sampling figures of a case against a float64 reference written here (plain
numpy and math, none of the module's helpers), the extremes that must not overflow, a planted
constant shift, the peer-correction table, and k1/k3 shared with the verdict."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_logprob_drift.numerics.importance_sampling import (
    BAND_EDGES,
    PEER_CORRECTIONS,
    ImportanceSampling,
    Statistic,
    importance_sampling,
)
from pytest_logprob_drift.numerics.verdict import judge

SETTINGS = settings(suppress_health_check=[HealthCheck.too_slow])
REL = 1e-9

# -------------------------------------------------------------------------- the reference


def reference(t: np.ndarray, o: np.ndarray, m: np.ndarray) -> dict[str, Any]:
    """Every figure by its textbook definition, in float64, looping over sequences. Band tests
    compare logs, the module's stated convention (``w > cap`` is ``r > log(cap)``)."""
    t64, o64 = t.astype(np.float64), o.astype(np.float64)
    r = (t64 - o64)[m]
    w = np.exp(r)
    n = r.size
    seq_sum, seq_mean, mult = [], [], []
    for row in range(m.shape[0]):
        rr = (t64[row] - o64[row])[m[row]]
        if rr.size == 0:
            continue
        seq_sum.append(rr.sum())
        seq_mean.append(rr.mean())
        mult.append(np.mean(np.exp(np.abs(rr))))
    s, g, e = np.array(seq_sum), np.array(seq_mean), np.array(mult)
    big_w = np.exp(s)
    normalized = w / w.mean()
    clamped = np.clip(w, 0.5, 2.0)
    stat = {
        Statistic.TOKEN_RATIO: r,
        Statistic.GEOMETRIC_RATIO: g,
        Statistic.SEQUENCE_RATIO: s,
        Statistic.MULT_PROB_ERROR: np.log(e),
    }
    corrections = {}
    for p in PEER_CORRECTIONS:
        values = stat[p.statistic]
        out = np.zeros(values.shape, dtype=bool)
        if p.high is not None:
            out |= values > math.log(p.high)
        if p.low is not None:
            out |= values < math.log(p.low)
        corrections[p.key] = out.mean()
    ppl = np.array(
        [
            math.exp(-t64[row][m[row]].mean()) / math.exp(-o64[row][m[row]].mean())
            for row in range(m.shape[0])
            if m[row].any()
        ]
    )
    return {
        "active_tokens": n,
        "sequences": s.size,
        "weight": (w.min(), w.mean(), w.max()),
        "bands": [
            (edge, np.mean(r > math.log(edge)), np.mean(r < math.log(edge))) for edge in BAND_EDGES
        ],
        "ess": 1.0 / np.mean(normalized**2),
        "ess_verl": 1.0 / np.mean((clamped / clamped.mean()) ** 2),
        "chi2_token": np.mean(w**2) / np.mean(w) ** 2 - 1,
        "chi2_sequence": np.mean(big_w**2) / np.mean(big_w) ** 2 - 1,
        "ess_sequence": np.mean(big_w) ** 2 / np.mean(big_w**2),
        "seq_sum": (s.min(), s.mean(), s.max()),
        "seq_mean": (g.min(), g.mean(), g.max()),
        "max_geo_dev": np.max(np.abs(np.exp(g) - 1)),
        "log_ppl": (np.log(ppl).min(), np.log(ppl).mean(), np.log(ppl).max()),
        "max_mult": np.log(e.max()),
        "k1": np.mean(-r),
        "k2": 0.5 * np.mean(r**2),
        "k3": np.mean(np.exp(r) - r - 1),
        "corrections": corrections,
    }


def close(a: float, b: float) -> bool:
    return a == pytest.approx(b, rel=REL, abs=1e-12)


def assert_matches(fig: ImportanceSampling, ref: dict[str, Any]) -> None:
    assert fig.active_tokens == ref["active_tokens"]
    assert fig.sequences == ref["sequences"]
    for got, want in zip(
        (fig.weight_min, fig.weight_mean, fig.weight_max), ref["weight"], strict=True
    ):
        assert close(got, want)
    assert [(b.edge, b.above, b.below) for b in fig.band_fractions] == [
        (e, pytest.approx(a), pytest.approx(b)) for e, a, b in ref["bands"]
    ]
    for name in ("ess", "chi2_token", "chi2_sequence", "ess_sequence"):
        got, want = getattr(fig, name), ref[name]
        # 1 - ESS and chi2 lose relative precision near 0 in the reference itself
        assert got == pytest.approx(want, rel=1e-7, abs=1e-9), name
    assert fig.ess_verl_clamped == pytest.approx(ref["ess_verl"], rel=1e-9)
    for summary, key in (
        (fig.log_sequence_ratio, "seq_sum"),
        (fig.log_geometric_ratio, "seq_mean"),
        (fig.log_perplexity_ratio, "log_ppl"),
    ):
        for got, want in zip((summary.min, summary.mean, summary.max), ref[key], strict=True):
            assert got == pytest.approx(want, rel=1e-9, abs=1e-9), key
    assert fig.max_geometric_deviation == pytest.approx(ref["max_geo_dev"], rel=1e-9, abs=1e-12)
    assert fig.log_max_seq_mult_prob_error == pytest.approx(ref["max_mult"], rel=1e-9, abs=1e-12)
    assert close(fig.approx_kl_k1, ref["k1"])
    assert close(fig.approx_kl_k2, ref["k2"])
    assert fig.approx_kl_k3 == pytest.approx(ref["k3"], rel=1e-7, abs=1e-12)
    assert dict(fig.corrections) == pytest.approx(ref["corrections"])


def figures(t: np.ndarray, o: np.ndarray, m: np.ndarray) -> ImportanceSampling:
    return importance_sampling(torch.from_numpy(t), torch.from_numpy(o), torch.from_numpy(m))


@st.composite
def cases(draw: Any, *, max_rows: int = 4, max_len: int = 12) -> tuple[np.ndarray, ...]:
    rows = draw(st.integers(1, max_rows))
    length = draw(st.integers(1, max_len))
    logprob = st.floats(-12.0, 0.0, width=32)
    nudge = st.sampled_from([0.0, 0.0, 1e-7, -1e-7, 1e-3, -1e-3, 0.7, -0.7, 2.0, -3.0])
    t = np.array(draw(st.lists(logprob, min_size=rows * length, max_size=rows * length)))
    d = np.array(draw(st.lists(nudge, min_size=rows * length, max_size=rows * length)))
    mask = np.array(draw(st.lists(st.booleans(), min_size=rows * length, max_size=rows * length)))
    mask[draw(st.integers(0, rows * length - 1))] = True
    shape = (rows, length)
    o = (t + d).astype(np.float32)
    # either side may be the smaller; independent draws for half the cases
    if draw(st.booleans()):
        o = np.array(
            draw(st.lists(logprob, min_size=rows * length, max_size=rows * length)),
            dtype=np.float32,
        )
    return t.astype(np.float32).reshape(shape), o.reshape(shape), mask.reshape(shape)


# ----------------------------------------------------------------------- property tests


@SETTINGS
@given(cases())
def test_every_figure_matches_the_reference(case: tuple[np.ndarray, ...]) -> None:
    t, o, m = case
    fig = figures(t, o, m)
    assert_matches(fig, reference(t, o, m))
    json.dumps(fig.to_json(), allow_nan=False)


@SETTINGS
@given(cases(max_rows=3, max_len=1))
def test_sequences_of_one_token(case: tuple[np.ndarray, ...]) -> None:
    t, o, m = case
    m[:] = True
    fig = figures(t, o, m)
    assert_matches(fig, reference(t, o, m))
    # one token: the sequence ratio, the geometric ratio and the token weight are one number
    assert fig.log_sequence_ratio == fig.log_geometric_ratio


@SETTINGS
@given(cases(), st.floats(-5.0, 0.0))
def test_all_equal_logprobs_have_ess_one_and_nothing_clipped(
    case: tuple[np.ndarray, ...], value: float
) -> None:
    t, _, m = case
    for o in (t.copy(), np.full_like(t, value)):
        same = o.copy()
        fig = figures(same, o, m)
        assert fig.ess == 1.0
        assert fig.ess_sequence == 1.0
        assert fig.chi2_token == 0.0
        assert fig.chi2_sequence == 0.0
        assert fig.weight_min == fig.weight_mean == fig.weight_max == 1.0
        assert fig.max_geometric_deviation == 0.0
        assert fig.approx_kl_k1 == fig.approx_kl_k2 == fig.approx_kl_k3 == 0.0
        assert set(fig.corrections.values()) == {0.0}


@SETTINGS
@given(cases(), st.floats(-4.0, 4.0).filter(lambda c: abs(c) > 1e-6))
def test_a_planted_constant_shift(case: tuple[np.ndarray, ...], c: float) -> None:
    """Training shifted by c on every token: every weight is exp(c), and a TIS cap clips all
    tokens when c > log(cap), none when c < log(cap)."""
    t, _, m = case
    o = t.astype(np.float64)
    shifted = o + c
    fig = figures(shifted, o, m)
    r = (shifted - o)[m]  # the sealed log-ratio: c up to rounding of the addition
    assert fig.weight_min == pytest.approx(math.exp(r.min()), rel=1e-12)
    assert fig.weight_max == pytest.approx(math.exp(r.max()), rel=1e-12)
    assert fig.weight_mean == pytest.approx(math.exp(c), rel=1e-9)
    assert fig.ess == pytest.approx(1.0, abs=1e-9)
    for key, cap in (
        ("tis_clipped_token_fraction_cap_2", 2.0),
        ("tis_clipped_token_fraction_cap_3", 3.0),
        ("tis_clipped_token_fraction_cap_5", 5.0),
    ):
        if abs(c - math.log(cap)) > 1e-9:
            assert fig.corrections[key] == (1.0 if c > math.log(cap) else 0.0), key


# ------------------------------------------------------------------------ no overflow


def finite_everywhere(value: Any) -> bool:
    if isinstance(value, dict):
        return all(finite_everywhere(v) for v in value.values())
    if isinstance(value, list):
        return all(finite_everywhere(v) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return value is not None


@pytest.mark.parametrize(
    "pattern",
    ["all_plus", "all_minus", "alternating", "rows_of_each", "half_plus"],
)
def test_extreme_ratios_give_no_inf_or_nan(pattern: str) -> None:
    """r = +-50 on every token of 4,096-token sequences: sequence sums of +-204,800 nats,
    whose exponentials overflow float64 many times over, and no figure is inf, nan or None."""
    length = 4096
    r = torch.full((2, length), 50.0, dtype=torch.float64)
    if pattern == "all_minus":
        r = -r
    elif pattern == "alternating":
        r[:, ::2] = -50.0
    elif pattern == "rows_of_each":
        r[1] = -50.0
    elif pattern == "half_plus":
        r[:, length // 2 :] = -50.0
    rollout = torch.full((2, length), -60.0, dtype=torch.float32)
    training = (rollout.to(torch.float64) + r).to(torch.float32)
    fig = importance_sampling(training, rollout, torch.ones(2, length, dtype=torch.bool))
    document = fig.to_json()
    json.dumps(document, allow_nan=False)
    assert finite_everywhere(document), document
    if pattern == "rows_of_each":
        # two sequences of ratio e^+204800 and e^-204800: one carries all the weight
        assert fig.ess_sequence == pytest.approx(0.5)
        assert fig.chi2_sequence == pytest.approx(1.0)
        assert fig.log_sequence_ratio.max == pytest.approx(50.0 * length)
        assert fig.corrections["trl_sequence_mask_masked_sequence_fraction"] == 0.5


def test_a_weight_beyond_float64_is_none_in_json_and_its_log_is_kept() -> None:
    training = torch.tensor([[800.0, 0.0]], dtype=torch.float64)
    rollout = torch.zeros(1, 2, dtype=torch.float64)
    fig = importance_sampling(training, rollout, torch.ones(1, 2, dtype=torch.bool))
    document = fig.to_json()
    json.dumps(document, allow_nan=False)
    assert document["weight"]["max"] is None
    assert document["log_weight"]["max"] == 800.0
    assert 0.0 < document["ess"] <= 1.0
    assert document["chi2_token"] == pytest.approx(1.0)  # one of two tokens holds all weight


@pytest.mark.parametrize(
    ("training", "rollout", "active", "message"),
    [
        (torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2, dtype=torch.bool), "shape"),
        (torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), "dtype"),
        (torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.bool), "no active"),
        (
            torch.tensor([[math.nan, 0.0]]),
            torch.zeros(1, 2),
            torch.ones(1, 2, dtype=torch.bool),
            "non-finite",
        ),
    ],
)
def test_inputs_a_verdict_would_not_judge_are_refused(
    training: torch.Tensor, rollout: torch.Tensor, active: torch.Tensor, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        importance_sampling(training, rollout, active)


def test_inactive_positions_count_for_nothing() -> None:
    training = torch.tensor([[-1.0, 99.0, -2.0], [5.0, -1e30, 0.0]])
    rollout = torch.tensor([[-1.5, 0.0, -2.0], [0.0, math.inf, 0.0]])
    active = torch.tensor([[True, False, True], [False, False, False]])
    fig = importance_sampling(training, rollout, active)
    assert fig.active_tokens == 2
    assert fig.sequences == 1  # a row without an active token is not a sequence
    assert fig.log_weight_max == pytest.approx(0.5)


# ------------------------------------------------------------ the peer-correction table


def test_every_peer_correction_names_its_framework_flag_default_and_source() -> None:
    keys = [p.key for p in PEER_CORRECTIONS]
    assert len(set(keys)) == len(keys)
    for p in PEER_CORRECTIONS:
        assert p.framework and p.flag and p.default and p.measures and p.source
        assert p.low is not None or p.high is not None
        assert p.low is None or p.high is None or p.low < p.high
    bands = {(p.key, p.low, p.high) for p in PEER_CORRECTIONS}
    assert ("icepop_dropped_token_fraction", 0.5, 5.0) in bands
    assert ("trl_sequence_mask_masked_sequence_fraction", None, 3.0) in bands
    assert ("nemo_rl_seq_error_masked_sequence_fraction", None, 2.0) in bands
    caps = sorted(p.high for p in PEER_CORRECTIONS if p.key.startswith("tis_") and p.high)
    assert caps == [2.0, 3.0, 5.0]
    seq_mask = sorted(
        (p.low, p.high) for p in PEER_CORRECTIONS if p.statistic is Statistic.GEOMETRIC_RATIO
    )
    assert seq_mask == [(0.5, 2.0), (0.999, 1.001), (0.999, 1.002)]


def test_an_edge_value_is_inside_its_band() -> None:
    """Strict comparisons: a geometric ratio exactly at a band edge is not masked."""
    edge = math.log(2.0)
    training = torch.tensor([[edge, edge]], dtype=torch.float64)
    rollout = torch.zeros(1, 2, dtype=torch.float64)
    fig = importance_sampling(training, rollout, torch.ones(1, 2, dtype=torch.bool))
    assert fig.corrections["seq_mask_tis_masked_sequence_fraction_05_2"] == 0.0
    assert fig.corrections["tis_clipped_token_fraction_cap_2"] == 0.0


# ----------------------------------------------------------- one definition of k1 and k3


@SETTINGS
@given(cases())
def test_the_verdict_reports_the_same_k1_and_k3(case: tuple[np.ndarray, ...]) -> None:
    t, o, m = case
    fig = figures(t, o, m)
    verdict = judge(torch.from_numpy(t), torch.from_numpy(o), torch.from_numpy(m), 1e-3)
    assert verdict.diagnostics["approx_kl_k1"] == fig.approx_kl_k1
    assert verdict.diagnostics["approx_kl_k3"] == fig.approx_kl_k3
    r = (t.astype(np.float64) - o.astype(np.float64))[m]
    assert verdict.diagnostics["approx_kl_k1"] == pytest.approx(np.mean(-r), rel=1e-12, abs=1e-15)
