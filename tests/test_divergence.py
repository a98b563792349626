"""Full-vocabulary reductions (``numerics.full_vocabulary``) against float64 references.

Property tests (hypothesis) over row counts, vocabulary sizes that do not divide the chunk,
float32 / bfloat16 / float16 inputs, logits or logprobs on either side, and ``-inf`` entries
(truncated supports, shared or not): KL both ways, total variation and the log support masses
match a float64 computation of the same (already rounded) inputs, with the stated conventions
(0 log 0 = 0, KL = inf when p > 0 where q = 0, NaN for rows that are not distributions).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pytest_logprob_drift.numerics.divergence_file import summarize
from pytest_logprob_drift.numerics.full_vocabulary import (
    DIVERGENCE_FIELDS,
    full_vocab_divergence,
    top_contributors,
    worst_rows,
)
from pytest_logprob_drift.numerics.semantic_offset import semantic_offset

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def reference(x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """float64, straight from the definitions (support = entries above -inf)."""
    x, y = x.double(), y.double()
    lp, lq = torch.log_softmax(x, -1), torch.log_softmax(y, -1)
    p, q = lp.exp(), lq.exp()
    sp, sq = ~torch.isneginf(x), ~torch.isneginf(y)

    def kl(
        a: torch.Tensor, la: torch.Tensor, lb: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor
    ) -> torch.Tensor:
        terms = torch.where(sa & sb, a * (la - torch.where(sb, lb, 0.0)), 0.0).sum(-1)
        return torch.where((sa & ~sb).any(-1), math.inf, terms)

    return {
        "kl_rollout_training": kl(p, lp, lq, sp, sq),
        "kl_training_rollout": kl(q, lq, lp, sq, sp),
        "total_variation": 0.5 * (p - q).abs().sum(-1),
        "log_mass_training_on_rollout_support": torch.log(torch.where(sp, q, 0.0).sum(-1)),
        "log_mass_rollout_on_training_support": torch.log(torch.where(sq, p, 0.0).sum(-1)),
    }


def assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    for name in DIVERGENCE_FIELDS:
        g, w = got[name], want[name]
        assert g.dtype == torch.float64 and g.shape == w.shape, name
        assert torch.equal(torch.isinf(g), torch.isinf(w)), (name, g, w)
        assert torch.equal(torch.isnan(g), torch.isnan(w)), (name, g, w)
        finite = torch.isfinite(w)
        err = (g[finite] - w[finite]).abs()
        bound = 2e-5 + 2e-5 * w[finite].abs()
        assert bool((err <= bound).all()), (name, float(err.max()), g, w)


@st.composite
def pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, int]:
    rows = draw(st.integers(1, 5))
    vocab = draw(st.integers(1, 300))
    chunk = draw(st.integers(1, 70))
    dtypes = draw(st.tuples(st.sampled_from(DTYPES), st.sampled_from(DTYPES)))
    scale = draw(st.sampled_from([0.0, 0.5, 3.0, 12.0]))
    closeness = draw(st.sampled_from([0.0, 1e-3, 0.1, 1.0, None]))
    truncation = draw(st.sampled_from(["none", "rollout", "training", "both", "shared"]))
    keep = draw(st.floats(0.05, 0.95))
    as_logprobs = draw(st.tuples(st.booleans(), st.booleans()))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((rows, vocab), generator=g, dtype=torch.float64) * scale
    if closeness is None:
        y = torch.randn((rows, vocab), generator=g, dtype=torch.float64) * scale
    else:
        y = x + torch.randn((rows, vocab), generator=g, dtype=torch.float64) * closeness
    y = y + 5.0  # logits are defined up to a constant
    shared = torch.rand((rows, vocab), generator=g) < keep
    for side, tensor in (("rollout", x), ("training", y)):
        if truncation in (side, "both", "shared"):
            mask = (
                shared if truncation == "shared" else torch.rand((rows, vocab), generator=g) < keep
            )
            mask[:, 0] = True  # every row keeps at least one token
            tensor.masked_fill_(~mask, -math.inf)
    out = []
    for tensor, dtype, logprobs in zip((x, y), dtypes, as_logprobs, strict=True):
        t = torch.log_softmax(tensor, -1) if logprobs else tensor
        out.append(t.to(dtype))
    return out[0], out[1], chunk


@given(pairs())
def test_reductions_match_float64(case: tuple[torch.Tensor, torch.Tensor, int]) -> None:
    x, y, chunk = case
    got = full_vocab_divergence(x, y, chunk_size=chunk).tensors()
    assert_close(got, reference(x, y))


@given(pairs(), st.integers(1, 70))
def test_chunk_size_does_not_matter(
    case: tuple[torch.Tensor, torch.Tensor, int], other: int
) -> None:
    x, y, chunk = case
    a = full_vocab_divergence(x, y, chunk_size=chunk).tensors()
    b = full_vocab_divergence(x, y, chunk_size=other).tensors()
    assert_close(a, b)


@given(pairs())
def test_logits_and_logprobs_give_the_same_divergence(
    case: tuple[torch.Tensor, torch.Tensor, int],
) -> None:
    x, y, chunk = case
    x64, y64 = x.double(), y.double()
    shifted = full_vocab_divergence(
        torch.log_softmax(x64, -1), y64 - 11.0, chunk_size=chunk
    ).tensors()
    assert_close(shifted, reference(x, y))


def test_identical_distributions_are_zero_and_properties_hold() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 1000, generator=g) * 4
    same = full_vocab_divergence(x, x.clone(), chunk_size=97).tensors()
    for name in DIVERGENCE_FIELDS:
        assert float(same[name].abs().max()) <= 1e-6, name
    y = torch.randn(6, 1000, generator=g) * 4
    d = full_vocab_divergence(x, y, chunk_size=97)
    tv = d.total_variation
    assert bool(((tv >= 0) & (tv <= 1)).all())
    # Pinsker: TV <= sqrt(KL / 2), both directions.
    assert bool((tv <= torch.sqrt(d.kl_rollout_training / 2) + 1e-6).all())
    assert bool((tv <= torch.sqrt(d.kl_training_rollout / 2) + 1e-6).all())


def test_invalid_rows_are_nan_and_do_not_poison_others() -> None:
    x = torch.randn(4, 50)
    y = torch.randn(4, 50)
    x[0] = -math.inf  # no finite entry
    y[1, 3] = math.nan
    x[2, 7] = math.inf
    d = full_vocab_divergence(x, y, chunk_size=16).tensors()
    for name in DIVERGENCE_FIELDS:
        assert bool(torch.isnan(d[name][:3]).all()), name
        assert bool(torch.isfinite(d[name][3])), name


def test_support_conventions() -> None:
    inf = math.inf
    p = torch.tensor([[0.0, 0.0, -inf], [0.0, 0.0, 0.0]])  # p keeps tokens 0 and 1 / all three
    q = torch.tensor([[0.0, 0.0, 0.0], [0.0, -inf, 0.0]])
    d = full_vocab_divergence(p, q, chunk_size=2)
    # Row 0: p's support is inside q's, 0 log 0 = 0: KL(p||q) = log(3/2), KL(q||p) = inf.
    assert float(d.kl_rollout_training[0]) == pytest.approx(math.log(1.5), abs=1e-6)
    assert d.kl_training_rollout[0] == inf
    assert float(d.log_mass_training_on_rollout_support[0]) == pytest.approx(
        math.log(2 / 3), abs=1e-6
    )
    assert float(d.log_mass_rollout_on_training_support[0]) == 0.0
    # Row 1: p has a token q drops: KL(p||q) = inf however small p there.
    assert d.kl_rollout_training[1] == inf
    assert float(d.total_variation[1]) == pytest.approx(1 / 3, abs=1e-6)


def test_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError):
        full_vocab_divergence(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(TypeError):
        full_vocab_divergence(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3))
    with pytest.raises(ValueError):
        full_vocab_divergence(torch.zeros(2, 3), torch.zeros(2, 3), chunk_size=0)
    empty = full_vocab_divergence(torch.zeros(0, 3), torch.zeros(0, 3))
    assert empty.total_variation.shape == (0,)


@given(pairs(), st.integers(1, 8))
def test_top_contributors_match_float64(
    case: tuple[torch.Tensor, torch.Tensor, int], k: int
) -> None:
    x, y, _ = case
    d = full_vocab_divergence(x, y)
    rows = worst_rows(d.total_variation, 2)
    top = top_contributors(x, y, rows, k=k)
    k = min(k, x.shape[1])
    p = torch.softmax(x.double(), -1)
    q = torch.softmax(y.double(), -1)
    for i, row in enumerate(rows.tolist()):
        share = 0.5 * (p[row] - q[row]).abs()
        want = torch.topk(share, k).values
        assert torch.allclose(top.tv_share[i], want, atol=1e-12)
        assert float(top.tv_share[i].sum()) <= float(share.sum()) + 1e-12
        ids = top.token_ids[i]
        assert torch.allclose(top.tv_share[i], share[ids], atol=1e-12)


def test_summary_is_plain_json_and_counts_infinities() -> None:
    inf = math.inf
    x = torch.tensor([[0.0, 1.0, -inf], [0.0, 1.0, 2.0]])
    y = torch.tensor([[0.0, 1.0, 2.0], [0.0, 1.5, 2.0]])
    d = full_vocab_divergence(x, y)
    active = torch.tensor([[False, True, True]])
    grid = {n: torch.zeros(1, 3, dtype=torch.float64) for n in DIVERGENCE_FIELDS}
    for n in DIVERGENCE_FIELDS:
        grid[n][active] = d.tensors()[n]
    rows = worst_rows(d.total_variation, 1)
    top = top_contributors(x, y, rows, k=2)
    summary = summarize(grid, active, top.tensors())
    import json

    json.dumps(summary, allow_nan=False)
    assert summary["kl_training_rollout"]["infinite"] == 1
    assert summary["truncated_positions"] == 1
    assert summary["worst_positions"][0]["position"] == 1
    assert len(summary["worst_positions"][0]["top_tokens"]) == 2


def _top_p_logprobs(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Processed logprobs: the smallest top set with mass >= top_p, renormalized."""
    sorted_logits, order = logits.sort(-1, descending=False)
    cumulative = sorted_logits.softmax(-1).cumsum(-1)
    drop = cumulative <= 1 - top_p
    drop[:, -1] = False
    masked = sorted_logits.masked_fill(drop, -math.inf)
    processed = torch.empty_like(logits).scatter_(-1, order, masked)
    return torch.log_softmax(processed, -1)


