"""Attribution of a run: which knob moved which side, by how much, against the baseline.

Owns turning the sealed executions of one experiment (the baseline, its repeats, every other
case) into the attribution document: per case and per side, the movement against the baseline
on the tokens they share (``align``); the effect on the drift itself with its bootstrap
interval (``effect``); the run-to-run noise floor from the baseline's repeats; a
classification in words; pairwise cases against each single-knob parent; and a ranking of the
interventions by effect. It is evidence beside the verdicts and never changes an outcome. Reads
sealed tensors only through the store's digest-checked loader. Knows nothing about engines,
frontends or how the document is sealed.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pytest_logprob_drift.attribution.align import Alignment, Movement, align, movement
from pytest_logprob_drift.attribution.effect import abs_diff_rows, drift_effect
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.store.artifacts import COMPLETE, read_seal
from pytest_logprob_drift.store.resume import load_sealed_json, load_sealed_tensors

ATTRIBUTION_SCHEMA_VERSION = "cross_config.attribution.v1"
ATTRIBUTED_OUTCOMES = (Outcome.PASS.value, Outcome.MISMATCH.value)
"""Only executions whose identity held and whose scores are sealed are compared."""

NO_EFFECT = "no effect (bitwise identical on both sides)"
WITHIN_FLOOR = "within the noise floor"


@dataclass(frozen=True, slots=True, kw_only=True)
class SealedExecution:
    """One sealed attempt's scores, as attribution reads them."""

    case_id: str
    label: str
    changed: tuple[str, ...]
    requested: Mapping[str, Any]
    attempt_id: str
    complete_sha256: str
    outcome: str
    rollout: Mapping[str, torch.Tensor]
    training_logprobs: torch.Tensor | None

    def reference(self) -> dict[str, str]:
        return {
            "case_id": self.case_id,
            "attempt_id": self.attempt_id,
            "complete_sha256": self.complete_sha256,
        }


