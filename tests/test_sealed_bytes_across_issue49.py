"""Typed settings change no sealed byte: every shipped experiment's ``experiment.json``,
``plan.jsonl``, each case's ``requested.json`` and id, and its engines' fingerprints are
what the code before issue 49 wrote.

``tests/data/sealed_bytes_before_issue49.json`` was captured by ``snapshot`` below, run on the
commit before the typed settings (every ``experiments/*.json``, as planned and pairwise, plus
the planted weight-sync variants of the shipped weight-sync experiment). ``requested.json`` is
``execute.case.requested_document``, the one writer of it; its digest is compared, and its
bytes for the baseline, so that a failure shows what moved.

``tests/data/materialized_before_issue49.json`` is what each runtime stated it does with each
value of each knob (``materialized.json``'s records) before issue 49 turned the ``if`` chains
into a table per runtime (``materialized_statements`` below, run on that commit).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from drift_testing import make_runner

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.execute.case import requested_document
from pytest_logprob_drift.execute.protocol import bind_case
from pytest_logprob_drift.plan import knobs
from pytest_logprob_drift.plan.binding import ExecutionPlan
from pytest_logprob_drift.records import canonical_json, sha256_hex
from pytest_logprob_drift.store import layout

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted((ROOT / "experiments").glob("*.json"))
BEFORE = Path(__file__).with_name("data") / "sealed_bytes_before_issue49.json"
WEIGHT_SYNC = ROOT / "experiments" / "cross_config_s1_vllm_cpu_weight_sync.json"
PLANTED = ("drop_tied_embedding", "through_float16", "stale_tensor", "keep_prefix_cache")


def _planted_config(directory: Path) -> Path:
    document: dict[str, Any] = copy.deepcopy(json.loads(WEIGHT_SYNC.read_text()))
    document["pairs"] = []
    document["strategy"] = "one_at_a_time"
    document["interventions"] = [
        {"path": "rollout.weight_sync", "values": [f"planted:{name}" for name in PLANTED]}
    ]
    path = directory / "planted.json"
    path.write_text(json.dumps(document))
    return path


def snapshot(execution_plan: ExecutionPlan, artifacts: Path) -> dict[str, Any]:
    """What a run of ``execution_plan`` seals before any engine, per case: its id, the
    digest of its ``requested.json`` and its binding's fingerprints; and the run's
    ``experiment.json`` and ``plan.jsonl`` digests (written by a real ``Runner``). A plan
    with errors is its issues."""
    if execution_plan.has_errors:
        return {"issues": [issue.render() for issue in execution_plan.issues]}
    with make_runner(
        execution_plan, runtime="cpu-smoke", artifacts=artifacts, allow_smoke=True
    ) as r:
        directory = r.store.directory
        plan = execution_plan.plan
        cases: dict[str, Any] = {}
        baseline_requested = ""
        for runtime in ("cpu-smoke", "hf", "vllm-hf"):
            for ec in execution_plan.cases:
                binding = bind_case(
                    ec,
                    runtime_kind=runtime,
                    identity=plan.identity,
                    device=plan.scenario.device,
                    diagnostics=plan.diagnostics,
                )
                text = canonical_json(msgspec.to_builtins(requested_document(ec.case, binding)))
                if runtime == "vllm-hf" and ec.case.label == "baseline":
                    baseline_requested = text
                cases[f"{runtime} {ec.case.label}"] = {
                    "case_id": ec.case.case_id,
                    "requested": sha256_hex(text),
                    "fingerprints": [
                        binding.process_fingerprint,
                        binding.distributed_fingerprint,
                        binding.rollout_construction_fingerprint,
                        binding.training_construction_fingerprint,
                    ],
                }
        return {
            "experiment.json": sha256_hex((directory / layout.EXPERIMENT).read_text()),
            "plan.jsonl": sha256_hex((directory / layout.PLAN).read_text()),
            "baseline requested.json": baseline_requested,
            "cases": cases,
        }


def _plans(directory: Path) -> dict[str, ExecutionPlan]:
    plans = {}
    for path in EXPERIMENTS:
        plans[path.name] = plan_file(str(path))
        pairwise = plan_file(str(path), pairwise=True)
        if not pairwise.has_errors:  # pairwise needs listed pairs
            plans[f"{path.name} pairwise"] = pairwise
    plans["planted weight sync"] = plan_file(str(_planted_config(directory)))
    return plans


def capture(directory: Path) -> dict[str, Any]:
    return {
        name: snapshot(execution_plan, directory / f"run-{index}")
        for index, (name, execution_plan) in enumerate(sorted(_plans(directory).items()))
    }


ADDED_SINCE = ("cross_config_s1_vllm_cpu_moe_bf16.json",)
"""Experiments shipped after the capture (issue 54's MoE one): nothing sealed them before."""


def test_every_shipped_experiment_seals_the_bytes_it_sealed_before(tmp_path: Path) -> None:
    before = json.loads(BEFORE.read_text())
    now = capture(tmp_path)
    assert sorted(now) == sorted([*before, *ADDED_SINCE])
    for name in sorted(before):
        assert now[name]["baseline requested.json"] == before[name]["baseline requested.json"], name
        assert now[name] == before[name], name


@pytest.mark.parametrize("name", [p.name for p in EXPERIMENTS if p.name not in ADDED_SINCE])
def test_the_capture_covers_every_case(name: str) -> None:
    """The data holds every case of every shipped experiment (a new experiment needs a new
    capture, not a silent pass)."""
    before = json.loads(BEFORE.read_text())
    labels = {ec.case.label for ec in plan_file(str(ROOT / "experiments" / name)).cases}
    assert {key.split(" ", 1)[1] for key in before[name]["cases"]} == labels


MATERIALIZED_BEFORE = Path(__file__).with_name("data") / "materialized_before_issue49.json"
KNOB_VALUES: dict[str, list[Any]] = {
    "batch.size": [1, 4],
    "rollout.tensor_parallel_size": [1, 2],
    "rollout.context_parallel_size": [1, 2],
    "rollout.dtype": list(knobs.DTYPES),
    "training.compute_dtype": list(knobs.DTYPES),
    "rollout.enable_prefix_caching": [True, False],
    "rollout.enforce_eager": [True, False],
    "training.attention_backend": list(knobs.ATTENTION_BACKENDS),
    "logp.backend": ["native", "smoke_only.logp_offset"],
    "training.sharding": list(knobs.SHARDINGS),
    "rollout.logprobs_mode": list(knobs.LOGPROBS_MODES),
    "training.logprob_semantics": list(knobs.LOGPROB_SEMANTICS),
    "training.lm_head_dtype": list(knobs.LM_HEAD_DTYPES),
    "rollout.lm_head_dtype": list(knobs.LM_HEAD_DTYPES),
    "rollout.weight_sync": [
        *knobs.WEIGHT_SYNCS,
        "planted:stale_tensor",
        "planted:keep_prefix_cache",
    ],
}


KNOBS_ADDED_SINCE = frozenset(
    {"training.moe_routing", "training.router_dtype", "rollout.expert_parallel"}
)
"""Knobs added after the capture (issue 55's MoE router knobs: their statements are tested in
``tests/test_moe_router_knob_plan.py``)."""


def materialized_statements() -> dict[str, list[Any]]:
    from pytest_logprob_drift.runtimes.smoke.runtime import CpuSmokeAdapter
    from pytest_logprob_drift.runtimes.transformers.adapter import HfAdapter
    from pytest_logprob_drift.runtimes.vllm.adapter import VllmHfAdapter

    statements = {}
    for adapter in (HfAdapter(), VllmHfAdapter(), CpuSmokeAdapter()):
        for path, values in KNOB_VALUES.items():
            for value in values:
                m = adapter.materialize({path: value})[path]
                statements[f"{adapter.name} {path}={value!r}"] = [
                    m.value,
                    m.status.value,
                    m.evidence,
                ]
    return statements


@pytest.mark.slow
def test_each_runtime_states_each_knob_as_it_did_before() -> None:
    """The tables say, value for value, what the ``if`` chains said (on this machine's vLLM
    platform, which the tensor and context parallel rows depend on)."""
    pytest.importorskip("vllm")
    from pytest_logprob_drift.runtimes.vllm.adapter import vllm_platform_is_cpu

    if not vllm_platform_is_cpu():
        pytest.skip("captured on vLLM's CPU platform (its TP and CP rows name the platform)")
    assert set(KNOB_VALUES) == set(knobs.KNOBS) - KNOBS_ADDED_SINCE
    assert materialized_statements() == json.loads(MATERIALIZED_BEFORE.read_text())
