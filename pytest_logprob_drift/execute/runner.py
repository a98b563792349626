"""The paired runner: one entry point for the CLI and the pytest plugin alike.

Owns coordinating an execution plan against one runtime: refusing test-only operator backends
unless the execution policy authorizes them, PLAN_ONLY for scenarios the runtime does not
execute, the execution key and resume (reuse a sealed, consistent attempt; report the ones
skipped), execution through ``execute.case``, engine reuse by construction fingerprint with
teardown as soon as no remaining case needs an engine, and the per-case result. Under the ray
launcher (``execute.launch``) it also runs engine groups side by side in threads when the
resources their engines declare fit the cluster's free ones, with results, failures and sealed
attempts equal to a serial run's. Receives its operator catalog, runtime catalog and launch
policy from the frontend; knows no concrete runtime or backend, and nothing about Ray.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_logprob_drift.check.resume import check_attempt
from pytest_logprob_drift.errors import Remedy, UsageError
from pytest_logprob_drift.execute.case import CaseExecution, execute_case
from pytest_logprob_drift.execute.engine_pool import EnginePool
from pytest_logprob_drift.execute.launch import Launch, LaunchAware, ResourceAware, fits
from pytest_logprob_drift.execute.protocol import (
    Materialized,
    RuntimeAdapter,
    RuntimeBinding,
    bind_case,
    order_for_reuse,
)
from pytest_logprob_drift.execute.provenance import base_environment, execution_key_payload
from pytest_logprob_drift.execute.runtime_catalog import RuntimeCatalog, load_adapter
from pytest_logprob_drift.execute.settings import MAX_BASELINE_REPEATS, RunSettings
from pytest_logprob_drift.execute.side_settings import SettingsTypes
from pytest_logprob_drift.numerics.comparison import Comparison
from pytest_logprob_drift.outcomes import Expectation, Outcome, expected_outcome
from pytest_logprob_drift.plan.binding import ExecutionCase, ExecutionPlan
from pytest_logprob_drift.records import CaseKind, JsonObject, JsonValue, canonical
from pytest_logprob_drift.registry.catalog import SemanticOperatorCatalog
from pytest_logprob_drift.store.attempt import execution_key
from pytest_logprob_drift.store.run import ArtifactStore
from pytest_logprob_drift.store.seal import SealError


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseResult:
    case_id: str
    label: str
    kind: CaseKind
    outcome: Outcome
    expected: Outcome
    reason: str
    reused: bool
    attempt_dir: Path | None
    comparison: Comparison | None = None
    """The sealed comparison of the attempt (None when no attempt was sealed: PLAN_ONLY)."""
    skipped_attempts: tuple[str, ...] = ()
    repeat_dirs: tuple[Path, ...] = ()
    """The baseline's repeated executions (noise floor); empty for other cases."""

    @property
    def as_expected(self) -> bool:
        return self.outcome is self.expected


Progress = Callable[[int, int, ExecutionCase, "CaseResult | Exception | None"], None]


