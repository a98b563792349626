"""The semantic-offset diagnostic at any temperature (issue 13), on real tensors.

At temperature T the processed logprob is ``z/T - logsumexp_S(z/T)`` against the raw
``z - logsumexp(z)``: no per-position constant, so ``log S`` alone cannot explain it (T = 1
it can). The diagnostic recomputes the processed distribution at the declared temperature and
truncation from the other side's full logits and says which explanation fired. Everything
goes through ``sealed_tensors`` + ``sealed_diagnostics``: what a case seals and what ``verify``
recomputes.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hypothesis import assume, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pytest_logprob_drift.numerics.divergence_file import (  # noqa: E402
    SEALED_KEYS,
    sealed_diagnostics,
    sealed_tensors,
)
from pytest_logprob_drift.numerics.sampling import Truncation, processed_logits  # noqa: E402
from pytest_logprob_drift.numerics.semantic_offset import (  # noqa: E402
    EXPLANATIONS,
    processed_residual,
)

TEMPERATURES = (0.7, 1.0, 1.3)


def _grid(values: Any, fill: Any = 0) -> Any:
    """``[A]`` -> ``[1, A + 1]`` with position 0 inactive (it has no preceding token)."""
    head = torch.full((1,), fill, dtype=values.dtype)
    return torch.cat([head, values]).unsqueeze(0)


def _sample(logits: Any, how: Truncation, seed: int) -> Any:
    """One token per row from the processed distribution (Gumbel-max, seeded)."""
    g = torch.Generator().manual_seed(seed)
    noise = -torch.log(-torch.log(torch.rand(logits.shape, generator=g).clamp_(min=1e-20)))
    return (processed_logits(logits, how) + noise).argmax(-1)


def _pick(logits: Any, tokens: Any) -> Any:
    return torch.log_softmax(logits.float(), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def diagnose(
    rollout_rows: Any, training_rows: Any, tokens: Any, how: Truncation | None
) -> dict[str, Any]:
    """Seal one case's full rows and summarize it exactly as a case and ``verify`` do."""
    active = _grid(torch.ones(tokens.shape[0], dtype=torch.bool), False)
    token_ids = _grid(tokens)
    rollout = _grid(_pick(rollout_rows, tokens))
    training = _grid(_pick(training_rows, tokens))
    sealed = sealed_tensors(
        rollout_rows,
        training_rows,
        active,
        top_k=3,
        worst_positions=2,
        truncation=how,
        token_ids=token_ids,
        rollout_logprobs=rollout,
        training_logprobs=training,
    )
    assert set(sealed) == SEALED_KEYS
    entries = sealed_diagnostics(sealed, training, rollout, active)
    offset: dict[str, Any] = entries["semantic_offset"]
    return offset


def _nondegenerate(logits: Any, how: Truncation) -> bool:
    """Every position keeps >= 2 tokens with distinct logits after processing (with one token,
    or all kept logits equal, the processed distribution ignores the temperature and ``log S``
    explains it exactly)."""
    kept = torch.isfinite(processed_logits(logits, how))
    for row, keep in zip(logits, kept, strict=True):
        values = row[keep]
        if values.numel() < 2 or float(values.max() - values.min()) < 1e-2:
            return False
    return True


logit_rows = st.tuples(st.integers(2, 6), st.integers(8, 40), st.integers(0, 2**31 - 1))
truncations = st.tuples(
    st.sampled_from(TEMPERATURES),
    st.sampled_from([None, 0.8, 0.9]),
    st.sampled_from([None, 5]),
)