def load_execution(attempt_dir: Path) -> SealedExecution:
    """Read an attempt through its seal (SealError if anything does not match)."""
    seal = read_seal(attempt_dir)
    comparison = load_sealed_json(attempt_dir, "comparison.json", seal)
    requested = load_sealed_json(attempt_dir, "requested.json", seal)
    complete = hashlib.sha256((attempt_dir / COMPLETE).read_bytes()).hexdigest()
    has_scores = "score_rollout.pt" in seal.files and "score_training.pt" in seal.files
    rollout = load_sealed_tensors(attempt_dir, "score_rollout.pt", seal) if has_scores else {}
    training = (
        load_sealed_tensors(attempt_dir, "score_training.pt", seal)["logprobs"]
        if has_scores
        else None
    )
    return SealedExecution(
        case_id=seal.case_id,
        label=str(comparison.get("label", requested.get("label", ""))),
        changed=tuple(requested.get("changed", ())),
        requested=dict(requested.get("knobs", {})),
        attempt_id=seal.attempt_id,
        complete_sha256=complete,
        outcome=str(comparison["outcome"]),
        rollout=rollout,
        training_logprobs=training,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class SideFloor:
    rollout: float
    training: float
    measured: bool


def _sides(
    case: SealedExecution, reference: SealedExecution
) -> tuple[Alignment, Movement, Movement]:
    assert case.training_logprobs is not None and reference.training_logprobs is not None
    alignment = align(case.rollout, reference.rollout)
    rollout = movement(alignment, case.rollout["logprobs"], reference.rollout["logprobs"])
    training = movement(alignment, case.training_logprobs, reference.training_logprobs)
    return alignment, rollout, training


def classify(alignment: Alignment, rollout: Movement, training: Movement, floor: SideFloor) -> str:
    """The case's effect in words (see the module docstring's vocabulary)."""
    parts: list[str] = []
    earliest = alignment.earliest_divergence
    if earliest is not None:
        parts.append(f"changed the sampled tokens from position {earliest}")
    moved_rollout = rollout.max_abs_delta > floor.rollout
    moved_training = training.max_abs_delta > floor.training

    def since(*sides: Movement) -> str:
        first = [s.first_moved_offset for s in sides if s.first_moved_offset is not None]
        return f" from position {min(first)}" if first else ""

    if moved_rollout and moved_training:
        parts.append("moved both" + since(rollout, training))
    elif moved_rollout:
        parts.append("moved the rollout side" + since(rollout))
    elif moved_training:
        parts.append("moved the training side" + since(training))
    if parts:
        return "; ".join(parts)
    if rollout.max_abs_delta == 0.0 and training.max_abs_delta == 0.0:
        return NO_EFFECT
    return WITHIN_FLOOR


def _comparison(
    case: SealedExecution, reference: SealedExecution, floor: SideFloor
) -> dict[str, Any]:
    alignment, rollout, training = _sides(case, reference)
    return {
        "reference": {"case_id": reference.case_id, "label": reference.label},
        "shared_tokens": alignment.shared_tokens,
        "first_divergence": list(alignment.first_divergence),
        "earliest_divergence": alignment.earliest_divergence,
        "rollout": rollout.to_json(),
        "training": training.to_json(),
        "classification": classify(alignment, rollout, training, floor),
    }


def noise_floor(baseline: SealedExecution, repeats: Sequence[SealedExecution]) -> SideFloor:
    """The largest movement of any repeat of the baseline against the baseline itself."""
    rollout = training = 0.0
    for repeat in repeats:
        _, r, t = _sides(repeat, baseline)
        rollout, training = max(rollout, r.max_abs_delta), max(training, t.max_abs_delta)
    return SideFloor(rollout=rollout, training=training, measured=bool(repeats))


def _parents(case: SealedExecution, others: Sequence[SealedExecution]) -> list[SealedExecution]:
    """For a pairwise case, the single-knob cases that change one of its knobs to its value."""
    if len(case.changed) < 2:
        return []
    return [
        other
        for other in others
        if len(other.changed) == 1
        and other.changed[0] in case.changed
        and other.requested.get(other.changed[0]) == case.requested.get(other.changed[0])
    ]


def rank_key(entry: Mapping[str, Any]) -> tuple[int, float, float]:
    """Strongest effect first: |log mean ratio|, then the larger side movement; cases whose
    ratio is undefined (a zero-drift baseline) last."""
    ratio = entry["effect"]["mean_ratio"]["value"] if entry.get("effect") else None
    moved = max(entry["rollout"]["max_abs_delta"], entry["training"]["max_abs_delta"])
    if ratio is None or ratio <= 0:
        return (1, 0.0, -moved)
    return (0, -abs(math.log(ratio)), -moved)


def attribute(
    experiment_id: str,
    baseline: SealedExecution,
    repeats: Sequence[SealedExecution],
    cases: Sequence[SealedExecution],
) -> dict[str, Any]:
    """The attribution document of one run (plain JSON data)."""
    skipped: list[dict[str, str]] = []
    usable = [baseline, *repeats]
    if any(e.outcome not in ATTRIBUTED_OUTCOMES or e.training_logprobs is None for e in usable):
        raise ValueError("the baseline has no comparable sealed scores")
    floor = noise_floor(baseline, repeats)
    comparable: list[SealedExecution] = []
    assert baseline.training_logprobs is not None
    for case in cases:
        if case.outcome not in ATTRIBUTED_OUTCOMES or case.training_logprobs is None:
            skipped.append(
                {
                    "label": case.label,
                    "reason": f"outcome {case.outcome} has no comparable sealed scores",
                }
            )
        else:
            comparable.append(case)
    baseline_rows = abs_diff_rows(
        baseline.training_logprobs, baseline.rollout["logprobs"], baseline.rollout["active_mask"]
    )
    entries: list[dict[str, Any]] = []
    for case in comparable:
        assert case.training_logprobs is not None
        entry = {
            "case_id": case.case_id,
            "label": case.label,
            "changed": list(case.changed),
            "attempt_id": case.attempt_id,
            **_comparison(case, baseline, floor),
        }
        rows = abs_diff_rows(
            case.training_logprobs, case.rollout["logprobs"], case.rollout["active_mask"]
        )
        entry["effect"] = drift_effect(rows, baseline_rows).to_json()
        entry["parents"] = [
            _comparison(case, parent, floor) for parent in _parents(case, comparable)
        ]
        entries.append(entry)
    ranking = [e["label"] for e in sorted(entries, key=rank_key)]
    return {
        "schema_version": ATTRIBUTION_SCHEMA_VERSION,
        "experiment_id": experiment_id,
        "baseline": {"case_id": baseline.case_id, "attempt_id": baseline.attempt_id},
        "noise_floor": {
            "measured": floor.measured,
            "repeats": len(repeats),
            "rollout_max_abs_delta": floor.rollout,
            "training_max_abs_delta": floor.training,
        },
        "cases": entries,
        "ranking": ranking,
        "skipped": skipped,
        "inputs": [e.reference() for e in (baseline, *repeats, *cases)],
    }
