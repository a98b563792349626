"""Typed attribution records for unit tests (test support): a whole case entry or document of
``attribution.document``'s type, decoded from JSON data like the sealed file's, with only the
members a test cares about given."""

from __future__ import annotations

import json
from typing import Any

from pytest_logprob_drift.attribution.document import Attribution, Case, read_attribution_bytes
from pytest_logprob_drift.store.decode import decode


def movement(max_abs_delta: float = 0.0) -> dict[str, Any]:
    return {
        "shared_tokens": 4,
        "max_abs_delta": max_abs_delta,
        "mean_abs_delta": max_abs_delta,
        "bitwise_equal_fraction": 1.0 if max_abs_delta == 0 else 0.0,
        "first_moved_offset": None if max_abs_delta == 0 else 0,
    }


def ratio(value: float | None = 1.0, low: float | None = None, high: float | None = None) -> Any:
    return {"value": value, "low": low, "high": high, "excludes_one": False}


def case_data(label: str, **members: Any) -> dict[str, Any]:
    """A case entry's JSON data: ``members`` replace the defaults (nothing moved)."""
    data: dict[str, Any] = {
        "case_id": f"id-{label}",
        "label": label,
        "changed": [label],
        "attempt_id": f"attempt-{label}",
        "reference": {"case_id": "id-baseline", "label": "baseline"},
        "shared_tokens": 4,
        "first_divergence": [None],
        "earliest_divergence": None,
        "rollout": movement(),
        "training": movement(),
        "classification": "no effect (bitwise identical on both sides)",
        "effect": {
            "mean_ratio": ratio(),
            "case_mean_abs_diff": 0.0,
            "reference_mean_abs_diff": 0.0,
            "resamples": 1000,
            "seed": 1,
            "confidence": 0.95,
        },
        "parents": [],
    }
    data.update(members)
    return data


def case(label: str, **members: Any) -> Case:
    return decode(json.dumps(case_data(label, **members)), Case)


def attribution(cases: list[dict[str, Any]], ranking: list[str], **members: Any) -> Attribution:
    """A document of ``cases`` (``case_data``) ranked as ``ranking``."""
    return read_attribution_bytes(json.dumps(attribution_data(cases, ranking, **members)).encode())


def attribution_data(
    cases: list[dict[str, Any]], ranking: list[str], **members: Any
) -> dict[str, Any]:
    """The JSON data of ``attribution``'s document (what ``attribute`` hands the writer)."""
    data: dict[str, Any] = {
        "schema_version": "cross_config.attribution.v1",
        "experiment_id": "x",
        "baseline": {"case_id": "id-baseline", "attempt_id": "attempt-baseline"},
        "noise_floor": {
            "measured": False,
            "repeats": 0,
            "rollout_max_abs_delta": 0.0,
            "training_max_abs_delta": 0.0,
        },
        "cases": cases,
        "ranking": ranking,
        "skipped": [],
        "inputs": [
            {"case_id": "id-baseline", "attempt_id": "attempt-baseline", "complete_sha256": "0"}
        ],
    }
    data.update(members)
    return data