@given(shape=logit_rows, spec=truncations, rollout_processed=st.booleans())
def test_processed_against_raw_is_explained_at_any_temperature(
    shape: tuple[int, int, int],
    spec: tuple[float, float | None, int | None],
    rollout_processed: bool,
) -> None:
    rows, vocab, seed = shape
    temperature, top_p, top_k = spec
    how = Truncation(temperature=temperature, top_p=top_p, top_k=top_k)
    assume(how.truncates or temperature != 1.0)
    logits = torch.randn((rows, vocab), generator=torch.Generator().manual_seed(seed)) * 2
    assume(_nondegenerate(logits, how))
    tokens = _sample(logits, how, seed)
    processed = processed_logits(logits, how)
    # The other engine's logits differ by float32 noise (1e-7), far below the tolerance.
    noisy = logits + 1e-7 * torch.randn(logits.shape, generator=torch.Generator().manual_seed(1))
    if rollout_processed:
        offset = diagnose(processed, noisy, tokens, how)
    else:
        offset = diagnose(noisy, processed, tokens, how)
    assert offset["fires"] is True, offset
    if temperature == 1.0:
        assert offset["explanation"] == "truncation_renormalization", offset
        assert offset["message"].startswith("truncation renormalization: |diff| matches log S")
    else:
        side = "processed_rollout" if rollout_processed else "processed_training"
        assert offset["explanation"] == side, offset
        assert offset["message"].startswith(
            f"processed semantics: the {'rollout' if rollout_processed else 'trainer'}'s "
            f"logprobs match the processed distribution (temperature {temperature:g}"
        )
    assert offset["explanation"] in EXPLANATIONS
    assert offset["explained_fraction"] >= 0.9


@given(shape=logit_rows, spec=truncations, processed_both=st.booleans())
def test_same_semantics_never_fire(
    shape: tuple[int, int, int], spec: tuple[float, float | None, int | None], processed_both: bool
) -> None:
    rows, vocab, seed = shape
    temperature, top_p, top_k = spec
    how = Truncation(temperature=temperature, top_p=top_p, top_k=top_k)
    logits = torch.randn((rows, vocab), generator=torch.Generator().manual_seed(seed)) * 2
    tokens = _sample(logits, how, seed)
    side = processed_logits(logits, how) if processed_both else logits
    offset = diagnose(side, side.clone(), tokens, how)
    assert offset["fires"] is False and offset["explanation"] is None, offset


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_log_s_alone_explains_only_temperature_one(temperature: float) -> None:
    """The old per-position ``log S`` rule on its own: exact at T = 1, wrong at T != 1 (which
    is why the processed recompute exists); without a declared sampling only it can fire."""
    how = Truncation(temperature=temperature, top_p=0.9)
    logits = torch.randn((6, 32), generator=torch.Generator().manual_seed(3)) * 2
    assert _nondegenerate(logits, how)
    tokens = _sample(logits, how, 3)
    offset = diagnose(processed_logits(logits, how), logits, tokens, None)
    assert offset["fires"] is (temperature == 1.0), offset
    full = diagnose(processed_logits(logits, how), logits, tokens, how)
    assert full["fires"] is True
    expected = "truncation_renormalization" if temperature == 1.0 else "processed_rollout"
    assert full["explanation"] == expected


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_processed_residual_against_a_float64_reference(temperature: float) -> None:
    """``processed_residual`` is ``|reported - processed logprob|``; the processed logprob
    checked here against temperature + top_k written independently in float64."""
    logits = torch.randn((5, 24), generator=torch.Generator().manual_seed(5)) * 3
    how = Truncation(temperature=temperature, top_k=6)
    tokens = _sample(logits, how, 5)
    scaled = logits.double() / temperature
    kth = scaled.topk(6, dim=-1).values[:, -1:]
    reference = torch.log_softmax(scaled.masked_fill(scaled < kth, -math.inf), -1)
    expected = reference.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    residual = processed_residual(expected.float(), logits, tokens, how)
    assert residual.dtype == torch.float64 and residual.shape == (5,)
    assert float(residual.max()) < 1e-5
    shifted = processed_residual(expected.float() + 0.25, logits, tokens, how)
    assert torch.allclose(shifted, torch.full((5,), 0.25, dtype=torch.float64), atol=1e-5)


def test_no_processing_declared_at_temperature_one_is_plain_agreement() -> None:
    """T = 1 without truncation changes nothing: numerical noise never reads as semantics."""
    logits = torch.randn((4, 16), generator=torch.Generator().manual_seed(9))
    how = Truncation(temperature=1.0)
    tokens = _sample(logits, how, 9)
    offset = diagnose(logits, logits + 3e-5, tokens, how)
    assert offset["fires"] is False and offset["explanation"] is None
