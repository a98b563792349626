"""Runner on the CPU smoke runtime, in process: outcomes, faults, strictness, resume, engines.

Every test runs the real runner, operator session, comparator and artifact store against the
synthetic ``cpu-smoke`` runtime, with artifacts in a scratch directory (tmpfs when available).
Deliberate scorer faults (``FaultyCpuSmokeAdapter(fault)`` from ``drift_testing``) and small
wrapping adapters produce each identity violation.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import (
    ATTEMPT_FILES,
    FAULTS,
    OFFSET_LABEL,
    S0,
    S2,
    FaultyCpuSmokeAdapter,
    make_runner,
)

from pytest_logprob_drift import UsageError, plan_file
from pytest_logprob_drift.check.resume import check_attempt
from pytest_logprob_drift.errors import Remedy
from pytest_logprob_drift.execute.protocol import Materialized, RolloutOutput, RuntimeBinding
from pytest_logprob_drift.execute.runner import CaseResult, Runner
from pytest_logprob_drift.execute.side_settings import DType
from pytest_logprob_drift.outcomes import Outcome, parse_expectation
from pytest_logprob_drift.plan.binding import ExecutionPlan
from pytest_logprob_drift.records import ApplicationStatus, ScoringIdentity
from pytest_logprob_drift.registry.catalog import NATIVE_DESCRIPTOR, SemanticOperatorCatalog
from pytest_logprob_drift.runtimes.smoke.runtime import (
    CpuSmokeAdapter,
    StatelessScorer,
    SyntheticRollout,
)
from pytest_logprob_drift.store.attempt import AttemptWriter


def s0_document() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(S0.read_text())
    return document


def write_config(work: Path, document: dict[str, Any], name: str = "config.json") -> str:
    path = work / name
    path.write_text(json.dumps(document))
    return str(path)


def plan_for(work: Path, edit: Callable[[dict[str, Any]], None] | None = None) -> ExecutionPlan:
    document = copy.deepcopy(s0_document())
    if edit is not None:
        edit(document)
    return plan_file(write_config(work, document))


def run(
    plan: ExecutionPlan,
    artifacts: Path,
    *,
    adapter: CpuSmokeAdapter | None = None,
    labels: tuple[str, ...] | None = None,
    allow_smoke: bool = True,
    **kwargs: Any,
) -> tuple[dict[str, CaseResult], Runner]:
    runner = make_runner(
        plan,
        runtime="cpu-smoke",
        artifacts=artifacts,
        allow_smoke=allow_smoke,
        adapter=adapter if adapter is not None else CpuSmokeAdapter(),
        **kwargs,
    )
    with runner:
        cases = None if labels is None else [ec for ec in plan.cases if ec.case.label in labels]
        results = runner.run(cases)
    return {r.label: r for r in results}, runner


def attempt_dirs(root: Path) -> set[Path]:
    return {p for p in root.glob("*/cases/*/*") if p.is_dir()}


# --- S0: the reference passes, the offset is detected ---------------------------------------


def test_s0_reference_passes_and_offset_mismatches(work: Path) -> None:
    plan = plan_file(str(S0))
    expectations = [parse_expectation(f"{OFFSET_LABEL}=MISMATCH")]
    results, _ = run(plan, work / "runs", expectations=expectations)
    assert set(results) == {"baseline", "batch.size=1", OFFSET_LABEL}
    assert results["baseline"].outcome is Outcome.PASS
    assert results["batch.size=1"].outcome is Outcome.PASS
    offset = results[OFFSET_LABEL]
    assert offset.outcome is Outcome.MISMATCH
    assert all(r.as_expected and not r.reused for r in results.values())
    # every active token is moved by 8x the threshold on the training side
    assert offset.comparison.mismatches == offset.comparison.active_tokens > 0
    assert offset.comparison.diagnostics.max_abs_diff == pytest.approx(8e-3, rel=1e-3)
    baseline = results["baseline"].comparison
    assert baseline.diagnostics.max_abs_diff < 1e-4
    for result in results.values():
        assert result.attempt_dir is not None
        assert {p.name for p in result.attempt_dir.iterdir()} == ATTEMPT_FILES
        checked = check_attempt(result.attempt_dir, expected_key=None)
        assert checked.outcome is result.outcome
        assert checked.comparison.case_id == result.case_id
        actual = json.loads((result.attempt_dir / "actual.json").read_text())
        assert {k["status"] for k in actual["knobs"].values()} == {"applied"}
        evidence = actual["training_evidence"]
        assert evidence["state_digest_before"] == evidence["state_digest_after"]
        tensors = torch.load(result.attempt_dir / "token_diffs.pt", weights_only=True)
        assert set(tensors) == {"training_logprobs", "rollout_logprobs", "active_mask", "threshold"}
        assert tensors["active_mask"].dtype == torch.bool
    run_dir = work / "runs" / "s0-cpu-smoke"
    assert (run_dir / "experiment.json").is_file()
    rows = (run_dir / "plan.jsonl").read_text().splitlines()
    assert sorted(json.loads(r)["case_id"] for r in rows) == sorted(
        r.case_id for r in results.values()
    )


def test_without_expectation_the_offset_case_is_not_as_expected(work: Path) -> None:
    results, _ = run(plan_file(str(S0)), work, labels=(OFFSET_LABEL,))
    assert results[OFFSET_LABEL].expected is Outcome.PASS
    assert not results[OFFSET_LABEL].as_expected


def test_second_run_reuses_every_attempt(work: Path) -> None:
    plan = plan_file(str(S0))
    first, _ = run(plan, work)
    before = attempt_dirs(work)
    snapshot = {p: p.read_bytes() for d in before for p in d.iterdir()}
    assert len(before) == 3
    second, runner = run(plan, work)
    assert attempt_dirs(work) == before
    assert {p: p.read_bytes() for d in before for p in d.iterdir()} == snapshot
    assert runner.pool.rollout_constructions == runner.pool.training_constructions == 0
    for label, result in second.items():
        assert result.reused
        assert result.attempt_dir == first[label].attempt_dir
        assert result.outcome is first[label].outcome
        assert result.skipped_attempts == ()
        assert result.comparison == first[label].comparison


# --- engines --------------------------------------------------------------------------------


def _many_engines(document: dict[str, Any]) -> None:
    document["interventions"] = [
        {"path": "rollout.dtype", "values": ["bfloat16"]},
        {"path": "batch.size", "values": [1, 2]},
        {"path": "training.compute_dtype", "values": ["bfloat16"]},
        {"path": "logp.backend", "values": ["smoke_only.logp_offset"]},
    ]


@pytest.mark.parametrize("reverse", [False, True])
def test_engine_constructions_equal_distinct_fingerprints(work: Path, reverse: bool) -> None:
    plan = plan_for(work, _many_engines)
    built: list[str] = []

    class CountingAdapter(CpuSmokeAdapter):
        def build_rollout(
            self, binding: RuntimeBinding, identity: ScoringIdentity
        ) -> SyntheticRollout:
            built.append("rollout:" + binding.rollout_construction_fingerprint)
            return super().build_rollout(binding, identity)

        def build_training(
            self, binding: RuntimeBinding, identity: ScoringIdentity
        ) -> StatelessScorer:
            built.append("training:" + binding.training_construction_fingerprint)
            return super().build_training(binding, identity)

    cases = list(plan.cases)
    if reverse:
        cases.reverse()
    with make_runner(
        plan,
        runtime="cpu-smoke",
        artifacts=work / "runs",
        allow_smoke=True,
        adapter=CountingAdapter(),
    ) as runner:
        results = runner.run(cases)
        bindings = [runner.binding(ec) for ec in plan.cases]
        rollout_fps = {b.rollout_construction_fingerprint for b in bindings}
        training_fps = {b.training_construction_fingerprint for b in bindings}
    assert len(results) == 6
    assert all(r.outcome in (Outcome.PASS, Outcome.MISMATCH) for r in results)
    assert runner.pool.rollout_constructions == len(rollout_fps) == 3
    assert runner.pool.training_constructions == len(training_fps) == 3
    assert len(built) == len(set(built)) == 6  # no engine was ever built twice
    assert not runner.pool.rollout and not runner.pool.training  # all closed at the end
    # batch size is a request-lifecycle knob: it never forces a new engine
    by_label = {ec.case.label: runner.binding(ec) for ec in plan.cases}
    assert (
        by_label["batch.size=1"].rollout_construction_fingerprint
        == by_label["baseline"].rollout_construction_fingerprint
    )


# --- faults in the training scorer ----------------------------------------------------------

FAULT_OUTCOMES: dict[str, tuple[Outcome, str]] = {
    "mutate_parameter": (
        Outcome.INVALID_IDENTITY,
        "parameters/buffers changed during scoring: param:head",
    ),
    "mutate_buffer": (
        Outcome.INVALID_IDENTITY,
        "parameters/buffers changed during scoring: buffer:scale",
    ),
    "leave_train_mode": (Outcome.INVALID_IDENTITY, "module mode not restored"),
    "use_kv_cache": (Outcome.INVALID_IDENTITY, "KV cache used where the identity forbids it"),
    "alter_tokens": (Outcome.INVALID_IDENTITY, "token_ids: differs between rollout and training"),
    "drop_active": (Outcome.INVALID_IDENTITY, "active_mask: differs between rollout and training"),
    "nan_scores": (Outcome.INVALID_ARTIFACT, "training logprob is non-finite"),
    "integer_scores": (Outcome.INVALID_ARTIFACT, "training logprobs have non-floating dtype"),
}


def test_every_fault_is_covered() -> None:
    assert set(FAULT_OUTCOMES) == set(FAULTS)


@pytest.mark.parametrize("fault", sorted(FAULT_OUTCOMES))
def test_scorer_fault_outcome(work: Path, fault: str) -> None:
    outcome, words = FAULT_OUTCOMES[fault]
    results, _ = run(
        plan_file(str(S0)), work, adapter=FaultyCpuSmokeAdapter(fault), labels=("baseline",)
    )
    result = results["baseline"]
    assert result.outcome is outcome, result.reason
    assert words in result.reason
    assert result.attempt_dir is not None
    comparison = check_attempt(result.attempt_dir, expected_key=None).comparison
    assert comparison.outcome.value == outcome.value
    if outcome is Outcome.INVALID_IDENTITY:
        assert any(words in v for v in comparison.identity_violations)
        # the numbers alone would have passed: identity is decided first, not numerics
        if fault not in ("alter_tokens", "drop_active"):
            assert comparison.numerical.outcome.value == "PASS"


def test_faulty_scorer_attempt_is_not_reused_by_a_clean_scorer(work: Path) -> None:
    plan = plan_file(str(S0))
    faulty, _ = run(
        plan, work, adapter=FaultyCpuSmokeAdapter("mutate_parameter"), labels=("baseline",)
    )
    assert faulty["baseline"].outcome is Outcome.INVALID_IDENTITY
    clean, _ = run(plan, work, labels=("baseline",))
    assert not clean["baseline"].reused
    assert clean["baseline"].outcome is Outcome.PASS
    assert any("execution key differs" in s for s in clean["baseline"].skipped_attempts)


class TamperingAdapter(CpuSmokeAdapter):
    """Alters one identity field or consumed tensor on one side, after honest scoring."""

    def __init__(self, side: str, field: str) -> None:
        super().__init__()
        self.side = side
        self.field = field

    def build_rollout(self, binding: RuntimeBinding, identity: ScoringIdentity) -> SyntheticRollout:
        engine = super().build_rollout(binding, identity)
        if self.side == "rollout":
            generate = engine.generate

            def tampered(*args: Any, **kwargs: Any) -> RolloutOutput:
                out = generate(*args, **kwargs)
                return RolloutOutput(
                    tensors=out.tensors, identity={**out.identity, self.field: "tampered"}
                )

            engine.generate = tampered  # type: ignore[method-assign]
        return engine

    def build_training(self, binding: RuntimeBinding, identity: ScoringIdentity) -> StatelessScorer:
        scorer = super().build_training(binding, identity)
        if self.side == "training":
            score = scorer.score

            def tampered(*args: Any, **kwargs: Any) -> Any:
                out = score(*args, **kwargs)
                if self.field in out.consumed:
                    consumed = dict(out.consumed)
                    changed = consumed[self.field].clone()
                    changed[0, 1] = (
                        ~changed[0, 1] if changed.dtype == torch.bool else changed[0, 1] + 1
                    )
                    consumed[self.field] = changed
                    return dataclasses.replace(out, consumed=consumed)
                return dataclasses.replace(out, identity={**out.identity, self.field: "tampered"})

            scorer.score = tampered  # type: ignore[method-assign]
        return scorer


IDENTITY_FIELDS = (
    "checkpoint_uri",
    "model_version",
    "checkpoint_digest",
    "tokenizer_id",
    "packing",
    "positions",
)


@pytest.mark.parametrize(
    ("side", "field"),
    [(s, f) for f in IDENTITY_FIELDS for s in ("rollout", "training")]
    + [("training", t) for t in ("token_ids", "attention_mask", "active_mask", "position_ids")],
)
def test_each_identity_field_gives_invalid_identity(work: Path, side: str, field: str) -> None:
    results, _ = run(
        plan_file(str(S0)), work, adapter=TamperingAdapter(side, field), labels=("baseline",)
    )
    result = results["baseline"]
    assert result.outcome is Outcome.INVALID_IDENTITY
    assert result.reason.startswith(f"{field}:"), result.reason
    assert result.attempt_dir is not None
    check_attempt(result.attempt_dir, expected_key=None)


# --- strict execution -----------------------------------------------------------------------


def test_unsupported_knob_is_strict_rejected(work: Path) -> None:
    def edit(document: dict[str, Any]) -> None:
        document["baseline"]["rollout"].update(tensor_parallel_size=1, enable_prefix_caching=False)
        document["interventions"] = [
            {"path": "rollout.tensor_parallel_size", "values": [2]},
            {"path": "rollout.enable_prefix_caching", "values": [True]},
        ]

    plan = plan_for(work, edit)
    results, runner = run(plan, work / "runs")
    assert results["baseline"].outcome is Outcome.PASS
    for label, knob in (
        ("rollout.tensor_parallel_size=2", "rollout.tensor_parallel_size=2"),
        ("rollout.enable_prefix_caching=true", "rollout.enable_prefix_caching=True"),
    ):
        result = results[label]
        assert result.outcome is Outcome.STRICT_REJECTED
        assert knob in result.reason and "unsupported" in result.reason
        assert result.attempt_dir is not None
        sealed = check_attempt(result.attempt_dir, expected_key=None)
        assert "token_diffs.pt" not in sealed.seal.files  # nothing was scored
    # the rejected cases never built an engine of their own
    assert runner.pool.rollout_constructions == 1
    assert runner.pool.training_constructions == 1


class DtypeIgnoringAdapter(CpuSmokeAdapter):
    """Claims to apply rollout.dtype but always builds float32: a silent fallback."""

    def build_rollout(self, binding: RuntimeBinding, identity: ScoringIdentity) -> SyntheticRollout:
        forced = dataclasses.replace(
            binding,
            rollout_settings=dataclasses.replace(binding.rollout_settings, dtype=DType.FLOAT32),
        )
        return super().build_rollout(forced, identity)


class DeclaredFallbackAdapter(DtypeIgnoringAdapter):
    """Declares at materialization that rollout.dtype=bfloat16 falls back to float32."""

    def materialize(self, requested: Mapping[str, Any]) -> Mapping[str, Materialized]:
        result = dict(super().materialize(requested))
        if requested.get("rollout.dtype") == "bfloat16":
            result["rollout.dtype"] = Materialized(
                value="float32",
                status=ApplicationStatus.FALLBACK,
                evidence="declared: no bfloat16 rollout kernels, runs float32",
            )
        return result


def _lenient(edit: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def apply(document: dict[str, Any]) -> None:
        edit(document)
        document["strict_fallback"] = False

    return apply


def _declared(document: dict[str, Any]) -> None:
    document["interventions"] = [{"path": "rollout.dtype", "values": ["bfloat16"]}]


def _undeclared(document: dict[str, Any]) -> None:
    document["baseline"]["rollout"]["dtype"] = "bfloat16"
    document["interventions"] = [{"path": "batch.size", "values": [1]}]


@pytest.mark.parametrize("edit", [_declared, _lenient(_declared)])
def test_silent_fallback_is_always_strict_rejected(work: Path, edit: Any) -> None:
    """An engine that claims to apply a value and runs another is an error, strict or not."""
    results, _ = run(plan_for(work, edit), work / "a", adapter=DtypeIgnoringAdapter())
    assert results["baseline"].outcome is Outcome.PASS
    case = results["rollout.dtype=bfloat16"]
    assert case.outcome is Outcome.STRICT_REJECTED
    assert "rollout.dtype='bfloat16': error" in case.reason
    assert "silent fallback: engine reports 'float32'" in case.reason
    record = next(r for r in case.comparison.records if r.knob == "rollout.dtype")
    assert (record.status.value, record.actual) == ("error", "float32")


def test_declared_fallback_is_measurable_only_as_the_declared_intervention(work: Path) -> None:
    results, _ = run(plan_for(work, _declared), work / "a", adapter=DeclaredFallbackAdapter())
    case = results["rollout.dtype=bfloat16"]
    assert case.outcome is Outcome.PASS  # measured: both sides really ran float32
    record = next(r for r in case.comparison.records if r.knob == "rollout.dtype")
    assert (record.status.value, record.materialized, record.actual) == (
        "fallback",
        "float32",
        "float32",
    )

    results, _ = run(plan_for(work, _undeclared), work / "b", adapter=DeclaredFallbackAdapter())
    assert set(results) == {"baseline", "batch.size=1"}
    for result in results.values():
        assert result.outcome is Outcome.STRICT_REJECTED
        assert "rollout.dtype='bfloat16': fallback" in result.reason

    results, _ = run(
        plan_for(work, _lenient(_undeclared)), work / "c", adapter=DeclaredFallbackAdapter()
    )
    assert {r.outcome for r in results.values()} == {Outcome.PASS}


def _native(document: dict[str, Any]) -> None:
    document["baseline"]["logp"]["backend"] = "native"
    document["interventions"] = [{"path": "batch.size", "values": [1]}]


def test_native_backend_runs_without_smoke_operators(work: Path) -> None:
    results, _ = run(plan_for(work, _native), work / "runs", allow_smoke=False)
    assert {r.outcome for r in results.values()} == {Outcome.PASS}


@pytest.mark.parametrize("registry", ["changed_descriptor", "backend_gone"])
def test_stale_registry_state_is_strict_rejected(work: Path, registry: str) -> None:
    plan = plan_for(work, _native)  # bound against the default catalog
    if registry == "changed_descriptor":
        changed = dataclasses.replace(NATIVE_DESCRIPTOR, version="runtime-2")
        assert changed.fingerprint != NATIVE_DESCRIPTOR.fingerprint
        catalog = SemanticOperatorCatalog((changed,))
    else:
        catalog = SemanticOperatorCatalog(())
    results, runner = run(plan, work / "runs", allow_smoke=False, catalog=catalog)
    for result in results.values():
        assert result.outcome is Outcome.STRICT_REJECTED
        assert "stale registry state" in result.reason
        assert "'native'" in result.reason
    assert runner.pool.rollout_constructions == runner.pool.training_constructions == 0


# --- plan only, authorization ---------------------------------------------------------------


def _s2_on_cpu(document: dict[str, Any]) -> None:
    _native(document)
    document["scenario"] = {"level": "S2", "device": "cpu"}


@pytest.mark.parametrize("source", ["derived", "shipped"])
def test_s2_is_plan_only_on_cpu_smoke(work: Path, source: str) -> None:
    plan = plan_for(work, _s2_on_cpu) if source == "derived" else plan_file(str(S2))
    runner = make_runner(plan, runtime="cpu-smoke", artifacts=work / "runs")
    with runner:
        results = runner.run()
    assert results and {r.outcome for r in results} == {Outcome.PLAN_ONLY}
    assert all(r.attempt_dir is None and not r.reused for r in results)
    assert all("plan-only for runtime 'cpu-smoke'" in r.reason for r in results)
    assert runner._adapter is None  # the runtime was never even loaded
    assert attempt_dirs(work / "runs") == set()


def test_runner_refuses_smoke_operators_without_authorization(work: Path) -> None:
    plan = plan_file(str(S0))
    with pytest.raises(UsageError, match="test-only selected_logprob backends") as info:
        make_runner(plan, runtime="cpu-smoke", artifacts=work / "runs")
    assert "baseline" in str(info.value)
    assert "--" not in str(info.value)  # the core names no frontend's flag
    assert info.value.remedy is Remedy.AUTHORIZE_TEST_OPERATORS
    assert not (work / "runs").exists()


def test_unknown_runtime_is_a_usage_error(work: Path) -> None:
    with pytest.raises(UsageError, match="unknown runtime"):
        make_runner(plan_file(str(S0)), runtime="nope", artifacts=work, allow_smoke=True)


# --- resume ---------------------------------------------------------------------------------


def test_partial_newer_attempt_is_skipped_and_older_valid_one_reused(work: Path) -> None:
    plan = plan_file(str(S0))
    first, _ = run(plan, work, labels=("baseline",))
    original = first["baseline"]
    assert original.attempt_dir is not None
    partial = AttemptWriter(original.attempt_dir.parent, original.case_id, "whatever")
    partial.write_json("requested.json", {"partial": True})
    assert partial.attempt_id > original.attempt_dir.name  # newest first in discovery
    second, _ = run(plan, work, labels=("baseline",))
    result = second["baseline"]
    assert result.reused
    assert result.attempt_dir == original.attempt_dir
    assert len(result.skipped_attempts) == 1
    assert partial.attempt_id in result.skipped_attempts[0]
    assert "COMPLETE" in result.skipped_attempts[0]


def test_tampered_attempt_is_ignored_and_left_untouched(work: Path) -> None:
    plan = plan_file(str(S0))
    first, _ = run(plan, work, labels=("baseline",))
    attempt = first["baseline"].attempt_dir
    assert attempt is not None
    target = attempt / "score_training.pt"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    second, _ = run(plan, work, labels=("baseline",))
    result = second["baseline"]
    assert not result.reused
    assert result.attempt_dir != attempt
    assert result.outcome is Outcome.PASS
    assert any("score_training.pt" in s for s in result.skipped_attempts)
    assert target.read_bytes() == bytes(data)


def test_changed_environment_is_not_reused(work: Path) -> None:
    class OtherEnvironment(CpuSmokeAdapter):
        def environment(self, identity: ScoringIdentity) -> dict[str, str]:
            return {**super().environment(identity), "synthetic_model": "v2"}

    plan = plan_file(str(S0))
    run(plan, work, labels=("baseline",))
    second, _ = run(plan, work, adapter=OtherEnvironment(), labels=("baseline",))
    assert not second["baseline"].reused
    assert "execution key differs" in second["baseline"].skipped_attempts[0]
    third, _ = run(plan, work, adapter=OtherEnvironment(), labels=("baseline",))
    assert third["baseline"].reused
    assert third["baseline"].attempt_dir == second["baseline"].attempt_dir