class Runner:
    """Runs cases of one execution plan on one runtime; use as a context manager."""

    def __init__(
        self,
        execution_plan: ExecutionPlan,
        *,
        runtime: str,
        runtimes: RuntimeCatalog,
        catalog: SemanticOperatorCatalog,
        artifacts: Path,
        allow_test_only: bool = False,
        expectations: Sequence[Expectation] = (),
        adapter: RuntimeAdapter | None = None,
        baseline_repeats: int = 1,
        launch: Launch | None = None,
        replay: bool = False,
        settings: SettingsTypes | None = None,
    ) -> None:
        """``catalog`` holds every backend planning bound (test-only ones included); only the
        production ones are registered for execution unless ``allow_test_only``. ``settings``:
        the typed settings classes ``bind_case`` builds for the engines (None: the
        production ones)."""
        if execution_plan.has_errors:
            first = next(i for i in execution_plan.issues if i.severity.value == "error")
            raise UsageError(f"the plan has errors; first: {first.render()}")
        self.plan = execution_plan
        self.info = runtimes.get(runtime)
        self.allow_test_only = allow_test_only
        if not 1 <= baseline_repeats <= MAX_BASELINE_REPEATS:
            raise UsageError(
                f"baseline repeats must be in [1, {MAX_BASELINE_REPEATS}], got {baseline_repeats}"
            )
        self.baseline_repeats = baseline_repeats
        self.replay = replay
        self.settings = settings
        self.expectations = tuple(expectations)
        test_only = [ec.case.label for ec in execution_plan.cases if ec.uses_test_only_operators]
        if test_only and not allow_test_only:
            raise UsageError(
                f"case(s) {', '.join(test_only)} bind test-only selected_logprob "
                "backends, which need registration and authorization",
                remedy=Remedy.AUTHORIZE_TEST_OPERATORS,
            )
        self._bindings: dict[str, RuntimeBinding] = {}
        planted = [
            ec.case.label
            for ec in execution_plan.cases
            if self.binding(ec).rollout_settings.weight_sync.planted is not None
        ]
        if planted and not allow_test_only:
            raise UsageError(
                f"case(s) {', '.join(planted)} name a planted (test-only) rollout.weight_sync "
                "variant, which needs the test-only authorization",
                remedy=Remedy.AUTHORIZE_TEST_OPERATORS,
            )
        planted_routing = [
            ec.case.label
            for ec in execution_plan.cases
            if self.binding(ec).training_settings.moe_routing.planted is not None
        ]
        if planted_routing and not allow_test_only:
            raise UsageError(
                f"case(s) {', '.join(planted_routing)} name a planted (test-only) "
                "training.moe_routing variant, which needs the test-only authorization",
                remedy=Remedy.AUTHORIZE_TEST_OPERATORS,
            )
        self.catalog = catalog if allow_test_only else catalog.without_test_only()
        self.store = ArtifactStore(artifacts, execution_plan.plan.experiment_id)
        self.executable = self.info.executes(execution_plan.plan.scenario)
        self.launch = launch or Launch()
        self._adapter = adapter
        self._launch_given = False
        self.pool = EnginePool()
        self.notes = self.store.initialize(
            self._experiment_document(), execution_plan.rows(runtimes.runtimes)
        )

    @classmethod
    def from_settings(
        cls,
        execution_plan: ExecutionPlan,
        settings: RunSettings,
        *,
        runtimes: RuntimeCatalog,
        catalog: SemanticOperatorCatalog,
    ) -> Runner:
        """The runner of ``execution_plan`` under a frontend's settings (the one way both
        frontends construct it); the catalogs are the ones planning bound against."""
        if settings.runtime is None:
            raise UsageError("executing cases needs a runtime")
        return cls(
            execution_plan,
            runtime=settings.runtime,
            runtimes=runtimes,
            catalog=catalog,
            artifacts=settings.artifacts,
            allow_test_only=settings.allow_test_only,
            expectations=settings.expectations,
            baseline_repeats=settings.baseline_repeats,
            launch=settings.launch,
            replay=settings.replay,
        )

    def _experiment_document(self) -> JsonObject:
        plan = self.plan.plan
        return {
            "experiment_id": plan.experiment_id,
            "scenario_id": plan.scenario_id,
            "scenario": canonical(plan.scenario),
            "contract": canonical(plan.contract),
            "strategy": plan.strategy.value,
            "strict_fallback": plan.strict_fallback,
            "identity": plan.identity.canonical_identity(),
        }

    @property
    def adapter(self) -> RuntimeAdapter:
        if self._adapter is None:
            self._adapter = load_adapter(self.info)
        if not self._launch_given:
            self._launch_given = True
            if isinstance(self._adapter, LaunchAware):
                self._adapter.use_launch(self.launch)
        return self._adapter

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.pool.close()
        if self._adapter is not None:
            self._adapter.close()

    def binding(self, ec: ExecutionCase) -> RuntimeBinding:
        if ec.case.case_id not in self._bindings:
            plan = self.plan.plan
            self._bindings[ec.case.case_id] = bind_case(
                ec,
                runtime_kind=self.info.name,
                identity=plan.identity,
                device=plan.scenario.device,
                # --replay (the run's option) asks for diagnostics.replay in every case.
                diagnostics={**plan.diagnostics, **({"replay": True} if self.replay else {})},
                settings=self.settings,
            )
        return self._bindings[ec.case.case_id]

    def release_engines_except(self, remaining: Iterable[ExecutionCase]) -> None:
        """Close every engine that none of ``remaining`` needs."""
        bindings = [self.binding(ec) for ec in remaining]
        self.pool.release_unneeded(
            {b.rollout_construction_fingerprint for b in bindings},
            {b.training_construction_fingerprint for b in bindings},
        )

    def run_case(self, ec: ExecutionCase) -> CaseResult:
        case = ec.case
        plan = self.plan.plan
        expected = expected_outcome(self.expectations, case.case_id, case.label)
        if not self.executable:
            return CaseResult(
                case_id=case.case_id,
                label=case.label,
                kind=case.kind,
                outcome=Outcome.PLAN_ONLY,
                expected=expected,
                reason=self.info.plan_only_reason(plan.scenario),
                reused=False,
                attempt_dir=None,
            )
        binding = self.binding(ec)
        adapter = self.adapter
        materialized = adapter.materialize(case.requested)
        environment = {
            **base_environment(plan.scenario.device),
            **adapter.environment(plan.identity),
        }
        payload = execution_key_payload(
            ec=ec,
            identity=plan.identity,
            materialized=materialized,
            binding=binding,
            contract=plan.contract,
            environment=environment,
        )
        key = execution_key(payload)
        valid, skipped = self._valid_attempts(case.case_id, key)
        if case.kind is CaseKind.BASELINE and self.baseline_repeats > 1:
            # The baseline and its repeats are the newest valid attempts in the order they were
            # executed, so a rerun pairs them exactly as the first run did.
            valid = sorted(valid[: self.baseline_repeats], key=lambda v: v[0].name)
        if valid:
            attempt_dir, comparison = valid[0]
            reused = True
        else:
            attempt_dir, comparison = self._execute(ec, materialized, payload, key)
            reused = False
        repeats: tuple[Path, ...] = ()
        if case.kind is CaseKind.BASELINE and self.baseline_repeats > 1:
            repeats = self._repeats(
                ec, materialized, payload, key, attempt_dir, [d for d, _ in valid]
            )
        return CaseResult(
            case_id=case.case_id,
            label=case.label,
            kind=case.kind,
            outcome=comparison.outcome,
            expected=expected,
            reason=comparison.reason,
            reused=reused,
            attempt_dir=attempt_dir,
            comparison=comparison,
            skipped_attempts=tuple(skipped),
            repeat_dirs=repeats,
        )

    def _valid_attempts(
        self, case_id: str, key: str
    ) -> tuple[list[tuple[Path, Comparison]], list[str]]:
        """Sealed attempts that may stand in for this execution (newest first), and why the
        others may not."""
        valid: list[tuple[Path, Comparison]] = []
        skipped: list[str] = []
        for attempt in self.store.attempts(case_id):
            try:
                checked = check_attempt(attempt, expected_key=key)
            except SealError as exc:
                skipped.append(f"{attempt.name}: {exc}")
                continue
            valid.append((attempt, checked.comparison))
        return valid, skipped

    def _execute(
        self,
        ec: ExecutionCase,
        materialized: Mapping[str, Materialized],
        payload: Mapping[str, JsonValue],
        key: str,
    ) -> tuple[Path, Comparison]:
        plan = self.plan.plan
        executed = execute_case(
            CaseExecution(
                ec=ec,
                identity=plan.identity,
                binding=self.binding(ec),
                materialized=materialized,
                adapter=self.adapter,
                pool=self.pool,
                catalog=self.catalog,
                allow_test_only=self.allow_test_only,
                contract=plan.contract,
                strict=plan.strict_fallback,
                store=self.store,
                execution_key=key,
                key_payload=payload,
                refusals=tuple(
                    ec.runtime_refusals(
                        self.info, plan.scenario.device, plan.identity.checkpoint.uri
                    )
                ),
            )
        )
        attempt_dir = self.store.case_dir(ec.case.case_id) / executed.seal.attempt_id
        return attempt_dir, check_attempt(attempt_dir, expected_key=key).comparison

    def _repeats(
        self,
        ec: ExecutionCase,
        materialized: Mapping[str, Materialized],
        payload: Mapping[str, JsonValue],
        key: str,
        primary: Path,
        valid: list[Path],
    ) -> tuple[Path, ...]:
        """The baseline executed ``baseline_repeats - 1`` more times with the same engines
        (sealed attempts of the same key are reused first): the run-to-run noise floor."""
        extra = [d for d in valid if d != primary][: self.baseline_repeats - 1]
        while len(extra) < self.baseline_repeats - 1:
            extra.append(self._execute(ec, materialized, payload, key)[0])
        return tuple(extra)

    def order(self, cases: Sequence[ExecutionCase]) -> list[ExecutionCase]:
        """Group cases so each engine is built once: process, then rollout, then training."""
        if not self.executable:
            return list(cases)
        return order_for_reuse(cases, self.binding)

    def run(
        self,
        cases: Sequence[ExecutionCase] | None = None,
        *,
        progress: Progress | None = None,
        failures: list[tuple[ExecutionCase, Exception]] | None = None,
    ) -> list[CaseResult]:
        """Run cases in reuse order, closing each engine once no later case needs it.

        ``progress(index, total, case, outcome)`` is called before a case (outcome None) and
        after it (its CaseResult, or the exception it raised). Without ``failures`` a case
        that raises ends the run; with it, the failure is recorded there and the run goes on.
        Usage errors always end the run.

        Under the ray launcher (``concurrent``), cases are split into engine groups (cases
        linked by a shared rollout or training engine; each engine is still built once) and
        groups run side by side while their declared resources fit the cluster's free ones.
        Each group runs its cases one after another in reuse order; the results, the
        failures and every sealed attempt are those of the serial run, in the same order
        (progress lines may interleave).
        """
        ordered = self.order(list(cases if cases is not None else self.plan.cases))
        groups = self._engine_groups(ordered)
        if len(groups) < 2:
            return self._run_serial(ordered, progress, failures)
        return self._run_groups(ordered, groups, progress, failures)

    def _run_serial(
        self,
        ordered: list[ExecutionCase],
        progress: Progress | None,
        failures: list[tuple[ExecutionCase, Exception]] | None,
    ) -> list[CaseResult]:
        results: list[CaseResult] = []
        for index, ec in enumerate(ordered):
            outcome = self._run_one(index, ordered, ec, progress, failures is not None)
            if self.executable:
                self.release_engines_except(ordered[index + 1 :])
            if isinstance(outcome, CaseResult):
                results.append(outcome)
            else:
                assert failures is not None
                failures.append((ec, outcome))
            if progress is not None:
                progress(index, len(ordered), ec, outcome)
        return results

    def _run_one(
        self,
        index: int,
        ordered: Sequence[ExecutionCase],
        ec: ExecutionCase,
        progress: Progress | None,
        keep_going: bool,
    ) -> CaseResult | Exception:
        if progress is not None:
            progress(index, len(ordered), ec, None)
        try:
            return self.run_case(ec)
        except UsageError:
            raise
        except Exception as exc:  # a runtime crash in one case must not lose the others
            if not keep_going:
                raise
            return exc

    # -- engine groups side by side (ray launcher) ------------------------------------------

    def _engine_groups(self, ordered: list[ExecutionCase]) -> list[list[int]]:
        """Indices into ``ordered`` of each engine group (in order), or one group when cases
        must run serially (local launcher, not concurrent, plan-only, an adapter that
        declares no resources)."""
        everything = [list(range(len(ordered)))]
        if not (self.launch.is_ray and self.launch.concurrent and self.executable):
            return everything
        if not isinstance(self.adapter, ResourceAware) or len(ordered) < 2:
            return everything
        parent: dict[str, str] = {}

        def find(key: str) -> str:
            while parent.setdefault(key, key) != key:
                key = parent[key]
            return key

        for ec in ordered:
            b = self.binding(ec)
            rollout = find("r:" + b.rollout_construction_fingerprint)
            training = find("t:" + b.training_construction_fingerprint)
            parent[training] = rollout
        groups: dict[str, list[int]] = {}
        for index, ec in enumerate(ordered):
            root = find("r:" + self.binding(ec).rollout_construction_fingerprint)
            groups.setdefault(root, []).append(index)
        return list(groups.values())

    def _demand(self, adapter: ResourceAware, cases: Iterable[ExecutionCase]) -> dict[str, float]:
        """What a group holds at most at once: per resource, the most any of its cases needs."""
        demand: dict[str, float] = {}
        for ec in cases:
            for name, amount in adapter.engine_resources(self.binding(ec)).items():
                demand[name] = max(demand.get(name, 0.0), float(amount))
        return demand

    def _run_groups(
        self,
        ordered: list[ExecutionCase],
        groups: list[list[int]],
        progress: Progress | None,
        failures: list[tuple[ExecutionCase, Exception]] | None,
    ) -> list[CaseResult]:
        adapter = self.adapter
        assert isinstance(adapter, ResourceAware)
        for ec in ordered:  # everything shared is computed before any thread starts
            self.binding(ec)
        demands = [self._demand(adapter, (ordered[i] for i in group)) for group in groups]
        free = dict(adapter.cluster_resources())
        lock = threading.Lock()
        outcomes: dict[int, CaseResult | Exception] = {}

        def report(index: int, total: int, ec: ExecutionCase, outcome: Any) -> None:
            if progress is not None:
                with lock:
                    progress(index, total, ec, outcome)

        def run_group(group: list[int]) -> None:
            for position, index in enumerate(group):
                ec = ordered[index]
                outcome = self._run_one(index, ordered, ec, report, failures is not None)
                later = [ordered[i] for i in group[position + 1 :]]
                self._release_group_engines(ec, later)
                outcomes[index] = outcome
                report(index, len(ordered), ec, outcome)

        pending = list(range(len(groups)))
        running: dict[Future[None], int] = {}
        errors: list[BaseException] = []
        with ThreadPoolExecutor(max_workers=len(groups), thread_name_prefix="drift-group") as ex:
            while pending or running:
                # Start groups in order while the next one fits (or nothing else runs).
                while pending and not errors and (fits(demands[pending[0]], free) or not running):
                    g = pending.pop(0)
                    for name, amount in demands[g].items():
                        free[name] = free.get(name, 0.0) - amount
                    running[ex.submit(run_group, groups[g])] = g
                if not running:
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    g = running.pop(future)
                    for name, amount in demands[g].items():
                        free[name] = free.get(name, 0.0) + amount
                    if (exc := future.exception()) is not None:
                        errors.append(exc)
        if errors:
            raise errors[0]
        results: list[CaseResult] = []
        for index in sorted(outcomes):
            outcome = outcomes[index]
            if isinstance(outcome, CaseResult):
                results.append(outcome)
            elif failures is not None:
                failures.append((ordered[index], outcome))
        return results

    def _release_group_engines(self, done: ExecutionCase, later: Sequence[ExecutionCase]) -> None:
        """Close the engines of ``done`` that no later case of its group needs."""
        b = self.binding(done)
        rollout_needed = {self.binding(ec).rollout_construction_fingerprint for ec in later}
        training_needed = {self.binding(ec).training_construction_fingerprint for ec in later}
        self.pool.release(
            {b.rollout_construction_fingerprint} - rollout_needed,
            {b.training_construction_fingerprint} - training_needed,
        )
