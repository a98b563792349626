"""Sampling semantics in the identity and as knobs (issue 13), without real engines.

``identity.sampling`` gains ``top_p`` / ``top_k`` / ``min_p`` (left out of the canonical
identity when absent, so configs without them keep their case ids: every shipped experiment's
ids are pinned from before the change); three knobs with their lifecycles, aliases and strict
materialization; the contract's minor version; a side that does not apply the identity's
truncation makes the case INVALID_IDENTITY; the transformers sides' truncation is vLLM's.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import EXPERIMENTS, ROOT, S0, make_runner, run_by_label

from pytest_logprob_drift import ConfigError, parse_config, plan_file
from pytest_logprob_drift.config.contract import resolve_contract
from pytest_logprob_drift.numerics.sampling import Truncation, processed_logits
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.records import ApplicationStatus
from pytest_logprob_drift.runtimes.smoke.runtime import CpuSmokeAdapter

PINNED = json.loads((ROOT / "tests" / "data" / "case_ids_before_issue13.json").read_text())


@pytest.mark.parametrize("name", sorted(PINNED))
def test_shipped_experiments_keep_their_case_ids(name: str) -> None:
    plan = plan_file(str(EXPERIMENTS / name))
    assert {ec.case.label: ec.case.case_id for ec in plan.cases} == PINNED[name]


def s0(work: Path, edit: Any) -> str:
    document: dict[str, Any] = copy.deepcopy(json.loads(S0.read_text()))
    edit(document)
    path = work / "config.json"
    path.write_text(json.dumps(document))
    return str(path)


def test_truncation_is_identity_only_when_given(work: Path) -> None:
    plain = plan_file(str(S0))
    assert "top_p" not in plain.plan.identity.canonical_identity()["sampling"]

    def top_p(d: dict[str, Any]) -> None:
        d["identity"]["sampling"].update({"top_p": 0.9, "top_k": 50, "min_p": 0.05})

    truncated = plan_file(s0(work, top_p))
    sampling = truncated.plan.identity.sampling
    assert (sampling.top_p, sampling.top_k, sampling.min_p) == (0.9, 50, 0.05)
    assert truncated.plan.identity.canonical_identity()["sampling"]["top_k"] == 50
    plain_ids = {c.case.label: c.case.case_id for c in plain.cases}
    assert all(plain_ids[c.case.label] != c.case.case_id for c in truncated.cases)


@pytest.mark.parametrize(
    ("key", "value"),
    [("top_p", 1.0), ("top_p", 0), ("top_p", "0.9"), ("top_k", 0), ("top_k", 1.5), ("min_p", 0.0)],
)
def test_bad_truncation_values_name_their_path(key: str, value: Any) -> None:
    document = json.loads(S0.read_text())
    document["identity"]["sampling"][key] = value
    with pytest.raises(ConfigError) as info:
        parse_config(document)
    assert f"$.identity.sampling.{key}" in str(info.value)


def test_new_knobs_normalize_aliases(work: Path) -> None:
    def knobs(d: dict[str, Any]) -> None:
        d["baseline"]["rollout"]["logprob_mode"] = "raw"
        d["baseline"]["training"]["semantics"] = "RAW"
        d["baseline"]["training"]["cast_lm_head_to_fp32"] = "fp32"
        d["interventions"] = [{"path": "rollout.logprobs_mode", "values": ["processed"]}]

    plan = plan_file(s0(work, knobs))
    baseline = dict(plan.cases[0].case.requested)
    assert baseline["rollout.logprobs_mode"] == "raw_logprobs"
    assert baseline["training.logprob_semantics"] == "raw"
    assert baseline["training.lm_head_dtype"] == "float32"
    assert plan.cases[1].case.label == "rollout.logprobs_mode=processed_logprobs"


def test_contract_minor_version_is_recorded() -> None:
    contract = resolve_contract("ws1", "current")
    assert contract.minor_version == 1
    assert contract.version == "ws1.2026-11.v1"  # the version case ids hash is unchanged


def test_hf_materialization_of_the_new_knobs() -> None:
    pytest.importorskip("transformers")
    from pytest_logprob_drift.runtimes.transformers.adapter import HfAdapter

    requested = {
        "rollout.logprobs_mode": "processed_logprobs",
        "training.logprob_semantics": "processed",
        "training.lm_head_dtype": "float32",
        "training.sharding": "none",
    }
    materialized = HfAdapter().materialize(requested)
    assert {m.status for m in materialized.values()} == {ApplicationStatus.APPLIED}
    # The FSDP rank processes implement both, like the in-process trainer.
    sharded = HfAdapter().materialize({**requested, "training.sharding": "fsdp"})
    assert {m.status for m in sharded.values()} == {ApplicationStatus.APPLIED}


def test_smoke_runtime_refuses_what_it_cannot_apply(work: Path) -> None:
    def processed(d: dict[str, Any]) -> None:
        d["baseline"]["rollout"]["logprobs_mode"] = "raw_logprobs"
        d["interventions"] = [{"path": "rollout.logprobs_mode", "values": ["processed_logprobs"]}]

    results = run_by_label(
        plan_file(s0(work, processed)),
        runtime="cpu-smoke",
        artifacts=work / "runs",
        allow_smoke=True,
        adapter=CpuSmokeAdapter(),
    )
    assert results["baseline"].outcome is Outcome.PASS
    rejected = results["rollout.logprobs_mode=processed_logprobs"]
    assert rejected.outcome is Outcome.STRICT_REJECTED
    assert "rollout.logprobs_mode='processed_logprobs': unsupported" in rejected.reason


def test_a_side_that_ignores_the_truncation_is_invalid_identity(work: Path) -> None:
    """The smoke sampler has no top_p: it cannot claim the identity's truncation."""

    def top_p(d: dict[str, Any]) -> None:
        d["identity"]["sampling"]["top_p"] = 0.9
        d["interventions"] = []

    runner = make_runner(
        plan_file(s0(work, top_p)),
        runtime="cpu-smoke",
        artifacts=work / "runs",
        allow_smoke=True,
        adapter=CpuSmokeAdapter(),
    )
    with runner:
        (result,) = runner.run()
    assert result.outcome is Outcome.INVALID_IDENTITY
    assert "sampling_top_p: rollout used None, identity requires 0.9" in result.reason


