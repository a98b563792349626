"""``logp.backend`` on the vLLM rollout side (issue 33), without an engine: the read-back
checks that turn what the workers report about their sampler into the knob's ``actual`` value
(and so into STRICT_REJECTED with the reason), the LM head read-back, and the planning rule
that drops a runtime that cannot inject a case's backend from its ``executable_by`` and makes
the runner refuse the case before any engine is built.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from drift_testing import S1, make_runner

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.execute.protocol import (
    Materialized,
    application_records,
    strict_violations,
)
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.policy import assemble
from pytest_logprob_drift.records import ApplicationStatus, Lifecycle, frozen_mapping
from pytest_logprob_drift.registry.catalog import SELECTED_LOGPROB, OperatorDescriptor
from pytest_logprob_drift.runtimes import HF, VLLM_HF
from pytest_logprob_drift.runtimes.vllm.logp_check import (
    PROMPT,
    SAMPLED,
    injection_actual,
    lm_head_actual,
)
from pytest_logprob_drift.runtimes.vllm.rollout_logp import SITES, VIOLATIONS

CHUNKED = "rlkernel.chunked_logp"
REFERENCE: dict[str, Any] = {
    "backend": CHUNKED,
    "factory": "logprob_drift_operators.selected_logprob.chunked:chunked_selected_logprob",
    "factory_style": "kernel",
    "target": "rollout",
    "options": {},
    "version": "1.0.0",
    "build_fingerprint": "abcdef0123456789",
}


def _worker(sampled: int = 0, prompt: int = 0, **changes: Any) -> dict[str, Any]:
    report: dict[str, Any] = {
        "model_runner": "CPUModelRunner",
        "sampler_class": "Sampler",
        "logprobs_mode": "raw_logprobs",
        "untouched": False,
        "installed": True,
        **{k: REFERENCE[k] for k in ("backend", "version", "build_fingerprint", "factory")},
        "kernel": "logprob_drift_operators.selected_logprob.chunked.chunked_selected_logprob",
        "sites": list(SITES),
        "counts": {SAMPLED: sampled, PROMPT: prompt},
        "violations": dict.fromkeys(VIOLATIONS, 0),
    }
    report.update(changes)
    return report


def _check(before: list[dict[str, Any]], after: list[dict[str, Any]], **kw: Any) -> tuple[str, str]:
    args: dict[str, Any] = {
        "asked": CHUNKED,
        "reference": REFERENCE,
        "rows": 10,
        "site": SAMPLED,
        "tp_size": len(after),
    }
    args.update(kw)
    return injection_actual(before=before, after=after, **args)


def test_a_backend_counts_only_when_every_worker_ran_it_on_every_row() -> None:
    actual, evidence = _check([_worker(5), _worker(5)], [_worker(15), _worker(15)])
    assert actual == CHUNKED
    assert "all 2 worker(s)" in evidence and "all 10 sampled rows" in evidence
    # the prefill replay's site is counted on its own
    actual, _ = _check([_worker(prompt=3)], [_worker(prompt=13)], site=PROMPT)
    assert actual == CHUNKED


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        (_worker(9), "worker 0's kernel scored 9 sampled rows, the engine returned 10"),
        (_worker(10, version="0.9"), "worker 0 runs version '0.9', asked '1.0.0'"),
        (
            _worker(10, build_fingerprint="ffff"),
            "worker 0 runs build_fingerprint 'ffff', asked 'abcdef0123456789'",
        ),
        (_worker(10, backend="rlkernel.reference_logp"), "worker 0 runs backend"),
        (_worker(10, sites=list(SITES)[:1]), "worker 0 patched"),
        (
            _worker(10, violations={**dict.fromkeys(VIOLATIONS, 0), "logits_modified": 2}),
            "worker 0 counted 2 logits modified",
        ),
        (
            {**_worker(10), "installed": False, "error": "model runner GPUModelRunnerV2 is not"},
            "worker 0 installed nothing: model runner GPUModelRunnerV2 is not",
        ),
        ({**_worker(10), "installed": False}, "worker 0 has no backend installed"),
    ],
)
def test_anything_else_is_not_the_backend_and_says_why(
    after: dict[str, Any], expected: str
) -> None:
    actual, _ = _check([_worker(0)], [after])
    assert actual.startswith(f"{CHUNKED} not applied: "), actual
    assert expected in actual


def test_native_must_be_vllms_own_sampler_and_every_worker_must_answer() -> None:
    own = {"installed": False, "untouched": True}
    assert _check([own], [own], asked="native", reference=None)[0] == "native"
    replaced = {"installed": False, "untouched": False}
    actual, _ = _check([own, own], [own, replaced], asked="native", reference=None)
    assert actual == "not native: worker(s) [1] run a replaced sampler"
    actual, _ = _check([_worker(0)], [_worker(10)], tp_size=2)
    assert actual == (
        f"{CHUNKED} unverified: 1 and 1 worker report(s) before and after the call, for tensor "
        "parallel size 2"
    )
    actual, _ = _check([own], [own], reference=None)
    assert actual.startswith(f"native (not injected: {CHUNKED} has no importable reference")


def test_a_failed_check_is_strict_rejected_with_the_reason() -> None:
    actual, _ = _check([_worker(0)], [_worker(7)])
    requested = {"logp.backend": CHUNKED}
    materialized = {
        "logp.backend": Materialized(
            value=CHUNKED, status=ApplicationStatus.APPLIED, evidence="injected"
        )
    }
    records = application_records(requested, materialized, {"logp.backend": actual})
    (record,) = records
    assert record.status is ApplicationStatus.ERROR
    (reason,) = strict_violations(records, changed=("logp.backend",), strict=True)
    assert "scored 7 sampled rows, the engine returned 10" in reason


def test_lm_head_read_back_from_the_logits_the_sampler_received() -> None:
    def head(model: str, compute: str, logits: str, requested: str = "float32") -> str:
        return lm_head_actual(
            requested=requested, model_dtype=model, compute_dtype=compute, logits_dtype=logits
        )

    assert head("bfloat16", "float32", "float32") == "float32"
    assert head("bfloat16", "bfloat16", "bfloat16") == "compute"
    assert head("float32", "float32", "float32", "compute") == "compute"
    assert head("float32", "float32", "float32", "float32") == "float32"
    assert head("bfloat16", "float32", "unknown").startswith("unobservable")
    assert head("bfloat16", "float32", "bfloat16,float32").startswith("mixed")
    assert head("bfloat16", "float32", "bfloat16").startswith("inconsistent")


# --------------------------------------------------------------------------- planning

COLLECTIVE = "rlkernel.test_vocab_sharded_rollout"
"""A (made-up) backend that serves the rollout side with vocabulary-parallel collectives."""


def _collective_catalog() -> Any:
    descriptor = OperatorDescriptor(
        operation=SELECTED_LOGPROB,
        backend_id=COLLECTIVE,
        target_tags=("rollout", "training"),
        devices=("cpu",),
        dtypes=("float32", "bfloat16"),
        required_topology=frozen_mapping({}),
        alignment_properties=("vocab_parallel_collectives",),
        lifecycle=Lifecycle.ENGINE_CONSTRUCTION,
        factory="logprob_drift_operators.selected_logprob.reference:reference_selected_logprob",
        version="0.0.1",
        build_fingerprint="test",
    )
    return assemble().operators.with_descriptors([descriptor])


def _s1(tmp_path: Path, backends: list[str]) -> str:
    document: dict[str, Any] = json.loads(S1.read_text())
    document["experiment_id"] = "rollout-logp-planning"
    document["interventions"] = [{"path": "logp.backend", "values": backends}]
    path = tmp_path / "s1.json"
    path.write_text(json.dumps(document))
    return str(path)


def test_both_production_runtimes_refuse_rollout_side_vocabulary_collectives() -> None:
    for runtime in (HF, VLLM_HF):
        why = runtime.logp_refusal("rollout", COLLECTIVE, ("vocab_parallel_collectives",))
        assert why is not None and why.startswith(f"runtime {runtime.name!r} cannot inject")
        assert runtime.logp_refusal("training", COLLECTIVE, ("vocab_parallel_collectives",)) is None
        assert runtime.logp_refusal("rollout", CHUNKED, ("online_logsumexp",)) is None
    why = VLLM_HF.logp_refusal("rollout", COLLECTIVE, ("vocab_parallel_collectives",))
    assert why is not None and "all-gathers the logits over the TP ranks" in why


def test_a_runtime_that_cannot_inject_drops_out_of_executable_by(tmp_path: Path) -> None:
    catalog = _collective_catalog()
    plan = plan_file(_s1(tmp_path, [CHUNKED, COLLECTIVE]), catalog=catalog)
    assert not plan.has_errors, plan.issues
    rows = {r["label"]: r for r in plan.rows(assemble().runtimes.runtimes)}
    assert rows["baseline"]["executable_by"] == ["vllm-hf"]
    assert rows[f"logp.backend={CHUNKED}"]["executable_by"] == ["vllm-hf"]
    assert rows[f"logp.backend={COLLECTIVE}"]["executable_by"] == []


@pytest.mark.slow
def test_run_refuses_it_before_any_engine_starts(tmp_path: Path) -> None:
    """The runner seals the case STRICT_REJECTED with the runtime's reason; the adapter is
    never asked for an engine."""
    pytest.importorskip("transformers")
    from pytest_logprob_drift.runtimes.vllm.adapter import VllmHfAdapter

    class NoEngines(VllmHfAdapter):
        def build_rollout(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("an engine was asked for")

        def build_training(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("an engine was asked for")

        def environment(self, identity: Any) -> Mapping[str, str]:
            return {"vllm": "not imported"}

    catalog = _collective_catalog()
    plan = plan_file(_s1(tmp_path, [COLLECTIVE]), catalog=catalog)
    label = f"logp.backend={COLLECTIVE}"
    (ec,) = [ec for ec in plan.cases if ec.case.label == label]
    with make_runner(
        plan, runtime="vllm-hf", artifacts=tmp_path / "runs", catalog=catalog, adapter=NoEngines()
    ) as runner:
        result = runner.run_case(ec)
    assert result.outcome is Outcome.STRICT_REJECTED
    assert "runtime 'vllm-hf' cannot inject" in result.reason
    assert "on the rollout side" in result.reason
    assert result.attempt_dir is not None
    assert not (result.attempt_dir / "score_rollout.pt").exists()


def test_a_v2_worker_is_held_to_the_v2_sites() -> None:
    from pytest_logprob_drift.runtimes.vllm.rollout_logp_v2 import SITES as V2_SITES

    v2 = {"runner": "v2", "model_runner": "GPUModelRunner", "sites": list(V2_SITES)}
    actual, evidence = _check([_worker(0, **v2)], [_worker(10, **v2)])
    assert actual == CHUNKED and "GPUModelRunner" in evidence
    # a V2 worker reporting V1's sites (or the reverse) did not patch what its runner calls
    actual, _ = _check([_worker(0, runner="v2")], [_worker(10, runner="v2")])
    assert actual.startswith(f"{CHUNKED} not applied: worker 0 patched "), actual
    actual, _ = _check([_worker(0, sites=list(V2_SITES))], [_worker(10, sites=list(V2_SITES))])
    assert actual.startswith(f"{CHUNKED} not applied: worker 0 patched "), actual
