"""No accepted-and-ignored value: every closed value the config schema accepts either changes
what a runtime does or is refused (at planning, or by strict execution as STRICT_REJECTED /
PLAN_ONLY).

Each value is run on the synthetic cpu-smoke runtime, in process, against the same baseline;
the evidence compared is the sealed attempt (tensors, records, outcome). The real runtimes'
own knob applications are tested in ``tests/runtimes`` (slow).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import S0, FaultyCpuSmokeAdapter, make_runner

from pytest_logprob_drift import ConfigError, plan_file
from pytest_logprob_drift.execute.runner import CaseResult
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.plan.knobs import ATTENTION_BACKENDS, DTYPES, SHARDINGS
from pytest_logprob_drift.records import (
    MaskPolicy,
    PackingPolicy,
    PositionPolicy,
    ScenarioLevel,
    Strategy,
)
from pytest_logprob_drift.runtimes.smoke.runtime import EOS_ID, CpuSmokeAdapter


def baseline_document() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(S0.read_text())
    document["baseline"]["logp"]["backend"] = "native"
    document["interventions"] = []
    document["identity"]["sampling"]["max_new_tokens"] = 40  # long enough to reach EOS
    return document


def run_one(
    work: Path,
    edit: Callable[[dict[str, Any]], None],
    name: str,
    adapter: CpuSmokeAdapter | None = None,
) -> CaseResult | str:
    """The baseline case's result, or the planning refusal as text."""
    document = baseline_document()
    edit(document)
    config = work / f"{name}.json"
    config.write_text(json.dumps(document))
    try:
        plan = plan_file(str(config))
    except ConfigError as exc:
        return f"refused: {exc.render()}"
    errors = [i for i in plan.issues if i.severity.value == "error"]
    if errors:
        return f"refused: {errors[0].render()}"
    with make_runner(
        plan, runtime="cpu-smoke", artifacts=work / name, adapter=adapter or CpuSmokeAdapter()
    ) as runner:
        return runner.run()[0]


def sealed(result: CaseResult, name: str) -> dict[str, torch.Tensor]:
    assert result.attempt_dir is not None
    loaded: dict[str, torch.Tensor] = torch.load(result.attempt_dir / name, weights_only=True)
    return loaded


