"""The sealed attribution document's one type: ``attribution.json`` as a frozen msgspec record.

Owns ``Attribution`` and its parts, every member ``attribution.analysis.attribute`` writes
(an unknown member is refused); the members attributions sealed before them lack (the per-case
``ess``, ``path`` and ``layers``, a comparison's ``p99_ratio``, the noise floor's ``layers``)
are ``msgspec.UNSET`` when absent, so a decoded document encodes back to the bytes it was
decoded from. ``read_attribution_bytes`` decodes the bytes once (``store.decode``: the JSON
path of a value of the wrong type) and enforces the rules between members: the ranking names
only the document's cases, the noise floor's repeats count the inputs' baseline repeats, and
the inputs name the baseline first. ``document_json`` is a record as JSON data again (for
``report --json``, ``run --json`` and comparing with a recomputation). Torch-free (the pytest
summary reads it); knows nothing about how the document is computed, sealed or shown.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from pytest_logprob_drift.store.decode import Document, JSONDocumentError, decode


class Input(Document, frozen=True, kw_only=True):
    """One attempt the attribution was computed from (the baseline first, then its repeats,
    then the cases), with the SHA-256 of its ``COMPLETE``."""

    case_id: str
    attempt_id: str
    complete_sha256: str


class Baseline(Document, frozen=True, kw_only=True):
    case_id: str
    attempt_id: str


class StateFloor(Document, frozen=True, kw_only=True):
    """The noise floor of one state's rollout-vs-training median relative error."""

    state: str
    median_rel_error: float


class NoiseFloor(Document, frozen=True, kw_only=True):
    measured: bool
    repeats: int
    rollout_max_abs_delta: float
    training_max_abs_delta: float
    layers: list[StateFloor] | UnsetType = UNSET
    """Per state (``diagnostics.layers.attribution.layer_noise_floor``); absent without one."""


class Movement(Document, frozen=True, kw_only=True):
    """How far one side moved against the reference on the shared tokens (``align``)."""

    shared_tokens: int
    max_abs_delta: float
    mean_abs_delta: float
    bitwise_equal_fraction: float
    first_moved_offset: int | None


class Reference(Document, frozen=True, kw_only=True):
    case_id: str
    label: str


class PathMovement(Document, frozen=True, kw_only=True):
    """The rollout's prefill replay against the reference's (opt-in ``diagnostics.replay``)."""

    prefill: Movement
    classification: str


class LayerSide(Document, frozen=True, kw_only=True):
    """One side's attribution by layer (``diagnostics.layers.attribution``)."""

    positions: int
    rows_compared: int
    first_moved_layer: str | None
    max_rel_error: float
    logits_max_rel_error: float


class Layers(Document, frozen=True, kw_only=True):
    """The attribution by layer (opt-in ``diagnostics.layers``): the sides that have one."""

    training: LayerSide | UnsetType = UNSET
    rollout: LayerSide | UnsetType = UNSET
    drift_enters: str | None


class Comparison(Document, frozen=True, kw_only=True):
    """A case against one reference (the baseline, or a pairwise case's parent)."""

    reference: Reference
    shared_tokens: int
    first_divergence: list[int | None]
    earliest_divergence: int | None
    rollout: Movement
    training: Movement
    classification: str
    path: PathMovement | UnsetType = UNSET
    layers: Layers | UnsetType = UNSET


class Ratio(Document, frozen=True, kw_only=True):
    """A ratio case/reference with its bootstrap interval (None: the reference is 0)."""

    value: float | None
    low: float | None
    high: float | None
    excludes_one: bool


class Effect(Document, frozen=True, kw_only=True):
    """The case's effect on the drift itself (``attribution.effect``)."""

    mean_ratio: Ratio
    p99_ratio: Ratio | UnsetType = UNSET
    case_mean_abs_diff: float
    reference_mean_abs_diff: float
    resamples: int
    seed: int
    confidence: float


class Case(Comparison, frozen=True, kw_only=True):
    """One attributed case: against the baseline, its effect, its ESS, its parents."""

    case_id: str
    label: str
    changed: list[str]
    attempt_id: str
    effect: Effect
    ess: float | UnsetType = UNSET
    """The normalized ESS (``diagnostics.importance_sampling.attribution``); absent in
    documents sealed before."""
    parents: list[Comparison]


class Skipped(Document, frozen=True, kw_only=True):
    label: str
    reason: str


class Attribution(Document, frozen=True, kw_only=True):
    """``attribution.json``."""

    schema_version: str
    experiment_id: str
    baseline: Baseline
    noise_floor: NoiseFloor
    cases: list[Case]
    ranking: list[str]
    skipped: list[Skipped]
    inputs: list[Input]

    def case(self, label: str) -> Case:
        """The case labelled ``label`` (KeyError when there is none)."""
        for case in self.cases:
            if case.label == label:
                return case
        raise KeyError(label)

    def ranked(self) -> list[Case]:
        """The cases in ranking order (the ranking names only cases of the document)."""
        by_label = {case.label: case for case in self.cases}
        return [by_label[label] for label in self.ranking]


def read_attribution_bytes(data: bytes) -> Attribution:
    """The record in ``data`` (``JSONDocumentError`` with the JSON path otherwise)."""
    document = decode(data, Attribution)
    problem = _rules_problem(document)
    if problem is not None:
        raise JSONDocumentError(problem)
    return document


def read_case_bytes(data: bytes | str) -> Case:
    """One case's entry (as the plugin carries it in its junit property)."""
    return decode(data, Case)


def _rules_problem(document: Attribution) -> str | None:
    """Where the members of a well-typed document disagree with each other."""
    labels = {case.label for case in document.cases}
    for index, label in enumerate(document.ranking):
        if label not in labels:
            return f"$.ranking[{index}]: names no case of the document"
    if not document.inputs:
        return "$.inputs: names no attempt (the baseline's comes first)"
    repeats = document.noise_floor.repeats
    if not 0 <= repeats < len(document.inputs):
        return f"$.noise_floor.repeats: {repeats} is not a count of the inputs' baseline repeats"
    return None


def document_json(record: msgspec.Struct) -> Any:
    """A record as the JSON data it was decoded from (absent members left out)."""
    return msgspec.to_builtins(record)