@pytest.mark.slow
def test_truncation_matches_vllm_cpu_sampler() -> None:
    """The transformers sides' processed logits are bit-identical to vLLM 0.32's CPU
    top-k/top-p (temperature first, ties and the float32 1 - p included)."""
    pytest.importorskip("vllm")
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        logits = torch.randn(6, 300, generator=g) * 3
        logits[:, :20] = logits[:, :1]  # ties at the boundary
        temperature = float(torch.rand(1, generator=g)) + 0.3
        top_p = float(torch.rand(1, generator=g)) * 0.9 + 0.05
        top_k = int(torch.randint(1, 320, (1,), generator=g))
        for k, p in ((top_k, top_p), (None, top_p), (top_k, None)):
            mine = processed_logits(logits, Truncation(temperature=temperature, top_p=p, top_k=k))
            scaled = logits.clone().div_(torch.full((6, 1), temperature))
            theirs = apply_top_k_top_p_pytorch(
                scaled,
                None if k is None or k >= 300 else torch.full((6,), k, dtype=torch.int32),
                None if p is None else torch.full((6,), p, dtype=torch.float32),
                allow_cpu_sync=True,
            )
            assert torch.equal(mine, theirs)


def test_min_p_and_greedy() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -3.0]])
    kept = processed_logits(logits, Truncation(temperature=1.0, min_p=0.3))
    probs = torch.softmax(logits, -1)
    assert torch.equal(torch.isfinite(kept), probs >= 0.3 * probs.max())
    greedy = processed_logits(logits, Truncation(temperature=0.0, top_p=0.5))
    assert torch.equal(greedy, logits)  # vLLM reports raw log-softmax when greedy
