"""Executing one case: engines from the pool, paired scoring, verdict, sealed attempt.

Owns the steps between "this case must run" and "its attempt is sealed": strict pre-checks
(stale registry state, materialization), per-case operator resolution through a fresh
``OperatorSession``, rollout then read-only training scoring on engines from the
fingerprint-keyed pool, read-back of actual values, identity validation and the verdict, each
installed diagnostic's capture (``diagnostics.registry``: handed the scored case after the
read-back, so it cannot change what is read back), their parts and sealed files
(``comparison_record``), each side's weight digests where its engine reports them (a
difference is an identity violation, a side whose layout is not covered is STRICT_REJECTED
under strict execution), the rollout's expert choices captured while it generates when the case asks
for them (``execute.rollout_experts``: handed to the scorer under
``training.moe_routing=replay``, and to the diagnostics), and writing every payload before
COMPLETE. Used by the runner. Knows no concrete runtime, no frontend, and nothing
about which operator backends exist.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from pytest_logprob_drift.check import weights_check
from pytest_logprob_drift.comparison_record import comparison_of
from pytest_logprob_drift.diagnostics.registry import installed
from pytest_logprob_drift.execute.engine_pool import EnginePool
from pytest_logprob_drift.execute.protocol import (
    BoundKernel,
    Materialized,
    RolloutEngine,
    RolloutOutput,
    RuntimeAdapter,
    RuntimeBinding,
    TrainingOutput,
    TrainingScorer,
    WeightDigests,
    WeightReceiver,
    WeightSource,
    application_records,
    expected_identity,
    merge_read_back,
    strict_violations,
)
from pytest_logprob_drift.execute.rollout_experts import (
    RolloutExperts,
    arm_rollout,
    collect_rollout,
)
from pytest_logprob_drift.numerics.comparison import (
    Comparison,
    KnobRecord,
    NumericCheck,
)
from pytest_logprob_drift.numerics.verdict import Verdict, identity_violations, judge
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.plan.binding import ExecutionCase, side_dtype, side_topology
from pytest_logprob_drift.records import (
    Case,
    JsonObject,
    JsonValue,
    ResolvedContract,
    ScoringIdentity,
    canonical,
)
from pytest_logprob_drift.registry.capability import OperatorResolutionError
from pytest_logprob_drift.registry.catalog import (
    SELECTED_LOGPROB,
    FactoryStyle,
    SemanticOperatorCatalog,
)
from pytest_logprob_drift.registry.session import OperatorSession
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.attempt import Seal
from pytest_logprob_drift.store.documents import (
    Actual,
    ExecutionKeyPayload,
    IdentityDocument,
    Requested,
    WeightsDocument,
)
from pytest_logprob_drift.store.documents import Materialized as MaterializedDocument
from pytest_logprob_drift.store.read_back import ACTUAL_SCHEMA
from pytest_logprob_drift.store.run import ArtifactStore
from pytest_logprob_drift.tensorio import tensor_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutedAttempt:
    seal: Seal
    verdict: Verdict
    records: tuple[KnobRecord, ...]


def _records_json(records: tuple[KnobRecord, ...], stage: str) -> dict[str, JsonObject]:
    return {
        r.knob: {
            "lifecycle": r.lifecycle.value,
            stage: getattr(r, stage),
            **({"status": r.status.value, "evidence": r.evidence} if stage != "requested" else {}),
        }
        for r in records
    }


def _rejected(reasons: list[str], threshold: float) -> Verdict:
    return Verdict(
        outcome=Outcome.STRICT_REJECTED,
        reason="; ".join(reasons),
        threshold=threshold,
        active_tokens=0,
        mismatches=0,
        diagnostics={},
        worst_tokens=(),
        identity_violations=(),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _CaseUnderCapture:
    """``diagnostics.protocol.CaseUnderCapture`` of one case both sides have scored."""

    binding: RuntimeBinding
    engine: RolloutEngine
    scorer: TrainingScorer
    identity: ScoringIdentity
    rollout: RolloutOutput
    training: TrainingOutput
    read_back: Mapping[str, JsonValue]
    batch_size: int
    rollout_logp: BoundKernel | None
    rollout_experts: RolloutExperts | None
    threshold: float


@dataclass(slots=True, kw_only=True)
class _Scored:
    """What one paired scoring produced (None sides when a refusal came first)."""

    rollout: RolloutOutput | None = None
    training: TrainingOutput | None = None
    read_back: dict[str, Any] = field(default_factory=dict)
    captured: dict[str, object] = field(default_factory=dict)
    """Each installed diagnostic's capture, by name (``diagnostics.protocol``)."""
    provenance: list[JsonObject] = field(default_factory=list)
    records: tuple[KnobRecord, ...] = ()
    weights: dict[str, WeightsDocument] = field(default_factory=dict)
    """Each side's weight digests beside the checkpoint's, where its engine reports them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseExecution:
    """Everything one case's execution needs, fixed before it starts."""

    ec: ExecutionCase
    identity: ScoringIdentity
    binding: RuntimeBinding
    materialized: Mapping[str, Materialized]
    adapter: RuntimeAdapter
    pool: EnginePool
    catalog: SemanticOperatorCatalog
    allow_test_only: bool
    contract: ResolvedContract
    strict: bool
    store: ArtifactStore
    execution_key: str
    key_payload: Mapping[str, Any]
    refusals: tuple[str, ...] = ()
    """Why the runtime cannot execute this case at all, known before any engine is built
    (``ExecutionCase.runtime_refusals``): the attempt is sealed STRICT_REJECTED with them."""


