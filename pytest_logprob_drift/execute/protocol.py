"""The runtime adapter protocol, three-stage materialization, fingerprints and strict rules.

Owns what every runtime must provide (``RuntimeAdapter``: materialize knobs, build a rollout
engine and a training scorer, read back actual values), the backend-neutral
``RuntimeBinding`` the runner works with (batch, side configuration, topology, scorer, operator
backends, runtime kind), the construction / distributed-context / process fingerprints that
decide engine reuse, and the strict-execution rules that turn fallback, ignored settings,
unobservable values, stale registry state and incompatible reuse into STRICT_REJECTED. Adding a
runtime adds an adapter, not a branch here or in the runner. Knows nothing about any concrete
engine; torch appears only in type hints of the protocols.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pytest_logprob_drift.plan.binding import ExecutionCase, side_topology
from pytest_logprob_drift.plan.knobs import (
    FINGERPRINTED_WHEN_NAMED,
    KNOBS,
    KnobSpec,
    Side,
    knob_lifecycle,
)
from pytest_logprob_drift.records import (
    ApplicationStatus,
    AskedDiagnostics,
    JsonObject,
    JSONScalar,
    KnobValue,
    Lifecycle,
    ScoringIdentity,
    canonical,
    canonical_json,
    frozen_mapping,
    sha256_hex,
)

if TYPE_CHECKING:
    import torch

    from pytest_logprob_drift.execute.side_settings import (
        RequestSettings,
        RolloutSettings,
        SettingsTypes,
        TrainingSettings,
    )
    from pytest_logprob_drift.numerics.comparison import KnobRecord
    from pytest_logprob_drift.registry.session import KernelReference
    from pytest_logprob_drift.store.documents import WeightsDocument
    from pytest_logprob_drift.store.read_back import ReadBackValue

    LogpKernel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    TensorBatch = Mapping[str, torch.Tensor]
else:
    LogpKernel = Callable[..., Any]
    TensorBatch = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class BoundKernel:
    """A selected-logprob kernel with the backend id it was resolved from; engines report
    ``backend`` as the actual ``logp.backend`` they used (``native`` when given none)."""

    backend: str
    kernel: Callable[..., Any]
    factory: str | None = None
    """``module:attr`` of the kernel when it can be imported by name (e.g. in a rank process)."""
    reference: KernelReference | None = None
    """What another process needs to build the same kernel and prove it did
    (``ResolvedOperator.reference``: backend, factory, factory style, target, options,
    version, build fingerprint), for runtimes that run the kernel outside this process (vLLM
    workers); None when the kernel has no importable factory."""

    def __call__(self, logits: Any, token_ids: Any) -> Any:
        return self.kernel(logits, token_ids)


def backend_of(logp: Any) -> str:
    return logp.backend if isinstance(logp, BoundKernel) else "native"


def merge_read_back(
    rollout: Mapping[str, ReadBackValue], training: Mapping[str, ReadBackValue]
) -> dict[str, ReadBackValue]:
    """Union of both sides' actual values; a knob both report differently shows both."""
    merged: dict[str, ReadBackValue] = {**rollout, **training}
    for key in set(rollout) & set(training):
        if rollout[key] != training[key]:
            merged[key] = f"rollout:{rollout[key]}|training:{training[key]}"
    return merged


