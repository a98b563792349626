"""Executing one case: engines from the pool, paired scoring, verdict, sealed attempt.

Owns the steps between "this case must run" and "its attempt is sealed": strict pre-checks
(stale registry state, materialization), per-case operator resolution through a fresh
``OperatorSession``, rollout then read-only training scoring on engines from the
fingerprint-keyed pool, read-back of actual values, identity validation and the verdict, and
writing every payload before COMPLETE. Private to the runner. Knows no concrete runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from pytest_logprob_drift.execute.protocol import (
    BoundKernel,
    Materialized,
    RolloutEngine,
    RuntimeAdapter,
    RuntimeBinding,
    TrainingScorer,
    application_records,
    merge_read_back,
    side_identity,
    strict_violations,
)
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.plan.binding import ExecutionCase, side_dtype, side_topology
from pytest_logprob_drift.records import (
    KnobApplication,
    ResolvedContract,
    ScoringIdentity,
    canonical,
)
from pytest_logprob_drift.registry.catalog import (
    SELECTED_LOGPROB,
    OperatorResolutionError,
    OperatorSession,
    SemanticOperatorCatalog,
)
from pytest_logprob_drift.store.artifacts import ArtifactStore, Seal
from pytest_logprob_drift.tensorio import tensor_bytes
from pytest_logprob_drift.verdict import Verdict, identity_violations, judge


@dataclass
class EnginePool:
    """Engines keyed by construction fingerprint; built once, closed when no longer needed."""

    rollout: dict[str, RolloutEngine] = field(default_factory=dict)
    training: dict[str, TrainingScorer] = field(default_factory=dict)
    rollout_constructions: int = 0
    training_constructions: int = 0

    def rollout_engine(self, key: str, build: Callable[[], RolloutEngine]) -> RolloutEngine:
        if key not in self.rollout:
            self.rollout[key] = build()
            self.rollout_constructions += 1
        return self.rollout[key]

    def training_scorer(self, key: str, build: Callable[[], TrainingScorer]) -> TrainingScorer:
        if key not in self.training:
            self.training[key] = build()
            self.training_constructions += 1
        return self.training[key]

    def release_unneeded(self, rollout_keys: set[str], training_keys: set[str]) -> None:
        for key in [k for k in self.rollout if k not in rollout_keys]:
            self.rollout.pop(key).close()
        for key in [k for k in self.training if k not in training_keys]:
            self.training.pop(key).close()

    def close(self) -> None:
        self.release_unneeded(set(), set())


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutedAttempt:
    seal: Seal
    verdict: Verdict
    records: tuple[KnobApplication, ...]


def _records_json(records: tuple[KnobApplication, ...], stage: str) -> dict[str, Any]:
    return {r.knob: {"lifecycle": r.lifecycle.value,
                     stage: getattr(r, stage),
                     **({"status": r.status.value, "evidence": r.evidence}
                        if stage != "requested" else {})} for r in records}


def _rejected(reasons: list[str], threshold: float) -> Verdict:
    return Verdict(outcome=Outcome.STRICT_REJECTED, reason="; ".join(reasons),
                   threshold=threshold, active_tokens=0, mismatches=0, diagnostics={},
                   worst_tokens=(), identity_violations=())


def execute_case(*, ec: ExecutionCase, identity: ScoringIdentity, binding: RuntimeBinding,
                 materialized: Mapping[str, Materialized], adapter: RuntimeAdapter,
                 pool: EnginePool, catalog: SemanticOperatorCatalog, allow_smoke: bool,
                 contract: ResolvedContract, strict: bool, store: ArtifactStore,
                 execution_key: str, key_payload: Mapping[str, Any]) -> ExecutedAttempt:
    case = ec.case
    threshold = contract.threshold
    requested = case.requested
    records = application_records(requested, materialized, None)
    reasons: list[str] = []
    for b in ec.bindings:
        current = catalog.get(b.operation, b.backend)
        if current is None or current.fingerprint != b.descriptor_fingerprint:
            reasons.append(f"stale registry state: {b.target} backend {b.backend!r} is no "
                           "longer registered as it was when the case was bound")
    reasons.extend(strict_violations(records, changed=case.changed, strict=strict))

    rollout_out = training_out = None
    read_back: dict[str, Any] = {}
    verdict: Verdict
    numeric: dict[str, Any] | None = None
    if not reasons:
        with OperatorSession(catalog, allow_smoke=allow_smoke) as session:
            try:
                kernels: dict[str, BoundKernel | None] = {}
                for target in ("rollout", "training"):
                    b = ec.binding(target)
                    resolved = session.resolve(SELECTED_LOGPROB, target, b.backend,
                                               device=str(binding.scorer["device"]),
                                               dtype=side_dtype(requested, target),
                                               topology=side_topology(requested, target),
                                               options=b.options)
                    kernel = session.instantiate(resolved)
                    style = resolved.descriptor.factory_style.value
                    kernels[target] = None if kernel is None else BoundKernel(
                        b.backend, kernel,
                        resolved.descriptor.factory if style == "kernel" else None)
            except OperatorResolutionError as exc:
                reasons.append(f"operator resolution: {exc}")
            if not reasons:
                engine = pool.rollout_engine(binding.rollout_construction_fingerprint,
                                             lambda: adapter.build_rollout(binding, identity))
                scorer = pool.training_scorer(binding.training_construction_fingerprint,
                                              lambda: adapter.build_training(binding, identity))
                for side, built, want in (
                        ("rollout", engine.construction_fingerprint,
                         binding.rollout_construction_fingerprint),
                        ("training", scorer.construction_fingerprint,
                         binding.training_construction_fingerprint)):
                    if built != want:
                        reasons.append(f"incompatible reuse: {side} engine was built for "
                                       f"{built}, case needs {want}")
            if not reasons:
                batch_size = int(binding.batch["size"])
                rollout_out = engine.generate(identity, batch_size=batch_size,
                                              logp=kernels["rollout"])
                training_out = scorer.score(identity, rollout_out.tensors,
                                            batch_size=batch_size, logp=kernels["training"])
                actual = merge_read_back(engine.read_back(), scorer.read_back())
                read_back = dict(actual)
                records = application_records(requested, materialized, actual)
                reasons.extend(strict_violations(records, changed=case.changed, strict=strict))
                provenance = session.provenance()
    if rollout_out is not None and training_out is not None:
        expected = side_identity(identity, checkpoint_digest=identity.checkpoint.digest)
        violations = identity_violations(
            expected, rollout_out.identity, training_out.identity, rollout_out.tensors,
            training_out.consumed, training_out.readonly_violations)
        active = rollout_out.tensors["active_mask"]
        training_lp = training_out.logprobs
        rollout_lp = rollout_out.tensors["logprobs"]
        numeric_verdict = judge(training_lp, rollout_lp, active, threshold)
        numeric = {"outcome": numeric_verdict.outcome.value,
                   "mismatches": numeric_verdict.mismatches,
                   "active_tokens": numeric_verdict.active_tokens, "threshold": threshold}
        verdict = judge(training_lp, rollout_lp, active, threshold,
                        violations=tuple(violations))
        if reasons and verdict.outcome is not Outcome.INVALID_IDENTITY:
            verdict = _rejected(reasons, threshold)
    else:
        verdict = _rejected(reasons, threshold)
        provenance = []

    writer = store.new_attempt(case.case_id, execution_key)
    writer.write_json("requested.json", {"case_id": case.case_id, "label": case.label,
                                         "knobs": canonical(requested),
                                         "changed": list(case.changed),
                                         "binding": canonical(binding)})
    writer.write_json("materialized.json", {
        "knobs": {k: canonical(v) for k, v in sorted(materialized.items())},
        "operators": [canonical(b) for b in ec.bindings]})
    writer.write_json("actual.json", {"knobs": _records_json(records, "actual"),
                                      "read_back": read_back,
                                      "operator_provenance": provenance,
                                      "training_evidence": dict(training_out.evidence)
                                      if training_out else None})
    writer.write_json("identity.json", {
        "identity": identity.canonical_identity(),
        "rollout": dict(rollout_out.identity) if rollout_out else None,
        "training": dict(training_out.identity) if training_out else None,
        "execution_key_payload": dict(key_payload)})
    if rollout_out is not None and training_out is not None:
        writer.write_bytes("score_rollout.pt", tensor_bytes(rollout_out.tensors))
        writer.write_bytes("score_training.pt", tensor_bytes(
            {"logprobs": training_out.logprobs, **training_out.consumed}))
    comparison = {"case_id": case.case_id, "label": case.label,
                  "contract": canonical(contract), **verdict.to_json(),
                  "records": [canonical(r) for r in records]}
    if numeric is not None:
        comparison["numerical"] = numeric
    writer.write_json("comparison.json", comparison)
    if rollout_out is not None and training_out is not None:
        writer.write_bytes("token_diffs.pt", tensor_bytes({
            "training_logprobs": training_out.logprobs,
            "rollout_logprobs": rollout_out.tensors["logprobs"],
            "active_mask": rollout_out.tensors["active_mask"],
            "threshold": torch.tensor(threshold, dtype=torch.float64)}))
    seal = writer.seal()
    return ExecutedAttempt(seal=seal, verdict=verdict, records=records)