def execute_case(run: CaseExecution) -> ExecutedAttempt:
    """Strict pre-checks, paired scoring, the verdict, and the sealed attempt."""
    case = run.ec.case
    scored = _Scored(records=application_records(case.requested, run.materialized, None))
    reasons = (
        list(run.refusals)
        + _stale_registry(run)
        + strict_violations(scored.records, changed=case.changed, strict=run.strict)
    )
    if not reasons:
        with OperatorSession(
            run.catalog, allow_test_only=run.allow_test_only, strict=run.strict
        ) as session:
            kernels = _resolve_kernels(run, session, reasons)
            if not reasons:
                _score(run, kernels, scored, reasons)
                scored.provenance = session.provenance()
    verdict, numeric = _judge(run, scored, reasons)
    seal = _write_attempt(run, scored, verdict, numeric)
    return ExecutedAttempt(seal=seal, verdict=verdict, records=scored.records)


def _stale_registry(run: CaseExecution) -> list[str]:
    reasons = []
    for b in run.ec.bindings:
        current = run.catalog.get(b.operation, b.backend)
        if current is None or current.fingerprint != b.descriptor_fingerprint:
            reasons.append(
                f"stale registry state: {b.target} backend {b.backend!r} is no "
                "longer registered as it was when the case was bound"
            )
    return reasons


def _resolve_kernels(
    run: CaseExecution, session: OperatorSession, reasons: list[str]
) -> dict[str, BoundKernel | None]:
    """Each side's kernel through the case's session (None: the runtime's native path)."""
    requested = run.ec.case.requested
    kernels: dict[str, BoundKernel | None] = {}
    try:
        for target in ("rollout", "training"):
            b = run.ec.binding(target)
            resolved = session.resolve(
                SELECTED_LOGPROB,
                target,
                b.backend,
                device=str(run.binding.scorer["device"]),
                dtype=side_dtype(requested, target),
                topology=side_topology(requested, target),
                options=b.options,
            )
            kernel = session.instantiate(resolved)
            by_name = resolved.descriptor.factory_style is FactoryStyle.KERNEL
            kernels[target] = (
                None
                if kernel is None
                else BoundKernel(
                    b.backend,
                    kernel,
                    resolved.descriptor.factory if by_name else None,
                    resolved.reference(),
                )
            )
    except OperatorResolutionError as exc:
        reasons.append(f"operator resolution: {exc}")
    return kernels


