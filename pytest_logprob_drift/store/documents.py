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
from typing import Annotated, Any, Final, Literal

import msgspec

from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.decode import Document
from pytest_logprob_drift.store.read_back import WeightsArrived, arrived, upgraded

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
    """``actual.json``: what each side read back after scoring. v2 (``schema_version``) seals
    the read-back's parts as nested JSON; a v1 document (no ``schema_version``) sealed three of
    them as JSON text, parsed here once (``read_back.upgraded``), so every reader sees v2."""

    knobs: dict[str, JSONObject]
    read_back: JSONObject | None
    operator_provenance: tuple[JSONObject, ...]
    training_evidence: JSONObject | None
    schema_version: Literal["cross_config.actual.v2"] | msgspec.UnsetType = msgspec.UNSET

    def __post_init__(self) -> None:
        if self.read_back is None:
            return
        if self.schema_version is msgspec.UNSET:
            msgspec.structs.force_setattr(self, "read_back", upgraded(self.read_back))
        try:
            arrived(self.read_back)
        except msgspec.ValidationError as exc:
            message, marker, below = str(exc).rpartition(" - at `$")
            if not marker:  # a problem of the part itself (a member missing)
                message, below = str(exc), "`"
            raise ValueError(f"{message} - at `$.read_back.vllm.weights_arrived{below}") from None

    def weights_arrived(self) -> WeightsArrived | None:
        """How a trainer's push reached the rollout (None: nothing pushed)."""
        return None if self.read_back is None else arrived(self.read_back)


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


Sha256 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
"""A SHA-256 in lowercase hex."""
STEP_V1: Final = "cross_config.imported_step.v1"
STEP_V2: Final = "cross_config.imported_step.v2"
STEP_V3: Final = "cross_config.imported_step.v3"
"""The imported step's own document set: ``imported.json`` is the attempt's one document
beside ``comparison.json`` (no requested/materialized/actual/identity: nothing was planned,
materialized or read back), and it carries the importing environment the execution key
hashes (``check.imported_check.imported_key_payload``)."""


class InputDigest(Document, frozen=True, kw_only=True):
    """What a step read from one of its input files: the SHA-256 and size of the step's own
    bytes of it (the whole file for a NeMo-RL step file and a slime dump, each rank's file
    for slime's per-rank dumps; the step's lines of it for the neutral format, whose file
    may hold many steps and grow while followed)."""

    sha256: Sha256
    size: Index


class ImportedStep(Document, frozen=True, kw_only=True):
    """``imported.json``: one training step of a production run, imported (``logprob-drift
    import``): the format, the step, the input files it was read from, the SHA-256 of the
    step's own source bytes (what its case id hashes), the source fields each side's logprobs
    came from, the dtype they are sealed in, and one ``ImportedRow`` per row of the token grid,
    in grid order (the ``sample`` of a worst token is a grid row). v2 adds ``input_digests``:
    one ``InputDigest`` per member of ``inputs``, in that order (provenance: a followed run
    has no whole-run list of its inputs); a v1 document has none. v3 (``STEP_V3``) adds
    ``environment`` and is the attempt's only document beside ``comparison.json``; v1 and v2
    steps sealed requested/materialized/actual/identity documents with empty members."""

    schema_version: Literal[
        "cross_config.imported_step.v1",
        "cross_config.imported_step.v2",
        "cross_config.imported_step.v3",
    ]
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
    input_digests: tuple[InputDigest, ...] | msgspec.UnsetType = msgspec.UNSET
    environment: dict[str, str | None] | msgspec.UnsetType = msgspec.UNSET
    """v3: the importing environment (python, torch, this package's version), which an
    earlier form sealed in ``identity.json``'s execution-key payload."""

    @property
    def self_contained(self) -> bool:
        """Whether this is the step's own document set (v3: no requested, materialized, actual
        or identity document beside it)."""
        return self.schema_version == STEP_V3

    def __post_init__(self) -> None:
        digests = self.input_digests
        if self.schema_version == STEP_V1 and digests is not msgspec.UNSET:
            raise ValueError(f"a {STEP_V1} document has no input_digests - at `$.input_digests`")
        if self.self_contained and self.environment is msgspec.UNSET:
            raise ValueError(f"{STEP_V3} requires environment - at `$`")
        if not self.self_contained and self.environment is not msgspec.UNSET:
            raise ValueError(
                f"a {self.schema_version} document has no environment - at `$.environment`"
            )
        if self.schema_version != STEP_V1:
            if digests is msgspec.UNSET:
                raise ValueError(f"{self.schema_version} requires input_digests - at `$`")
            if len(digests) != len(self.inputs):
                raise ValueError(
                    f"{len(digests)} input digest(s) for {len(self.inputs)} input(s) - at "
                    "`$.input_digests`"
                )
        if self.samples != len(self.rows):
            raise ValueError(f"samples is {self.samples}, rows holds {len(self.rows)} - at `$`")
        for number, row in enumerate(self.rows):
            if row.input >= len(self.inputs):
                raise ValueError(
                    f"input {row.input} names no file of inputs - at `$.rows[{number}]`"
                )


