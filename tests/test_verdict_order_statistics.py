"""The verdict's quantiles and worst tokens come from one sort of the active differences
(issue 58): each equals, to the bit, ``torch.quantile`` and a stable descending argsort of the
same float64 differences, ties (equal differences, float32 grids) included."""

from __future__ import annotations

import pytest
import torch

from pytest_logprob_drift.numerics.verdict import WORST_TOKENS, judge


def _cases() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(58)
    rollout = -torch.rand(37, 211, generator=g, dtype=torch.float64) * 3
    cases = [("distinct", rollout, rollout + torch.randn(rollout.shape, generator=g) * 1e-3)]
    steps = torch.randint(0, 3, rollout.shape, generator=g).double() * 2.0**-10
    cases.append(("ties", rollout, rollout + steps))  # few distinct |diff|, many ties
    cases.append(("all equal", rollout, rollout.clone()))
    r32 = rollout.float()
    cases.append(("float32", r32, r32 + torch.randn(r32.shape, generator=g).float() * 1e-3))
    small = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64)
    cases.append(("fewer than the worst shown", small, small + 0.25))
    return cases


@pytest.mark.parametrize("name,rollout,training", _cases(), ids=[c[0] for c in _cases()])
def test_quantiles_and_worst_tokens_as_a_full_sort_gives_them(
    name: str, rollout: torch.Tensor, training: torch.Tensor
) -> None:
    g = torch.Generator().manual_seed(7)
    active = torch.rand(rollout.shape, generator=g) < 0.8
    active[0, 0] = True
    verdict = judge(training, rollout, active, 2e-4)
    t, r = training.double()[active], rollout.double()[active]
    diff = (t - r).abs()
    want = torch.quantile(diff, torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64)).tolist()
    got = [verdict.diagnostics[f"p{p}_abs_diff"] for p in (50, 90, 99)]
    assert got == want, name
    order = torch.argsort(diff, descending=True, stable=True)[:WORST_TOKENS].tolist()
    positions = active.nonzero().tolist()
    assert [(w["sample"], w["position"]) for w in verdict.worst_tokens] == [
        tuple(positions[i]) for i in order
    ]
    assert [w["abs_diff"] for w in verdict.worst_tokens] == [float(diff[i]) for i in order]
    assert len(verdict.worst_tokens) == min(WORST_TOKENS, int(active.sum()))
