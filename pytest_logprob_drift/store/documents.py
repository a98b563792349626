"""The types of the sealed documents of an attempt and a run, decoded at the store's edge.

Owns one frozen ``msgspec`` type per sealed document beside ``comparison.json`` (whose type is
``numerics.comparison.Comparison``) and ``attribution.json`` (``attribution.document``): an
attempt's ``requested.json`` (``Requested``), ``materialized.json`` (``Materialized``),
``actual.json`` (``Actual``) and ``identity.json`` (``IdentityDocument``, with its
``ExecutionKeyPayload``), an imported step's ``imported.json`` (``ImportedStep``), a run's
``experiment.json`` (``ExperimentDocument``, with the ``ImportSource`` of an imported run) and
a ``plan.jsonl`` row (``PlanRow``). Every member the writers write is declared (an unknown one
is refused); a member that older writers did not write has a default. ``ATTEMPT_DOCUMENTS``
maps each attempt document's file name to its type: a later sealed document is one type here
and one line there. What an engine records about itself (a side's identity, its read-back,
its evidence, a binding's runtime record) is kept whole as a JSON object: the tool shows or
compares it as a whole and reads no member of it. Knows nothing about what the fields mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

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


Index = Annotated[int, msgspec.Meta(ge=0)]
"""A non-negative integer (a step, a line, a position in a list)."""
IMPORT_FORMATS = ("nemo-rl", "slime", "jsonl")
"""The formats ``logprob-drift import`` reads (``production.formats``)."""
ImportFormat = Literal["nemo-rl", "slime", "jsonl"]


class ImportedRow(Document, frozen=True, kw_only=True):
    """Where one row of an imported step's token grid came from: the input file (an index into
    ``ImportedStep.inputs``), its 1-based line (a JSONL line, a Parquet row) or its index in a
    slime dump's ``samples`` list, and the framework's own id of the sample (NeMo-RL's ``idx``,
    slime's ``sample_index``, the neutral format's ``sample``; None when it has none)."""

    input: Index
    line: Index | None = None
    index: Index | None = None
    sample: Index | None = None


class ImportedStep(Document, frozen=True, kw_only=True):
    """``imported.json``: one training step of a production run, imported (``logprob-drift
    import``): the format, the step, the input files it was read from, the SHA-256 of the
    step's own source bytes (what its case id hashes), the source fields each side's logprobs
    came from, the dtype they are sealed in, and one ``ImportedRow`` per row of the token grid,
    in grid order (the ``sample`` of a worst token is a grid row)."""

    schema_version: Literal["cross_config.imported_step.v1"]
    format: ImportFormat
    step: Index
    inputs: tuple[str, ...]
    rows_sha256: str
    rollout_logprobs: str
    training_logprobs: str
    active: str
    logprob_dtype: Literal["float32", "float64"]
    samples: Index
    rows: tuple[ImportedRow, ...]

    def __post_init__(self) -> None:
        if self.samples != len(self.rows):
            raise ValueError(f"samples is {self.samples}, rows holds {len(self.rows)} - at `$`")
        for number, row in enumerate(self.rows):
            if row.input >= len(self.inputs):
                raise ValueError(
                    f"input {row.input} names no file of inputs - at `$.rows[{number}]`"
                )


ATTEMPT_DOCUMENTS: Mapping[str, type[Document]] = {
    layout.REQUESTED: Requested,
    layout.MATERIALIZED: Materialized,
    layout.ACTUAL: Actual,
    layout.IDENTITY: IdentityDocument,
    layout.IMPORTED: ImportedStep,
}
"""Each sealed JSON document of an attempt beside ``comparison.json``, and its type (those of
``layout.RECORD_FILES`` in every attempt, ``layout.OPTIONAL_DOCUMENTS`` where sealed)."""


class ImportedInput(Document, frozen=True, kw_only=True):
    """One input file of an imported run, as it was read: its path as given, SHA-256 and
    size."""

    path: str
    sha256: str
    size: Index


class ImportSource(Document, frozen=True, kw_only=True):
    """``experiment.json``'s ``imported``: what an imported run was read from (the format,
    every input file with its SHA-256 and size, the fields read, the limits applied)."""

    schema_version: Literal["cross_config.import.v1"]
    format: ImportFormat
    inputs: tuple[ImportedInput, ...]
    fields: tuple[str, ...]
    steps: Index
    samples: Index
    max_input_bytes: Index


class ExperimentDocument(Document, frozen=True, kw_only=True):
    """A run's ``experiment.json``: what the run is an experiment of."""

    experiment_id: str
    scenario_id: str
    scenario: JSONObject
    contract: JSONObject
    strategy: str
    strict_fallback: bool
    identity: JSONObject
    imported: ImportSource | msgspec.UnsetType = msgspec.UNSET
    """What an imported run (``logprob-drift import``) was read from; absent for a run the
    tool executed."""


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
