"""Ranking attributed cases by their effect on the drift (torch-free: the pytest summary uses it).

Owns the order in which interventions are listed: the largest |log| of the mean |diff| ratio
first, then the larger side movement; cases whose ratio is undefined (a zero-drift baseline)
last. Knows nothing about how an entry was computed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pytest_logprob_drift.attribution.document import Case


def rank_key(entry: Mapping[str, Any]) -> tuple[int, float, float]:
    """Strongest effect first: |log mean ratio|, then the larger side movement; cases whose
    ratio is undefined (a zero-drift baseline) last (an entry as ``attribute`` builds it)."""
    ratio = entry["effect"]["mean_ratio"]["value"] if entry.get("effect") else None
    moved = max(entry["rollout"]["max_abs_delta"], entry["training"]["max_abs_delta"])
    return _key(ratio, moved)


def case_rank_key(case: Case) -> tuple[int, float, float]:
    """``rank_key`` of a decoded case."""
    moved = max(case.rollout.max_abs_delta, case.training.max_abs_delta)
    return _key(case.effect.mean_ratio.value, moved)


def _key(ratio: float | None, moved: float) -> tuple[int, float, float]:
    if ratio is None or ratio <= 0:
        return (1, 0.0, -moved)
    return (0, -abs(math.log(ratio)), -moved)
