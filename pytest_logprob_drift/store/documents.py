"""The types of the sealed documents of an attempt and a run, decoded at the store's edge.

Owns one frozen ``msgspec`` type per sealed document beside ``comparison.json`` (whose type is
``numerics.comparison.Comparison``) and ``attribution.json`` (``attribution.document``): an
attempt's ``requested.json`` (``Requested``), ``materialized.json`` (``Materialized``),
``actual.json`` (``Actual``) and ``identity.json`` (``IdentityDocument``, with its
``ExecutionKeyPayload``), a run's ``experiment.json`` (``ExperimentDocument``) and a
``plan.jsonl`` row (``PlanRow``). Every member the writers write is declared (an unknown one
is refused); a member that older writers did not write has a default. ``ATTEMPT_DOCUMENTS``
maps each attempt document's file name to its type: a later sealed document is one type here
and one line there. What an engine records about itself (a side's identity, its read-back,
its evidence, a binding's runtime record) is kept whole as a JSON object: the tool shows or
compares it as a whole and reads no member of it. Knows nothing about what the fields mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.decode import Document

JSONObject = dict[str, Any]
"""A JSON object kept whole (an engine's own record: shown or compared, never read by member)."""
KnobScalar = str | int | bool
"""A knob's value as the plan records it (``records.KnobValue``)."""


class Requested(Document, frozen=True, kw_only=True):
    """``requested.json``: the case as planned, and its binding."""

    case_id: str
    label: str
    knobs: dict[str, KnobScalar]
    changed: tuple[str, ...]
    binding: JSONObject


class Materialized(Document, frozen=True, kw_only=True):
    """``materialized.json``: how each knob was applied, and the operators bound."""

    knobs: dict[str, JSONObject]
    operators: tuple[JSONObject, ...]


class Actual(Document, frozen=True, kw_only=True):
    """``actual.json``: what each side read back after scoring."""

    knobs: dict[str, JSONObject]
    read_back: JSONObject | None
    operator_provenance: tuple[JSONObject, ...]
    training_evidence: JSONObject | None


class ExecutionKeyPayload(Document, frozen=True, kw_only=True):
    """What the execution key hashes (``store.attempt.execution_key`` of ``payload()``)."""

    version: Any
    case_id: str
    identity: Any
    materialization: Any
    requested: Any
    scorer: Any
    operators: Any
    runtime: str | None
    fingerprints: Any
    contract: JSONObject | None
    environment: dict[str, str | None] | None
    diagnostics: Any = msgspec.UNSET

    def payload(self) -> JSONObject:
        """The payload as it was sealed (an absent member stays absent)."""
        document: JSONObject = msgspec.to_builtins(self)
        return document


class IdentityDocument(Document, frozen=True, kw_only=True):
    """``identity.json``: the identity planned, each side's own record of it, and the
    execution-key payload."""

    identity: JSONObject
    rollout: JSONObject | None
    training: JSONObject | None
    execution_key_payload: ExecutionKeyPayload


ATTEMPT_DOCUMENTS: Mapping[str, type[Document]] = {
    layout.REQUESTED: Requested,
    layout.MATERIALIZED: Materialized,
    layout.ACTUAL: Actual,
    layout.IDENTITY: IdentityDocument,
}
"""Each sealed JSON document of an attempt beside ``comparison.json``, and its type."""


class ExperimentDocument(Document, frozen=True, kw_only=True):
    """A run's ``experiment.json``: what the run is an experiment of."""

    experiment_id: str
    scenario_id: str
    scenario: JSONObject
    contract: JSONObject
    strategy: str
    strict_fallback: bool
    identity: JSONObject


class PlanRow(Document, frozen=True, kw_only=True):
    """One row of ``plan.jsonl`` (``plan.binding.case_row``)."""

    case_id: str
    label: str
    kind: str
    changed: tuple[str, ...]
    lifecycle: str | None
    requested: dict[str, KnobScalar]
    operators: tuple[JSONObject, ...]
    scenario_level: str
    device: str
    executable_by: tuple[str, ...]
    contract_version: str
    threshold: float