@dataclass(frozen=True, slots=True, kw_only=True)
class Materialized:
    """Stage 2 of requested -> materialized -> actual for one knob."""

    value: JSONScalar
    status: ApplicationStatus
    evidence: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeBinding(AskedDiagnostics):
    """Backend-neutral execution binding of one case: all the runner passes to engines."""

    runtime_kind: str
    batch: Mapping[str, int]
    rollout: Mapping[str, JSONScalar]
    training: Mapping[str, JSONScalar]
    topology: Mapping[str, Mapping[str, int]]
    scorer: Mapping[str, JSONScalar]
    operator_backends: Mapping[str, str]
    process_fingerprint: str
    distributed_fingerprint: str
    rollout_construction_fingerprint: str
    training_construction_fingerprint: str
    diagnostics: Mapping[str, object] = field(
        default_factory=lambda: frozen_mapping({}), metadata={"sealed": False}
    )
    """Opt-in diagnostics, for the diagnostics only: each installed diagnostic's parsed config
    value by its config key (``ExperimentPlan.diagnostics``; the typed ``full_vocabulary``,
    ``replay``, ``layers`` and ``routing`` read it). Sealed in ``requested.json`` as the
    members ``full_vocabulary``, ``replay``, ``layers`` (always) and ``routing`` (only when
    on), as before it was one mapping (``sealed``); each is part of the execution key
    (``execute.provenance``). ``full_vocabulary``: both sides hand back their full next-token
    distributions at the active positions (``full_vocab``). ``replay``: after paired scoring
    the rollout engine replays its sampled sequences (``PrefillReplay`` / ``DecodeReplay``);
    builds no engine differently, so it is in no construction fingerprint. ``layers``: after
    paired scoring both sides capture and reduce their hidden states at every layer
    (``LayerCapture``); in no construction fingerprint. ``routing``: both sides capture the
    experts each MoE layer chose (``RolloutRoutingCapture``, ``TrainingRoutingCapture``): the
    rollout while it generates, the trainer teacher-forced."""
    rollout_settings: RolloutSettings = field(metadata={"sealed": False})
    """Every rollout knob typed, defaults filled in (``execute.side_settings``): what the
    rollout engine is built from. Derived from ``rollout``; never sealed or hashed."""
    training_settings: TrainingSettings = field(metadata={"sealed": False})
    """As ``rollout_settings``, for the training scorer."""
    request_settings: RequestSettings = field(metadata={"sealed": False})
    """As ``rollout_settings``, for the request-level knobs (both sides)."""

    def sealed(self) -> JsonObject:
        """The binding as ``requested.json`` seals it: every field but the typed settings and
        the diagnostics mapping, then the built-in diagnostics' members in their sealed form
        (``routing`` only when on: a binding sealed before it has none)."""
        return {
            **{
                f.name: canonical(getattr(self, f.name))
                for f in fields(self)
                if f.metadata.get("sealed", True)
            },
            "full_vocabulary": canonical(self.full_vocabulary),
            "replay": self.replay,
            "layers": canonical(self.layers),
            **({"routing": True} if self.routing else {}),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutOutput:
    """Canonical tensors (token_ids, attention_mask, active_mask, position_ids, logprobs,
    prompt_lengths) plus the side's identity view (checkpoint digest, tokenizer, ...)."""

    tensors: TensorBatch
    identity: Mapping[str, JSONScalar]
    full_vocab: Any = None
    """Only under ``RuntimeBinding.full_vocabulary``: ``[A, V]`` logits or logprobs (any float
    dtype, ``-inf`` outside a truncated support) of the distribution each reported logprob was
    taken from, one row per active position in row-major order of ``active_mask``; None when
    not asked for or not available. Never sealed."""
    sampler: str | None = None
    """Which sampler drew the tokens on this platform, as the semantic-offset diagnostic
    states it against its own reproduction (None: the runtime does not say)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingOutput:
    """Training logprobs, the tensors the scorer actually consumed, its identity view and the
    read-only evidence (violations found by the guard, empty when clean)."""

    logprobs: Any
    consumed: TensorBatch
    identity: Mapping[str, JSONScalar]
    readonly_violations: tuple[str, ...]
    evidence: Mapping[str, ReadBackValue]
    """What the scorer did, its lists and objects as nested JSON (``actual.json`` v2)."""
    full_vocab: Any = None
    """As ``RolloutOutput.full_vocab``, from the scorer's own logits."""


class RolloutEngine(Protocol):
    """A constructed rollout engine; reused while its construction fingerprint matches."""

    construction_fingerprint: str

    def generate(
        self, identity: ScoringIdentity, *, batch_size: int, logp: LogpKernel | None
    ) -> RolloutOutput: ...

    def read_back(self) -> Mapping[str, ReadBackValue]:
        """Actual values, keyed by knob path, read from the live engine (a part with parts
        as nested JSON: ``store.read_back.read_back_part``)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayOutput:
    """A rollout engine's second score of its own sampled sequences: ``logprobs`` on the
    canonical grid of the rollout's tensors (float32 ``[B, L]``, 0.0 outside ``active_mask``),
    the ``token_ids`` the engine actually scored (``[B, L]``, which must be the sampled ones)
    and what the engine did (``evidence``: e.g. whether it reused its prefix cache)."""

    logprobs: Any
    token_ids: Any
    evidence: Mapping[str, JSONScalar]


class ReplayUnavailable(Exception):
    """A replay the engine cannot do or whose result cannot be observed, with the engine's
    reason; recorded as a diagnostic status, never a knob status and never a verdict."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@runtime_checkable
class PrefillReplay(Protocol):
    """A rollout engine that scores prompt + response again as one prompt (its prefill path),
    in chunks of ``batch_size``, under its own configuration."""

    def replay_prefill(
        self,
        identity: ScoringIdentity,
        rollout: TensorBatch,
        *,
        batch_size: int,
        logp: LogpKernel | None,
    ) -> ReplayOutput: ...


@runtime_checkable
class DecodeReplay(Protocol):
    """A rollout engine that forces the sampled tokens through its decode path again (KV
    cache, one token at a time) and reports their logprobs; raises ``ReplayUnavailable`` when
    the engine refuses."""

    def replay_decode(
        self,
        identity: ScoringIdentity,
        rollout: TensorBatch,
        *,
        batch_size: int,
        logp: LogpKernel | None,
    ) -> ReplayOutput: ...


class LayersUnavailable(Exception):
    """A layer capture a side cannot do, with its reason; a diagnostic status
    (``layers_unavailable``), never a knob status and never a verdict."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@runtime_checkable
class LayerCapture(Protocol):
    """A side (rollout engine or training scorer) that runs its own teacher-forced forward
    of the canonical batch once more with hooks and hands back the reduction of its states
    (``numerics.layer_reduction``: embeddings, every decoder layer, final norm, logits) at the
    positions that score the active tokens, or raises ``LayersUnavailable``."""

    def capture_layers(
        self, identity: ScoringIdentity, rollout: TensorBatch, *, batch_size: int
    ) -> TensorBatch: ...


class RoutingUnavailable(Exception):
    """A routing capture a side cannot do, with its reason; a diagnostic status
    (``routing_unavailable``), never a knob status and never a verdict."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@runtime_checkable
class RolloutRoutingCapture(Protocol):
    """A rollout engine that records the experts each MoE layer chose while it generates:
    armed before the case's generation (``RoutingUnavailable`` when it cannot), collected
    after it on the canonical batch's grid (``numerics.routing``: ``expert_ids`` and
    ``gate_weights``)."""

    def arm_routing(self) -> None: ...

    def collect_routing(self, rollout: TensorBatch) -> TensorBatch: ...


@runtime_checkable
class TrainingRoutingCapture(Protocol):
    """A training scorer that records the experts each MoE layer chose in its teacher-forced
    forward of the canonical batch (the scorer's chunks and masks), or raises
    ``RoutingUnavailable``; under the same router knobs as its scores (``rollout_routing``:
    the rollout's expert ids, as ``TrainingScorer.score`` gets them)."""

    def capture_routing(
        self, rollout: TensorBatch, *, batch_size: int, rollout_routing: Any | None = None
    ) -> TensorBatch: ...


@runtime_checkable
class LayerCaptureEvidence(Protocol):
    """A ``LayerCapture`` side that says how its last capture ran (for example the FSDP
    trainer: ``world_size`` and ``ranks_agree``): scalars added to its ``layers_captured``
    evidence."""

    def layer_capture_evidence(self) -> Mapping[str, JSONScalar]: ...


@runtime_checkable
class WeightDigests(Protocol):
    """An engine that reports the weights it holds, per checkpoint tensor, beside the
    checkpoint's (``store.documents.WeightsDocument``, differences already found by
    ``check.weights_check``); taken once per engine construction."""

    def weights(self) -> WeightsDocument: ...


class TrainingScorer(Protocol):
    """A constructed read-only teacher-forced scorer."""

    construction_fingerprint: str

    def score(
        self,
        identity: ScoringIdentity,
        rollout: TensorBatch,
        *,
        batch_size: int,
        logp: LogpKernel | None,
        rollout_routing: Any | None = None,
    ) -> TrainingOutput:
        """Score the rollout's tokens teacher-forced. ``rollout_routing``: the rollout's
        expert ids (``[rows, positions, moe_layers, top_k]`` on the batch's grid, -1 where it
        routed nothing), handed over only when the case's ``training.moe_routing`` is
        ``replay``; a scorer that cannot replay them never gets such a case (planning)."""
        ...

    def read_back(self) -> Mapping[str, ReadBackValue]: ...

    def close(self) -> None: ...


@runtime_checkable
class WeightSource(Protocol):
    """A training side that can hand its weights over, as an RL trainer pushes them into its
    rollout engine: every parameter and persistent buffer by checkpoint name, each whole
    (gathered under FSDP), in the side's own dtype; tied names share one tensor."""

    def weight_state(self) -> TensorBatch: ...


@runtime_checkable
class WeightReceiver(Protocol):
    """A rollout engine built without the checkpoint's weights (``rollout.weight_sync`` other
    than ``checkpoint``): before its first request it must receive them from the training
    side (``receive_weights``, once per engine construction; ``awaits_weights`` says whether
    it still does)."""

    @property
    def awaits_weights(self) -> bool: ...

    def receive_weights(self, source: WeightSource, identity: ScoringIdentity) -> None: ...


class RuntimeAdapter(Protocol):
    """What a runtime implements. Constructed once per run; engines via the factories."""

    name: str

    def materialize(self, requested: Mapping[str, KnobValue]) -> Mapping[str, Materialized]:
        """Stage 2: what this runtime will do with each requested knob (no engine built)."""
        ...

    def build_rollout(
        self, binding: RuntimeBinding, identity: ScoringIdentity
    ) -> RolloutEngine: ...

    def build_training(
        self, binding: RuntimeBinding, identity: ScoringIdentity
    ) -> TrainingScorer: ...

    def environment(self, identity: ScoringIdentity) -> Mapping[str, str]:
        """Versions, device and resolved checkpoint digest that must match for an attempt to
        be reused."""
        ...

    def close(self) -> None: ...


def side_identity(
    identity: ScoringIdentity, *, checkpoint_digest: str | None, **observed: JSONScalar
) -> dict[str, JSONScalar]:
    """The identity fields a side reports it used, which identity validation compares (the
    expected values are this with the config's own digest); ``observed`` adds what a side
    read from its own files, such as a tokenizer digest."""
    return {
        "checkpoint_uri": identity.checkpoint.uri,
        "model_version": identity.checkpoint.model_version,
        "checkpoint_digest": checkpoint_digest,
        "tokenizer_id": identity.tokenizer.tokenizer_id,
        "packing": identity.packing.value,
        "positions": identity.positions.value,
        **observed,
    }


def applied_sampling(
    *, top_p: float | None, top_k: int | None, min_p: float | None
) -> dict[str, JSONScalar]:
    """The sampling truncation a side reports it applies (None: it does not truncate by it).
    Identity validation compares it with the identity's ``sampling`` on both sides."""
    return {"sampling_top_p": top_p, "sampling_top_k": top_k, "sampling_min_p": min_p}


def expected_identity(identity: ScoringIdentity) -> dict[str, JSONScalar]:
    """What both sides must report: the identity's own values (``side_identity`` with the
    config's digest) and its sampling truncation."""
    sampling = identity.sampling
    return {
        **side_identity(identity, checkpoint_digest=identity.checkpoint.digest),
        **applied_sampling(top_p=sampling.top_p, top_k=sampling.top_k, min_p=sampling.min_p),
    }


def _fp(payload: Any) -> str:
    return sha256_hex(canonical_json(payload))[:16]


def bind_case(
    ec: ExecutionCase,
    *,
    runtime_kind: str,
    identity: ScoringIdentity,
    device: str,
    diagnostics: Mapping[str, object] | None = None,
    catalog: Mapping[str, KnobSpec] = KNOBS,
    settings: SettingsTypes | None = None,
) -> RuntimeBinding:
    """Derive the backend-neutral binding, its typed settings (built once, here, from
    ``catalog``'s sides and defaults into ``settings``' classes, ``SETTINGS_TYPES`` when None)
    and its fingerprints from an operator-bound case. The fingerprints hash the named knobs
    only, as ever."""
    # Imported here: an installed plugin that runs no drift test never builds settings.
    from pytest_logprob_drift.execute.side_settings import SETTINGS_TYPES, build_settings

    if settings is None:
        settings = SETTINGS_TYPES
    requested = ec.case.requested
    by_side = {
        side: {
            spec.field: requested[path]
            for path, spec in catalog.items()
            if spec.side is side and path in requested
        }
        for side in (Side.ROLLOUT, Side.TRAINING)
    }
    rollout, training = by_side[Side.ROLLOUT], by_side[Side.TRAINING]
    rollout_settings = build_settings(settings.rollout, Side.ROLLOUT, requested, catalog)
    training_settings = build_settings(settings.training, Side.TRAINING, requested, catalog)
    request_settings = build_settings(settings.request, Side.REQUEST, requested, catalog)
    topology = {
        "rollout": side_topology(requested, "rollout"),
        "training": side_topology(requested, "training"),
    }
    backends = {b.target: b.backend for b in ec.bindings}
    bindings = {b.target: canonical(b) for b in ec.bindings}

    def process_knobs(side: Side) -> dict[str, KnobValue | None]:
        """The side's process-lifecycle knobs as named (null: not named; a knob added later,
        ``FINGERPRINTED_WHEN_NAMED``, only when named)."""
        return {
            path: requested[path] if path in requested else None
            for path, spec in catalog.items()
            if spec.side is side
            and spec.knob.lifecycle is Lifecycle.PROCESS
            and (path in requested or path not in FINGERPRINTED_WHEN_NAMED)
        }

    # Each side's engines live in that side's processes: a rollout engine depends on the
    # rollout topology only, a training scorer on the training topology only.
    rollout_process = _fp(
        {
            "runtime": runtime_kind,
            "device": device,
            "side": "rollout",
            "process": process_knobs(Side.ROLLOUT),
        }
    )
    training_process = _fp(
        {
            "runtime": runtime_kind,
            "device": device,
            "side": "training",
            "process": process_knobs(Side.TRAINING),
        }
    )
    process_fp = _fp({"rollout": rollout_process, "training": training_process})
    distributed_fp = _fp({"process": process_fp, "topology": topology})
    checkpoint = canonical(identity.checkpoint)
    # Full distributions change how an engine is built (vLLM: max_logprobs=-1): only then
    # part of the fingerprints, so that experiments without them keep theirs.
    asked = frozen_mapping(diagnostics or {})
    extra = {} if asked.get("full_vocabulary") is None else {"full_vocabulary": True}
    training_fp = _fp(
        {
            "process": training_process,
            "side": "training",
            "settings": training,
            "operator": bindings.get("training"),
            "checkpoint": checkpoint,
            **extra,
        }
    )
    # A rollout that receives its weights from the training side (rollout.weight_sync other
    # than checkpoint) is built from that training side too: only then part of its
    # fingerprint, so that every other case keeps its own.
    pushed = not rollout_settings.weight_sync.from_checkpoint
    rollout_fp = _fp(
        {
            "process": rollout_process,
            "side": "rollout",
            "settings": rollout,
            "operator": bindings.get("rollout"),
            "checkpoint": checkpoint,
            **extra,
            **({"weights_from": training_fp} if pushed else {}),
        }
    )
    return RuntimeBinding(
        runtime_kind=runtime_kind,
        batch=frozen_mapping({"size": request_settings.batch_size}),
        rollout=frozen_mapping(rollout),
        training=frozen_mapping(training),
        topology=frozen_mapping({k: frozen_mapping(v) for k, v in topology.items()}),
        scorer=frozen_mapping(
            {
                "mode": "teacher_forced",
                "kv_cache": identity.training_kv_cache,
                "packing": identity.packing.value,
                "positions": identity.positions.value,
                "device": device,
            }
        ),
        operator_backends=frozen_mapping(backends),
        process_fingerprint=process_fp,
        distributed_fingerprint=distributed_fp,
        rollout_construction_fingerprint=rollout_fp,
        training_construction_fingerprint=training_fp,
        diagnostics=asked,
        rollout_settings=rollout_settings,
        training_settings=training_settings,
        request_settings=request_settings,
    )


def order_for_reuse(
    cases: Sequence[ExecutionCase], binding: Callable[[ExecutionCase], RuntimeBinding]
) -> list[ExecutionCase]:
    """Stable order that keeps cases sharing a rollout engine (the expensive one), then a
    training scorer, together, so each engine is built once and can be torn down when its
    last case is done."""
    first_seen: dict[str, int] = {}
    for index, ec in enumerate(cases):
        b = binding(ec)
        for key in (b.rollout_construction_fingerprint, b.training_construction_fingerprint):
            first_seen.setdefault(key, index)

    def sort_key(item: tuple[int, ExecutionCase]) -> tuple[int, int, int]:
        b = binding(item[1])
        return (
            first_seen[b.rollout_construction_fingerprint],
            first_seen[b.training_construction_fingerprint],
            item[0],
        )

    return [ec for _, ec in sorted(enumerate(cases), key=sort_key)]


def application_records(
    requested: Mapping[str, KnobValue],
    materialized: Mapping[str, Materialized],
    actual: Mapping[str, JSONScalar] | None,
) -> tuple[KnobRecord, ...]:
    """Stage 3: join requested, materialized and actual. An ``applied`` record whose actual
    value disagrees with the request becomes ``error`` (a silent fallback: the engine did not
    do what was asked and nobody declared it), with the engine's word as evidence; ``fallback``
    is reserved for fallbacks the runtime declares at materialization."""
    from pytest_logprob_drift.numerics.comparison import KnobRecord  # msgspec: not at collection

    records: list[KnobRecord] = []
    for path in sorted(requested):
        m = materialized.get(path)
        if m is None:
            m = Materialized(
                value=None,
                status=ApplicationStatus.UNSUPPORTED,
                evidence="the runtime did not report this knob (ignored setting)",
            )
        status, evidence = m.status, m.evidence
        value = None if actual is None else actual.get(path)
        if actual is not None and status is ApplicationStatus.APPLIED:
            if path not in actual:
                status = ApplicationStatus.UNOBSERVABLE
                evidence = f"{evidence}; the engine exposes no read-back for {path}"
            elif value != requested[path]:
                status = ApplicationStatus.ERROR
                evidence = (
                    f"{evidence}; silent fallback: engine reports {value!r}, "
                    f"requested {requested[path]!r}"
                )
        elif (
            actual is not None
            and status is ApplicationStatus.FALLBACK
            and path in actual
            and value != m.value
        ):
            status = ApplicationStatus.ERROR
            evidence = (
                f"{evidence}; declared fallback to {m.value!r} but the engine reports {value!r}"
            )
        records.append(
            KnobRecord(
                knob=path,
                lifecycle=knob_lifecycle(path),
                requested=requested[path],
                materialized=m.value,
                actual=value,
                status=status,
                evidence=evidence,
            )
        )
    return tuple(records)


def strict_violations(
    records: tuple[KnobRecord, ...], *, changed: tuple[str, ...], strict: bool
) -> list[str]:
    """Reasons strict execution rejects these records (empty when acceptable).

    A declared fallback is measurable only when it is itself the declared intervention (a knob
    the case changes); under strict execution every other fallback, every unobservable value,
    every unsupported (ignored) setting and every error, a silent fallback found at read-back
    included, is rejected. With ``strict_fallback`` false, fallbacks and unobservable values
    are recorded but not rejected; unsupported settings and errors still are.
    """
    reasons: list[str] = []
    for r in records:
        if r.status is ApplicationStatus.APPLIED:
            continue
        if r.status is ApplicationStatus.FALLBACK and (r.knob in changed or not strict):
            continue
        if r.status is ApplicationStatus.UNOBSERVABLE and not strict:
            continue
        reasons.append(f"{r.knob}={r.requested!r}: {r.status.value} ({r.evidence})")
    return reasons