def set_path(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(document: dict[str, Any]) -> None:
        node = document
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return edit


@pytest.fixture(scope="module")
def default(tmp_path_factory: pytest.TempPathFactory) -> CaseResult:
    result = run_one(tmp_path_factory.mktemp("default"), lambda d: None, "default")
    assert isinstance(result, CaseResult) and result.outcome is Outcome.PASS
    return result


def test_mask_policy_values(work: Path, default: CaseResult) -> None:
    assert {m.value for m in MaskPolicy} == {"response_through_eos", "response_before_eos"}
    through = sealed(default, "score_rollout.pt")
    prompt_lengths = through["prompt_lengths"]
    ended = [
        i for i in range(len(prompt_lengths)) if int(through["active_mask"][i].sum()) < 40
    ]  # stopped at EOS, not at the limit
    assert ended, "no sample reached EOS: the test would prove nothing"
    before = run_one(work, set_path("identity.mask_policy", "response_before_eos"), "before")
    assert isinstance(before, CaseResult) and before.outcome is Outcome.PASS
    rollout = sealed(before, "score_rollout.pt")
    assert torch.equal(rollout["token_ids"], through["token_ids"])  # same samples
    for i in ended:
        last = int(through["active_mask"][i].nonzero().max())
        assert int(through["token_ids"][i, last]) == EOS_ID
        assert bool(through["active_mask"][i, last])  # through EOS: scored
        assert not bool(rollout["active_mask"][i, last])  # before EOS: in the input, unscored
        assert bool(rollout["attention_mask"][i, last])
    assert int(rollout["active_mask"].sum()) == int(through["active_mask"].sum()) - len(ended)


def test_single_valued_policies_are_what_the_runtimes_do(default: CaseResult) -> None:
    # Packing and positions have exactly one value: the padded layout with positions from the
    # attention mask, which every runtime builds (runtimes.batch) and reports as its identity.
    assert [p.value for p in PackingPolicy] == ["padded"]
    assert [p.value for p in PositionPolicy] == ["from_attention_mask"]
    rollout = sealed(default, "score_rollout.pt")
    expected = (rollout["attention_mask"].long().cumsum(-1) - 1).clamp(min=0) * rollout[
        "attention_mask"
    ]
    assert torch.equal(rollout["position_ids"], expected)


def test_training_kv_cache_changes_what_the_guard_allows(work: Path) -> None:
    forbidden = run_one(work, lambda d: None, "forbidden", FaultyCpuSmokeAdapter("use_kv_cache"))
    allowed = run_one(
        work,
        set_path("identity.training_kv_cache", True),
        "allowed",
        FaultyCpuSmokeAdapter("use_kv_cache"),
    )
    assert isinstance(forbidden, CaseResult) and isinstance(allowed, CaseResult)
    assert forbidden.outcome is Outcome.INVALID_IDENTITY
    assert allowed.outcome is Outcome.PASS


def test_strategy_values(work: Path) -> None:
    assert {s.value for s in Strategy} == {"one_at_a_time", "pairwise"}
    document = baseline_document()
    document["interventions"] = [
        {"path": "batch.size", "values": [1]},
        {"path": "rollout.dtype", "values": ["bfloat16"]},
    ]
    document["pairs"] = [["batch.size", "rollout.dtype"]]
    counts = {}
    for strategy in Strategy:
        document["strategy"] = strategy.value
        config = work / f"{strategy.value}.json"
        config.write_text(json.dumps(document))
        counts[strategy] = len(plan_file(str(config)).cases)
    assert counts == {Strategy.ONE_AT_A_TIME: 3, Strategy.PAIRWISE: 4}


@pytest.mark.parametrize("level", [level.value for level in ScenarioLevel])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_scenario_values_execute_or_are_plan_only(work: Path, level: str, device: str) -> None:
    result = run_one(
        work, set_path("scenario", {"level": level, "device": device}), f"{level}-{device}"
    )
    if isinstance(result, str):  # e.g. no backend for that device
        assert result.startswith("refused: ")
        return
    if (level, device) == ("S0", "cpu"):
        assert result.outcome is Outcome.PASS
    else:
        assert result.outcome is Outcome.PLAN_ONLY and result.attempt_dir is None


KNOB_VALUES: list[tuple[str, object]] = [
    *[("rollout.dtype", v) for v in DTYPES],
    *[("training.compute_dtype", v) for v in DTYPES],
    *[("training.attention_backend", v) for v in ATTENTION_BACKENDS],
    *[("training.sharding", v) for v in SHARDINGS],
    *[("rollout.enable_prefix_caching", v) for v in (False, True)],
    *[("rollout.enforce_eager", v) for v in (False, True)],
    *[("rollout.tensor_parallel_size", v) for v in (1, 2)],
    *[("rollout.context_parallel_size", v) for v in (1, 2)],
]


@pytest.mark.parametrize(("knob", "value"), KNOB_VALUES, ids=lambda v: str(v))
def test_every_knob_value_is_applied_or_refused(
    work: Path, default: CaseResult, knob: str, value: object
) -> None:
    section, key = knob.split(".")

    def edit(document: dict[str, Any]) -> None:
        document["baseline"].setdefault(section, {})[key] = value

    result = run_one(work, edit, "knob")
    if isinstance(result, str):
        assert result.startswith("refused: ")
        return
    record = next(r for r in result.comparison.records if r.knob == knob).to_json()
    if result.outcome is Outcome.STRICT_REJECTED:
        assert record["status"] != "applied" and knob in result.reason
        return
    assert record["status"] == "applied" and record["actual"] == value
    changed_scores = not torch.equal(
        sealed(result, "score_rollout.pt")["logprobs"],
        sealed(default, "score_rollout.pt")["logprobs"],
    ) or not torch.equal(
        sealed(result, "score_training.pt")["logprobs"],
        sealed(default, "score_training.pt")["logprobs"],
    )
    inherent = copy.deepcopy(baseline_document())["baseline"]
    is_default = inherent.get(section, {}).get(key) == value or (knob, value) in CPU_SMOKE_INHERENT
    assert changed_scores or is_default, f"{knob}={value!r} was accepted and changed nothing"


CPU_SMOKE_INHERENT = {
    ("rollout.tensor_parallel_size", 1),
    ("rollout.context_parallel_size", 1),
    ("rollout.enable_prefix_caching", False),
    ("rollout.enforce_eager", True),
    ("training.sharding", "none"),
}
"""The single value the synthetic runtime inherently has for knobs it cannot change: applied
because that is what it does, identical to the default by construction."""
