"""Contract sources: ``bitwise`` (threshold 0) beside ``ws1``, resolved, hashed and planned; the
verdict at threshold 0 (equality passes, one ulp is a mismatch of exactly that token); the
loader's refusals; a real smoke run judged bitwise, and one whose trainer computes exactly as the
rollout does, which passes."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import S0, cli, run_by_label

from pytest_logprob_drift import load_config, plan_experiment, plan_file
from pytest_logprob_drift.config import contract as contract_module
from pytest_logprob_drift.config.contract import resolve_contract
from pytest_logprob_drift.errors import ConfigError
from pytest_logprob_drift.execute.protocol import RuntimeBinding
from pytest_logprob_drift.numerics.importance_sampling import importance_sampling
from pytest_logprob_drift.numerics.verdict import judge
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.records import ScoringIdentity, canonical_json, sha256_hex
from pytest_logprob_drift.runtimes.smoke.runtime import (
    HIDDEN,
    VOCAB,
    CpuSmokeAdapter,
    StatelessScorer,
)
from pytest_logprob_drift.store.layout import TOKEN_DIFFS

CONTRACT_FILE = Path(contract_module.__file__).with_name(contract_module.CONTRACT_FILE)


def shipped() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(CONTRACT_FILE.read_text(encoding="utf-8"))
    return document


def test_bitwise_resolves_to_threshold_zero_and_is_hashed() -> None:
    bitwise = resolve_contract("bitwise", "current")
    ws1 = resolve_contract("ws1", "current")
    assert bitwise.threshold == 0.0
    assert bitwise.source == "bitwise"
    assert bitwise.version == shipped()["sources"]["bitwise"]["current"] != "current"
    body = shipped()["sources"]["bitwise"]["versions"][bitwise.version]
    assert bitwise.digest == sha256_hex(
        canonical_json({"source": "bitwise", "version": bitwise.version, **body})
    )
    assert bitwise.digest != ws1.digest
    assert resolve_contract("bitwise", bitwise.version) == bitwise


def test_bitwise_rationale_says_what_it_certifies_and_what_not() -> None:
    version = resolve_contract("bitwise", "current").version
    body = shipped()["sources"]["bitwise"]["versions"][version]
    rationale = body["rationale"]
    assert "on-policy" in rationale and "bitwise-identical" in rationale
    for limit in ("sampled distribution", "NaN", "inactive tokens"):
        assert limit in rationale
    assert "equal to the threshold is not a mismatch" in body["comparison"]


def with_threshold(value: float) -> dict[str, Any]:
    document = shipped()
    version = document["sources"]["bitwise"]["current"]
    document["sources"]["bitwise"]["versions"][version]["threshold"] = value
    return document


@pytest.mark.parametrize("value", [-1e-12, -1.0, math.nan, math.inf, -math.inf])
def test_a_negative_or_non_finite_threshold_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: float
) -> None:
    monkeypatch.setattr(contract_module, "_load_document", lambda: with_threshold(value))
    with pytest.raises(ConfigError) as raised:
        resolve_contract("bitwise", "current")
    assert raised.value.path.endswith(".threshold")
    assert "non-negative finite float" in raised.value.message


def test_an_integer_zero_threshold_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The file says 0.0: a JSON integer is not the float the contract promises."""
    monkeypatch.setattr(contract_module, "_load_document", lambda: with_threshold(0))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="non-negative finite float"):
        resolve_contract("bitwise", "current")


def test_the_unknown_source_error_lists_bitwise() -> None:
    with pytest.raises(ConfigError, match="known: bitwise, ws1"):
        resolve_contract("nope", "current")


