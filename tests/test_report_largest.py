"""The report's worst tokens without a full sort (issue 58): ``report.load.largest`` gives what
a stable descending argsort's first k give, ties in index order, NaN as the largest."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pytest_logprob_drift.report.load import largest


@pytest.mark.parametrize("k", [0, 1, 10, 200, 5000])
@pytest.mark.parametrize("seed", [0, 1])
def test_largest_is_the_stable_argsorts_head(k: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = torch.from_numpy(rng.integers(0, 50, size=3000).astype(np.float64) / 7)  # many ties
    values[::11] = -1.0  # inactive cells, as worst_tokens marks them
    got = largest(values, k).tolist()
    want = sorted(range(len(values)), key=lambda i: (-float(values[i]), i))[:k]
    assert got == want


def test_nan_sorts_first_as_in_argsort() -> None:
    values = torch.tensor([0.5, float("nan"), 2.0, 2.0, -1.0])
    assert largest(values, 3).tolist() == [1, 2, 3]