WeightSide = Literal["rollout", "training"]
DifferenceKind = Literal["missing", "shape", "dtype", "values", "slice", "unexpected", "packed"]
"""How a side's tensor differs from the checkpoint's: not held at all, another shape, another
dtype than the side declares, other values (whole tensor), other values in one
tensor-parallel rank's slice, a tensor the side holds that no checkpoint tensor maps to, or
a prepacked expert buffer that is not the prepack of what the layer loaded."""


class SliceDigest(Document, frozen=True, kw_only=True):
    """One tensor-parallel rank's slice of a checkpoint tensor (rows ``dim`` 0 or columns
    ``dim`` 1, ``[start, stop)`` in the checkpoint's layout): the checkpoint's digest of it and
    the digest of what that rank holds."""

    rank: Index
    dim: Index
    start: Index
    stop: Index
    checkpoint: str
    side: str


class TensorDigest(Document, frozen=True, kw_only=True):
    """One checkpoint tensor: its shape, the checkpoint's digest cast to the side's dtype,
    the side's digest of what it holds under that name (None: not held), the side's shape and
    dtype, and per-rank slice digests where the side shards it."""

    name: str
    shape: tuple[Index, ...]
    checkpoint: str
    side: str | None
    side_shape: tuple[Index, ...] | None
    side_dtype: str | None
    slices: tuple[SliceDigest, ...] = ()
    source: str | None = None
    """The checkpoint tensor compared with, when not ``name`` itself (an untied copy of a tied
    LM head is compared with the embedding it was copied from)."""
    dtype: str | None = None
    """The dtype the side declares for this tensor, when not the document's (a float32 LM
    head)."""
    via: str | None = None
    """A dtype the checkpoint tensor is cast to before ``dtype`` (a float32 LM head copied from
    a bfloat16 body: the checkpoint cast to bfloat16, then to float32)."""


class NamedReason(Document, frozen=True, kw_only=True):
    """A tensor name and why it is listed (skipped, or held without a checkpoint source)."""

    name: str
    reason: str


class TiedTensor(Document, frozen=True, kw_only=True):
    """A tensor the side holds as the very storage of checkpoint tensor ``shares`` (a tied LM
    head), with no checkpoint tensor of its own name."""

    name: str
    shares: str


class WeightDifference(Document, frozen=True, kw_only=True):
    """One way a side's weights differ from the checkpoint's (``check.weights_check``):
    the tensor, the side, the tensor-parallel rank (None: the whole tensor), the kind, and
    how (shapes, dtypes, or digests and, where the tensor was at hand, the max |difference|
    and the share of elements that differ)."""

    name: str
    side: WeightSide
    rank: Index | None
    kind: DifferenceKind
    detail: str


class PackedBuffer(Document, frozen=True, kw_only=True):
    """A prepacked MoE expert buffer read back after vLLM's post-load processing (the CPU
    build): the layer and tensor (vLLM's names), the tensor-parallel rank, the SHA-256 of
    vLLM's own prepack applied to a copy of what the layer loaded (``expected``) and of what
    the layer holds (``held``)."""

    layer: str
    tensor: str
    rank: Index
    expected: str
    held: str


