"""The materiality rule of issue 60 applied by hand to a sealed run's files: the verdict
recomputed from ``token_diffs.pt`` in float64 with numpy, the threshold sealed beside it, the
sealed attribution document's ranking split into material interventions and those within the
contract (a PASS whose max |diff| is below a tenth of the threshold)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch


def verdict_by_hand(attempt: Path) -> tuple[str, float, float]:
    """``(outcome, max |diff|, threshold)`` of an attempt from its sealed ``token_diffs.pt``
    (digest checked against the seal), in float64 with numpy."""
    seal = json.loads((attempt / "COMPLETE").read_text())
    raw = (attempt / "token_diffs.pt").read_bytes()
    assert hashlib.sha256(raw).hexdigest() == seal["files"]["token_diffs.pt"]
    diffs = torch.load(attempt / "token_diffs.pt", weights_only=True)
    active = diffs["active_mask"].numpy().astype(bool)
    training = diffs["training_logprobs"].to(torch.float64).numpy()
    rollout = diffs["rollout_logprobs"].to(torch.float64).numpy()
    threshold = float(diffs["threshold"].item())
    diff = np.abs(training - rollout)[active]
    outcome = "MISMATCH" if bool((diff > threshold).any()) else "PASS"
    return outcome, float(diff.max()), threshold


def by_hand(run_dir: Path) -> dict[str, Any]:
    """The sealed ranking and, applied by hand, which labels are within the contract."""
    (directory,) = sorted((run_dir / "attributions").iterdir())
    document = json.loads((directory / "attribution.json").read_text())
    within = []
    for entry in document["cases"]:
        outcome, max_diff, threshold = verdict_by_hand(
            run_dir / "cases" / entry["case_id"] / entry["attempt_id"]
        )
        sealed = json.loads(
            (
                run_dir / "cases" / entry["case_id"] / entry["attempt_id"] / "comparison.json"
            ).read_text()
        )
        assert sealed["outcome"] == outcome, entry["label"]
        if outcome == "PASS" and max_diff < 0.1 * threshold:
            within.append(entry["label"])
    ranking = document["ranking"]
    return {
        "ranking": ranking,
        "within": [label for label in ranking if label in within],
        "material": [label for label in ranking if label not in within],
        "document": (directory / "attribution.json").read_bytes(),
    }
