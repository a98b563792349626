"""Ranking attributed cases by their effect on the drift (torch-free: the pytest summary uses it).

Owns the order in which interventions are listed: the largest |log| of the mean |diff| ratio
first, then the larger side movement; cases whose ratio is undefined (a zero-drift baseline)
last. Knows nothing about how an entry was computed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def rank_key(entry: Mapping[str, Any]) -> tuple[int, float, float]:
    """Strongest effect first: |log mean ratio|, then the larger side movement; cases whose
    ratio is undefined (a zero-drift baseline) last."""
    ratio = entry["effect"]["mean_ratio"]["value"] if entry.get("effect") else None
    moved = max(entry["rollout"]["max_abs_delta"], entry["training"]["max_abs_delta"])
    if ratio is None or ratio <= 0:
        return (1, 0.0, -moved)
    return (0, -abs(math.log(ratio)), -moved)