class WeightsDocument(Document, frozen=True, kw_only=True):
    """``weights_rollout.json`` / ``weights_training.json``: one side's weight digests, per
    checkpoint tensor, after its engine was built, with the checkpoint's digests beside them
    (``sha256sum``-style hex), what was skipped and why, tied tensors, tensors held that no
    checkpoint tensor maps to, a refusal (a layout the mapping does not cover) and the
    differences found (``check.weights_check`` recomputes them)."""

    schema_version: Literal["cross_config.weights.v1"]
    side: WeightSide
    runtime: str
    dtype: str
    point: str
    """Where the weights were read (e.g. before vLLM's post-load processing)."""
    tensor_parallel_size: Index
    tensors: tuple[TensorDigest, ...]
    tied: tuple[TiedTensor, ...] = ()
    skipped: tuple[NamedReason, ...] = ()
    extra: tuple[NamedReason, ...] = ()
    refused: str | None = None
    differences: tuple[WeightDifference, ...] = ()
    packed: tuple[PackedBuffer, ...] = ()
    """The prepacked expert buffers read back after processing (empty: none were, as in runs
    sealed before this member existed)."""


ATTEMPT_DOCUMENTS: Mapping[str, type[Document]] = {
    layout.REQUESTED: Requested,
    layout.MATERIALIZED: Materialized,
    layout.ACTUAL: Actual,
    layout.IDENTITY: IdentityDocument,
    layout.IMPORTED: ImportedStep,
    layout.WEIGHTS_ROLLOUT: WeightsDocument,
    layout.WEIGHTS_TRAINING: WeightsDocument,
}
"""Each sealed JSON document of an attempt beside ``comparison.json``, and its type (those of
``layout.RECORD_FILES`` in every attempt, ``layout.OPTIONAL_DOCUMENTS`` where sealed)."""


def document_file(document: Document) -> str:
    """The file of an attempt ``document`` is sealed as, picked from its type
    (``ATTEMPT_DOCUMENTS``; a ``WeightsDocument`` by its side); ``TypeError`` for a type that
    is no attempt document."""
    if isinstance(document, WeightsDocument):
        return layout.WEIGHTS_ROLLOUT if document.side == "rollout" else layout.WEIGHTS_TRAINING
    for name, kind in ATTEMPT_DOCUMENTS.items():
        if type(document) is kind:
            return name
    raise TypeError(f"{type(document).__name__} is no attempt document")


class ImportedInput(Document, frozen=True, kw_only=True):
    """One input file of an imported run, as it was read: its path as given, SHA-256 and
    size."""

    path: str
    sha256: str
    size: Index


class ImportSource(
    Document,
    frozen=True,
    kw_only=True,
    tag_field="schema_version",
    tag="cross_config.import.v1",
):
    """``experiment.json``'s ``imported`` of a run imported at once: what it was read from
    (the format, every input file with its SHA-256 and size, the fields read, the limits
    applied, the whole-run step and sample counts that verify checks)."""

    format: ImportFormat
    inputs: tuple[ImportedInput, ...]
    fields: tuple[str, ...]
    steps: Index
    samples: Index
    max_input_bytes: Index


FOLLOWED_TAG: Final = "cross_config.import.v2"


class FollowedImportSource(
    Document,
    frozen=True,
    kw_only=True,
    tag_field="schema_version",
    tag=FOLLOWED_TAG,
):
    """``experiment.json``'s ``imported`` of a run followed while it was written (``import
    --follow``): the format, the directory followed, the fields read and the limits applied;
    no whole-run inputs or counts (the run grows step by step: each step's ``imported.json``
    and seal hold its inputs' SHA-256)."""

    format: ImportFormat
    directory: str
    fields: tuple[str, ...]
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
    imported: ImportSource | FollowedImportSource | msgspec.UnsetType = msgspec.UNSET
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
