"""Attribution of a run: which knob moved which side, by how much, against the baseline.

Owns turning the sealed executions of one experiment (the baseline, its repeats, every other
case) into the attribution document: per case and per side, the movement against the baseline
on the tokens they share (``align``); the effect on the drift itself with its bootstrap
interval (``effect``); the run-to-run noise floor from the baseline's repeats; a
classification in words; pairwise cases against each single-knob parent; and a ranking of the
interventions by effect. The installed diagnostics' contributions
(``diagnostics.protocol.AttributionContribution``: the layers' floor and first moved layer,
the path members, the ESS) are added by looping over the registry; none is named here. It is
evidence beside the verdicts and never changes an outcome. Reads sealed tensors only through
the store's digest-checked loader. Knows nothing about engines, frontends or how the document
is sealed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from pytest_logprob_drift.attribution.align import Alignment, Movement, align, movement
from pytest_logprob_drift.attribution.document import Attribution
from pytest_logprob_drift.attribution.effect import abs_diff_rows, drift_effect, prepare
from pytest_logprob_drift.attribution.ranking import rank_key
from pytest_logprob_drift.check.resume import load_sealed_document, load_sealed_tensors
from pytest_logprob_drift.diagnostics.registry import installed
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.records import JsonObject
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.attempt import Seal, read_seal
from pytest_logprob_drift.store.comparison import parse_comparison
from pytest_logprob_drift.store.documents import KnobScalar, Requested

if TYPE_CHECKING:
    from pytest_logprob_drift.diagnostics.protocol import AttributionContribution
    from pytest_logprob_drift.numerics.comparison import Diagnostics

ATTRIBUTION_SCHEMA_VERSION = "cross_config.attribution.v1"
ATTRIBUTED_OUTCOMES = (Outcome.PASS.value, Outcome.MISMATCH.value)
"""Only executions whose identity held and whose scores are sealed are compared."""

NO_EFFECT = "no effect (bitwise identical on both sides)"
WITHIN_FLOOR = "within the noise floor"


class SealedExecution:
    """One sealed attempt as attribution reads it: its metadata at once, its scores (digest
    checked) on first use, and ``release()`` to drop them again, so that attributing hundreds
    of cases holds only a few in memory."""

    __slots__ = (
        "_files",
        "_scores",
        "attempt_dir",
        "attempt_id",
        "case_id",
        "changed",
        "complete_sha256",
        "diagnostics",
        "label",
        "outcome",
        "requested",
        "seal",
    )

    def __init__(self, attempt_dir: Path, seal: Seal | None = None) -> None:
        """``seal``: the attempt's seal as a check just verified it (its kept bytes are read
        from it, not from the files again); read and verified here otherwise."""
        self.attempt_dir = attempt_dir
        self.seal = read_seal(attempt_dir) if seal is None else seal
        comparison = parse_comparison(self.seal.read(layout.COMPARISON))
        self.case_id = self.seal.case_id
        self.attempt_id = self.seal.attempt_id
        self.label = comparison.label
        self.diagnostics: Diagnostics = comparison.diagnostics
        self.changed: tuple[str, ...] = ()
        self.requested: Mapping[str, KnobScalar] = {}
        # an imported step of its own documents (v3 imported.json) seals no requested.json:
        # nothing was requested or changed
        if layout.REQUESTED in self.seal.files or layout.IMPORTED not in self.seal.files:
            requested = load_sealed_document(attempt_dir, layout.REQUESTED, self.seal, Requested)
            self.changed = requested.changed
            self.requested = requested.knobs
        self.outcome = comparison.outcome.value
        self.complete_sha256 = str(self.seal.manifest.sha256)  # of the COMPLETE just parsed
        self._scores: tuple[dict[str, torch.Tensor], torch.Tensor] | None = None
        self._files: dict[str, Mapping[str, torch.Tensor]] = {}

    def sealed(self, name: str) -> Mapping[str, torch.Tensor] | None:
        """The tensors of the sealed file ``name`` (digest checked, kept until ``release``;
        None: the attempt did not seal it)."""
        if name not in self.seal.files:
            return None
        if name not in self._files:
            self._files[name] = load_sealed_tensors(self.attempt_dir, name, self.seal)
        return self._files[name]

    @property
    def comparable(self) -> bool:
        """Identity held and both sides' scores are sealed."""
        files = self.seal.files
        return (
            self.outcome in ATTRIBUTED_OUTCOMES
            and layout.SCORE_ROLLOUT in files
            and layout.SCORE_TRAINING in files
        )

    def _load(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        if self._scores is None:
            rollout = load_sealed_tensors(self.attempt_dir, layout.SCORE_ROLLOUT, self.seal)
            training = load_sealed_tensors(self.attempt_dir, layout.SCORE_TRAINING, self.seal)
            self._scores = (rollout, training["logprobs"])
        return self._scores

    @property
    def rollout(self) -> Mapping[str, torch.Tensor]:
        return self._load()[0]

    @property
    def training_logprobs(self) -> torch.Tensor:
        return self._load()[1]

    def release(self) -> None:
        self._scores = None
        self._files = {}

    def reference(self) -> dict[str, str]:
        return {
            "case_id": self.case_id,
            "attempt_id": self.attempt_id,
            "complete_sha256": self.complete_sha256,
        }


def load_execution(attempt_dir: Path) -> SealedExecution:
    """An attempt read through its seal (SealError if anything does not match)."""
    return SealedExecution(attempt_dir)


@dataclass(frozen=True, slots=True, kw_only=True)
class SideFloor:
    rollout: float
    training: float
    measured: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Compared:
    """A case against one reference as a diagnostic's contribution reads it: the two sealed
    executions, their alignment, how far each side moved and the sides' noise floor."""

    case: SealedExecution
    reference: SealedExecution
    alignment: Alignment
    rollout: Movement
    training: Movement
    floor: SideFloor


Contributions = Sequence[tuple["AttributionContribution", object | None]]
"""The installed diagnostics' contributions, each with its own noise floor."""


def contributions() -> list[AttributionContribution]:
    """The installed diagnostics' contributions to the attribution document, in order."""
    return [c for d in installed() if (c := d.attribution()) is not None]


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
    case: SealedExecution,
    reference: SealedExecution,
    floor: SideFloor,
    contributed: Contributions,
) -> JsonObject:
    alignment, rollout, training = _sides(case, reference)
    compared = Compared(
        case=case,
        reference=reference,
        alignment=alignment,
        rollout=rollout,
        training=training,
        floor=floor,
    )
    document: JsonObject = {
        "reference": {"case_id": reference.case_id, "label": reference.label},
        "shared_tokens": alignment.shared_tokens,
        "first_divergence": list(alignment.first_divergence),
        "earliest_divergence": alignment.earliest_divergence,
        "rollout": rollout.to_json(),
        "training": training.to_json(),
        "classification": classify(alignment, rollout, training, floor),
    }
    for contribution, own_floor in contributed:
        _add(document, contribution.comparison_members(compared, own_floor), "a comparison")
    return document