def _score(
    run: CaseExecution,
    kernels: Mapping[str, BoundKernel | None],
    scored: _Scored,
    reasons: list[str],
) -> None:
    """Rollout, then read-only training scoring, on pooled engines; then read-back."""
    binding, identity, adapter = run.binding, run.identity, run.adapter
    engine = run.pool.rollout_engine(
        binding.rollout_construction_fingerprint, lambda: adapter.build_rollout(binding, identity)
    )
    scorer = run.pool.training_scorer(
        binding.training_construction_fingerprint, lambda: adapter.build_training(binding, identity)
    )
    for side, built, want in (
        ("rollout", engine.construction_fingerprint, binding.rollout_construction_fingerprint),
        ("training", scorer.construction_fingerprint, binding.training_construction_fingerprint),
    ):
        if built != want:
            reasons.append(
                f"incompatible reuse: {side} engine was built for {built}, case needs {want}"
            )
    if reasons:
        return
    if isinstance(engine, WeightReceiver) and engine.awaits_weights:
        # The trainer-to-rollout push happens once per rollout engine construction, before
        # its first request; the engine reads back how the weights arrived.
        if not isinstance(scorer, WeightSource):
            reasons.append(
                "rollout.weight_sync: the training side cannot hand its weights over "
                f"({type(scorer).__name__} has no weight_state)"
            )
            return
        engine.receive_weights(scorer, identity)
    batch_size = int(binding.batch["size"])
    replay = binding.training_settings.moe_routing.replay  # R3: the rollout's expert ids
    # Asked for by the replay (a training setting) or by the diagnostics (``routing``).
    routed = binding.routing or replay
    armed = arm_rollout(engine) if routed else None  # captured while it generates
    scored.rollout = engine.generate(identity, batch_size=batch_size, logp=kernels["rollout"])
    rolled_out = collect_rollout(engine, scored.rollout, armed=armed) if routed else None
    replayed = None
    if replay:
        assert rolled_out is not None
        replayed = rolled_out.expert_ids
        if replayed is None:
            reasons.append(
                "training.moe_routing=replay: the rollout's expert ids are unavailable: "
                f"{rolled_out.status.reason}"
            )
            return
    # The rollout's expert ids go only to a replay case's scorer (others keep their call).
    replay_ids = {} if replayed is None else {"rollout_routing": replayed}
    scored.training = scorer.score(
        identity,
        scored.rollout.tensors,
        batch_size=batch_size,
        logp=kernels["training"],
        **replay_ids,
    )
    # Each engine's weights once per construction, after its first case (an operator installed
    # into an engine's processes runs before this).
    for side, held in (("rollout", engine), ("training", scorer)):
        if isinstance(held, WeightDigests):
            document = held.weights()
            scored.weights[side] = document
            if document.refused is not None and run.strict:
                reasons.append(f"weights ({side}) not checked: {document.refused}")
    actual = merge_read_back(engine.read_back(), scorer.read_back())
    scored.read_back = dict(actual)
    under_capture = _CaseUnderCapture(
        binding=binding,
        engine=engine,
        scorer=scorer,
        identity=identity,
        rollout=scored.rollout,
        training=scored.training,
        read_back=actual,
        batch_size=batch_size,
        rollout_logp=kernels["rollout"],
        rollout_experts=rolled_out,
        threshold=run.contract.threshold,
    )
    for diagnostic in installed():  # never changes the verdict
        captured = diagnostic.capture(under_capture)
        if captured is not None:
            scored.captured[diagnostic.name] = captured
    case = run.ec.case
    # A knob reads back as a scalar; a part with parts is no knob's value (unobservable).
    knobs = {k: v for k, v in actual.items() if not isinstance(v, (list, dict))}
    scored.records = application_records(case.requested, run.materialized, knobs)
    reasons.extend(strict_violations(scored.records, changed=case.changed, strict=run.strict))


def _judge(
    run: CaseExecution, scored: _Scored, reasons: list[str]
) -> tuple[Verdict, NumericCheck | None]:
    """The verdict (identity first), and the numerical verdict alone for offline checks."""
    threshold = run.contract.threshold
    rollout, training = scored.rollout, scored.training
    if rollout is None or training is None:
        return _rejected(reasons, threshold), None
    expected = expected_identity(run.identity)
    violations = identity_violations(
        expected,
        rollout.identity,
        training.identity,
        rollout.tensors,
        training.consumed,
        training.readonly_violations,
    )
    for side in sorted(scored.weights):
        violations.extend(weights_check.violations(scored.weights[side]))
    active = rollout.tensors["active_mask"]
    numeric = judge(
        training.logprobs, rollout.tensors["logprobs"], active, threshold
    ).numeric_check()
    verdict = judge(
        training.logprobs,
        rollout.tensors["logprobs"],
        active,
        threshold,
        violations=tuple(violations),
    )
    if reasons and verdict.outcome is not Outcome.INVALID_IDENTITY:
        verdict = _rejected(reasons, threshold)
    return verdict, numeric