def s0_document(source: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(S0.read_text())
    document["contract_source"] = source
    return document


def test_a_bitwise_config_plans_with_its_own_case_ids(tmp_path: Path) -> None:
    plans = {}
    for source in ("ws1", "bitwise"):
        path = tmp_path / f"{source}.json"
        path.write_text(json.dumps(s0_document(source)))
        plans[source] = plan_experiment(load_config(path))
        assert not plans[source].has_errors
    assert plans["bitwise"].contract.threshold == 0.0
    ws1 = {c.label: c.case_id for c in plans["ws1"].cases}
    bitwise = {c.label: c.case_id for c in plans["bitwise"].cases}
    assert ws1.keys() == bitwise.keys()
    # the contract (source and concrete version) is part of the case id
    assert all(ws1[label] != bitwise[label] for label in ws1)


# ------------------------------------------------------------------ the verdict at threshold 0


def scores() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    rollout = -torch.rand(3, 9, generator=generator) * 5
    active = torch.ones(3, 9, dtype=torch.bool)
    active[:, :2] = False
    return rollout, rollout.clone(), active


def test_bitwise_equal_sides_pass() -> None:
    training, rollout, active = scores()
    verdict = judge(training, rollout, active, 0.0)
    assert verdict.outcome is Outcome.PASS
    assert verdict.mismatches == 0
    assert verdict.diagnostics["max_abs_diff"] == 0.0


def test_one_ulp_on_one_token_is_a_mismatch_of_exactly_that_token() -> None:
    training, rollout, active = scores()
    training[1, 5] = torch.nextafter(training[1, 5], torch.tensor(0.0))
    verdict = judge(training, rollout, active, 0.0)
    assert verdict.outcome is Outcome.MISMATCH
    assert verdict.mismatches == 1
    worst = verdict.worst_tokens[0]
    assert (worst["sample"], worst["position"]) == (1, 5)
    assert worst["abs_diff"] > 0.0
    # the same ulp is far inside ws1's threshold
    ws1 = resolve_contract("ws1", "current").threshold
    assert judge(training, rollout, active, ws1).outcome is Outcome.PASS


def test_a_difference_on_an_inactive_token_is_not_compared() -> None:
    training, rollout, active = scores()
    training[0, 0] = torch.nextafter(training[0, 0], torch.tensor(0.0))
    assert judge(training, rollout, active, 0.0).outcome is Outcome.PASS


# ------------------------------------------------------------------- a real run, bitwise


def test_the_smoke_experiment_judged_bitwise(tmp_path: Path) -> None:
    """What ``bitwise`` reports on S0: none of its cases is true on-policy. The smoke rollout
    decodes incrementally (a running prefix sum) while the trainer teacher-forces the whole
    sequence, so most tokens differ by float32 rounding (under 1e-6 nats: ws1 passes them);
    the offset backend differs on every token."""
    config = tmp_path / "s0_bitwise.json"
    config.write_text(json.dumps(s0_document("bitwise")))
    code, out, err = cli(
        "run",
        config,
        "--runtime",
        "cpu-smoke",
        "--allow-smoke-operators",
        "--artifacts",
        tmp_path / "runs",
        "--json",
    )
    assert code == 1, err  # mismatches are failures
    cases = {c["label"]: c for c in json.loads(out)["results"]}
    for label in ("baseline", "batch.size=1"):
        case = cases[label]
        assert case["outcome"] == "MISMATCH"
        assert 0 < case["mismatches"] < case["active_tokens"]
        assert case["max_abs_diff"] < 1e-6
    offset = cases["logp.backend=smoke_only.logp_offset"]
    assert offset["outcome"] == "MISMATCH"
    assert offset["mismatches"] == offset["active_tokens"]
    # the planted case: the offset backend shifts training by a constant c on every token
    diffs = torch.load(Path(offset["attempt_dir"]) / TOKEN_DIFFS, weights_only=True)
    training, rollout, active = (
        diffs["training_logprobs"],
        diffs["rollout_logprobs"],
        diffs["active_mask"],
    )
    figures = importance_sampling(training, rollout, active)
    sealed_r = (training.to(torch.float64) - rollout.to(torch.float64))[active]
    assert figures.weight_min == math.exp(float(sealed_r.min()))
    assert figures.weight_max == math.exp(float(sealed_r.max()))
    c = float(sealed_r.mean())
    assert c == pytest.approx(-0.008, rel=1e-3)  # below every log(cap): nothing clipped
    assert all(
        figures.corrections[f"tis_clipped_token_fraction_cap_{cap}"] == 0.0 for cap in (2, 3, 5)
    )


def test_bitwise_and_ws1_share_the_comparison_rule() -> None:
    documents = shipped()["sources"]
    rules = {
        name: body["comparison"].split(":")[0]
        for name, entry in documents.items()
        for body in [entry["versions"][entry["current"]]]
    }
    assert rules == {"ws1": "strict greater-than", "bitwise": "strict greater-than"}
    assert copy.deepcopy(documents) == documents


class DecodingScorer(StatelessScorer):
    """The smoke scorer computing every position's logits the way the smoke rollout does (its
    incremental ``step``, one position at a time), so both sides compute identically."""

    def forward(
        self, params: Mapping[str, torch.Tensor], token_ids: torch.Tensor, attention: torch.Tensor
    ) -> torch.Tensor:
        rows = []
        for ids, mask in zip(token_ids, attention, strict=True):
            running = torch.zeros(HIDDEN, dtype=self.model.embed.dtype)
            positions = []
            for position, (token, kept) in enumerate(zip(ids, mask, strict=True)):
                logits = torch.zeros(VOCAB, dtype=self.model.embed.dtype)
                if kept:
                    logits, running = self.model.step(
                        token, running, torch.tensor(float(position + 1))
                    )
                positions.append(logits)
            rows.append(torch.stack(positions))
        return torch.stack(rows)


class DecodingAdapter(CpuSmokeAdapter):
    def build_training(self, binding: RuntimeBinding, identity: ScoringIdentity) -> StatelessScorer:
        self._check_identity(identity)
        return DecodingScorer(binding)

    def environment(self, identity: ScoringIdentity) -> Mapping[str, Any]:
        return {**super().environment(identity), "scorer": "incremental decode"}


def test_sides_that_compute_identically_pass_bitwise(tmp_path: Path) -> None:
    config = tmp_path / "s0_bitwise.json"
    config.write_text(json.dumps(s0_document("bitwise")))
    results = run_by_label(
        plan_file(str(config)),
        runtime="cpu-smoke",
        artifacts=tmp_path / "runs",
        allow_smoke=True,
        adapter=DecodingAdapter(),
    )
    for label in ("baseline", "batch.size=1"):
        assert results[label].outcome is Outcome.PASS, results[label].reason
    assert "within 0" in results["baseline"].reason
    # the offset backend still differs on every token
    assert results["logp.backend=smoke_only.logp_offset"].outcome is Outcome.MISMATCH