def test_semantic_offset_fires_only_on_a_semantics_mismatch() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(40, 200, generator=g) * 2
    tokens = torch.multinomial(torch.softmax(logits, -1), 1, generator=g).squeeze(-1)
    raw = torch.log_softmax(logits, -1)
    processed = _top_p_logprobs(logits, 0.9)
    # Sample only tokens inside the truncated support, as the rollout would.
    inside = torch.isfinite(processed.gather(-1, tokens[:, None]).squeeze(-1))
    raw, processed, logits, tokens = raw[inside], processed[inside], logits[inside], tokens[inside]
    active = torch.ones(1, tokens.numel(), dtype=torch.bool)

    def offset(rollout_full: torch.Tensor, training_full: torch.Tensor) -> bool:
        d = full_vocab_divergence(rollout_full, training_full)
        r = rollout_full.gather(-1, tokens[:, None]).T.float()
        t = training_full.gather(-1, tokens[:, None]).T.float()
        result = semantic_offset(
            t,
            r,
            active,
            d.log_mass_training_on_rollout_support[None],
            d.log_mass_rollout_on_training_support[None],
        )
        return result.fires

    assert offset(processed, raw)  # processed rollout vs raw trainer
    assert offset(raw, processed)  # the other way round
    assert not offset(raw, raw)
    assert not offset(processed, processed)