def requested_document(case: Case, binding: RuntimeBinding) -> Requested:
    """``requested.json``: the case's named knobs and the binding it executes under."""
    return Requested(
        case_id=case.case_id,
        label=case.label,
        knobs=canonical(case.requested),
        changed=tuple(case.changed),
        binding=binding.sealed(),
    )


def _write_attempt(
    run: CaseExecution, scored: _Scored, verdict: Verdict, numeric: NumericCheck | None
) -> Seal:
    """Every payload, then COMPLETE last."""
    case, rollout, training = run.ec.case, scored.rollout, scored.training
    writer = run.store.new_attempt(case.case_id, run.execution_key)
    writer.write_document(requested_document(case, run.binding))
    writer.write_document(
        MaterializedDocument(
            knobs={k: canonical(v) for k, v in sorted(run.materialized.items())},
            operators=tuple(canonical(b) for b in run.ec.bindings),
        )
    )
    writer.write_document(
        Actual(
            knobs=_records_json(scored.records, "actual"),
            read_back=scored.read_back,
            operator_provenance=tuple(scored.provenance),
            training_evidence=dict(training.evidence) if training else None,
            schema_version=ACTUAL_SCHEMA,
        )
    )
    writer.write_document(
        IdentityDocument(
            identity=run.identity.canonical_identity(),
            rollout=dict(rollout.identity) if rollout else None,
            training=dict(training.identity) if training else None,
            execution_key_payload=ExecutionKeyPayload(**run.key_payload),
        )
    )
    for _side, document in sorted(scored.weights.items()):
        writer.write_document(document)
    if rollout is not None and training is not None:
        writer.write_bytes(layout.SCORE_ROLLOUT, tensor_bytes(rollout.tensors))
        writer.write_bytes(
            layout.SCORE_TRAINING,
            tensor_bytes({"logprobs": training.logprobs, **training.consumed}),
        )
    for diagnostic in installed():
        captured = scored.captured.get(diagnostic.name)
        for name, payload in diagnostic.files(verdict.outcome, _scores(scored), captured).items():
            if name not in diagnostic.sealed_files:
                raise ValueError(f"diagnostic {diagnostic.name} did not declare the file {name}")
            writer.write_bytes(name, tensor_bytes(dict(payload)))
    comparison = _comparison(run, scored, verdict, numeric)
    writer.write_json(layout.COMPARISON, comparison.to_json())
    if rollout is not None and training is not None:
        writer.write_bytes(
            layout.TOKEN_DIFFS,
            tensor_bytes(
                {
                    "training_logprobs": training.logprobs,
                    "rollout_logprobs": rollout.tensors["logprobs"],
                    "active_mask": rollout.tensors["active_mask"],
                    "threshold": torch.tensor(run.contract.threshold, dtype=torch.float64),
                }
            ),
        )
    return writer.seal()


def _scores(scored: _Scored) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``(training, rollout, active)`` of a case both sides scored: what token_diffs.pt seals
    and what each installed diagnostic computes from."""
    rollout, training = scored.rollout, scored.training
    if rollout is None or training is None:
        return None
    return (training.logprobs, rollout.tensors["logprobs"], rollout.tensors["active_mask"])


def _comparison(
    run: CaseExecution,
    scored: _Scored,
    verdict: Verdict,
    numeric: NumericCheck | None,
) -> Comparison:
    """The case's comparison record: the verdict, its statistics as typed diagnostics, each
    installed diagnostic's parts (from the very tensors
    token_diffs.pt seals and its own capture; never a verdict), and the numeric re-check."""
    case = run.ec.case
    return comparison_of(
        verdict,
        case_id=case.case_id,
        label=case.label,
        contract=run.contract,
        scores=_scores(scored),
        captured=scored.captured,
        records=scored.records,
        numerical=numeric,
    )