def _add(document: JsonObject, members: JsonObject, where: str) -> None:
    """A contribution's ``members`` added to ``document`` (``where`` in the attribution); a
    ValueError naming the member when it is one the document has already."""
    for key, value in members.items():
        if key in document:
            raise ValueError(f"an attribution contribution's member {key!r} of {where} is taken")
        document[key] = value


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


def attribute(
    experiment_id: str,
    baseline: SealedExecution,
    repeats: Sequence[SealedExecution],
    cases: Sequence[SealedExecution],
) -> dict[str, Any]:
    """The attribution document of one run (plain JSON data)."""
    if not all(e.comparable for e in (baseline, *repeats)):
        raise ValueError("the baseline has no comparable sealed scores")
    floor = noise_floor(baseline, repeats)
    contributed = [(c, c.noise_floor(baseline, repeats)) for c in contributions()]
    for repeat in repeats:
        repeat.release()
    comparable = [case for case in cases if case.comparable]
    skipped = [
        {"label": case.label, "reason": f"outcome {case.outcome} has no comparable sealed scores"}
        for case in cases
        if not case.comparable
    ]
    baseline_drift = prepare(
        abs_diff_rows(
            baseline.training_logprobs,
            baseline.rollout["logprobs"],
            baseline.rollout["active_mask"],
        )
    )
    entries: list[dict[str, Any]] = []
    for case in comparable:
        entry = {
            "case_id": case.case_id,
            "label": case.label,
            "changed": list(case.changed),
            "attempt_id": case.attempt_id,
            **_comparison(case, baseline, floor, contributed),
        }
        rows = abs_diff_rows(
            case.training_logprobs, case.rollout["logprobs"], case.rollout["active_mask"]
        )
        entry["effect"] = drift_effect(rows, baseline_drift).to_json()
        entry["parents"] = [
            _comparison(case, parent, floor, contributed) for parent in _parents(case, comparable)
        ]
        for contribution, _ in contributed:
            _add(entry, contribution.case_members(case), "a case")
        entries.append(entry)
        case.release()
        for parent in _parents(case, comparable):
            parent.release()
    ranking = [e["label"] for e in sorted(entries, key=rank_key)]
    floor_document: JsonObject = {
        "measured": floor.measured,
        "repeats": len(repeats),
        "rollout_max_abs_delta": floor.rollout,
        "training_max_abs_delta": floor.training,
    }
    for contribution, own in contributed:
        _add(floor_document, contribution.floor_members(own), "the noise floor")
    return {
        "schema_version": ATTRIBUTION_SCHEMA_VERSION,
        "experiment_id": experiment_id,
        "baseline": {"case_id": baseline.case_id, "attempt_id": baseline.attempt_id},
        "noise_floor": floor_document,
        "cases": entries,
        "ranking": ranking,
        "skipped": skipped,
        "inputs": [e.reference() for e in (baseline, *repeats, *cases)],
    }


def as_recorded(recorded: Attribution, recomputed: Attribution) -> Attribution:
    """``recomputed`` in the form of ``recorded``: each installed diagnostic's contribution
    leaves out its members where ``recorded`` was sealed before they existed."""
    for contribution in contributions():
        recomputed = contribution.as_recorded(recorded, recomputed)
    return recomputed
