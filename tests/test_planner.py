"""Planner: stable case ids (property tests), OAT/pairwise shape, the case cap, issues, labels."""

from __future__ import annotations

import copy
import hashlib
import json
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_logprob_drift import load_config, parse_config, plan_experiment
from pytest_logprob_drift.config import contract as contract_module
from pytest_logprob_drift.plan import planner as planner_module
from pytest_logprob_drift.plan.knobs import (
    ATTENTION_BACKENDS,
    DTYPES,
    KNOBS,
    LM_HEAD_DTYPES,
    LOGPROB_SEMANTICS,
    LOGPROBS_MODES,
    MOE_ROUTINGS,
    ROUTER_DTYPES,
    SHARDINGS,
    WEIGHT_SYNCS,
)
from pytest_logprob_drift.plan.planner import CASE_CAP, case_id, case_label
from pytest_logprob_drift.records import (
    CaseKind,
    ExperimentPlan,
    IssueSeverity,
    Lifecycle,
    Strategy,
)

SETTINGS = settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

BACKENDS = ("native", "rlkernel.reference_logp", "rlkernel.chunked_logp")


def make_config(*, attention: str = "sdpa", device: str = "cuda") -> dict[str, Any]:
    """A config with every knob in the baseline and an intervention on most of them."""
    return {
        "schema_version": "cross_config.experiment_config.v1",
        "experiment_id": "planner-test",
        "scenario_id": "planner-test-scenario",
        "contract_source": "ws1",
        "contract_version": "current",
        "strategy": "one_at_a_time",
        "strict_fallback": True,
        "identity": {
            "checkpoint": {"uri": "/models/tiny", "model_version": "tiny-v1", "digest": None},
            "tokenizer": {"id": "tiny-tok", "add_special_tokens": False, "chat_template": None},
            "prompts": {"token_ids": [[1, 2, 3], [4, 5]]},
            "sampling": {"seed": 0, "max_new_tokens": 8, "temperature": 1.0},
            "mask_policy": "response_through_eos",
            "training_kv_cache": False,
            "packing": "padded",
            "positions": "from_attention_mask",
        },
        "baseline": {
            "batch": {"size": 8},
            "rollout": {
                "tensor_parallel_size": 4,
                "context_parallel_size": 2,
                "dtype": "bfloat16",
                "enable_prefix_caching": True,
                "enforce_eager": False,
                "logprobs_mode": "raw_logprobs",
                "lm_head_dtype": "compute",
                "weight_sync": "checkpoint",
                "expert_parallel": False,
            },
            "training": {
                "attention_backend": attention,
                "compute_dtype": "bfloat16",
                "sharding": "fsdp",
                "logprob_semantics": "raw",
                "lm_head_dtype": "compute",
                "moe_routing": "natural",
                "router_dtype": "model",
            },
            "logp": {"backend": "native"},
        },
        "interventions": [
            {"path": "batch.size", "values": [1, 2]},
            {"path": "rollout.tensor_parallel_size", "values": [1, 2]},
            {"path": "rollout.dtype", "values": ["float32"]},
            {"path": "rollout.enable_prefix_caching", "values": [False]},
            {"path": "rollout.enforce_eager", "values": [True]},
            {"path": "training.attention_backend", "values": ["eager"]},
            {"path": "training.compute_dtype", "values": ["float32"]},
            {"path": "training.sharding", "values": ["none"]},
            {"path": "logp.backend", "values": ["rlkernel.reference_logp"]},
        ],
        "scenario": {"level": "S2", "device": device},
    }


def plan_of(doc: dict[str, Any], *, pairwise: bool = False) -> ExperimentPlan:
    return plan_experiment(parse_config(doc), pairwise=pairwise)


def ok_plan(doc: dict[str, Any], *, pairwise: bool = False) -> ExperimentPlan:
    plan = plan_of(doc, pairwise=pairwise)
    assert not plan.has_errors, [i.render() for i in plan.issues]
    return plan


def ids_by_label(plan: ExperimentPlan) -> dict[str, str]:
    return {c.label: c.case_id for c in plan.cases}


def codes(plan: ExperimentPlan) -> list[tuple[str, str]]:
    return [(i.code, i.path) for i in plan.issues]


def shuffled(value: Any, rng: random.Random) -> Any:
    """The same JSON value with the insertion order of every object shuffled."""
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {k: shuffled(value[k], rng) for k in keys}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


REFERENCE = ok_plan(make_config())
REFERENCE_IDS = ids_by_label(REFERENCE)


# ----------------------------------------------------------------------------- basic shape


def test_reference_plan_shape() -> None:
    cases = REFERENCE.cases
    assert cases[0].label == "baseline" and cases[0].kind is CaseKind.BASELINE
    assert cases[0].changed == () and cases[0].lifecycle is None
    assert len(cases) == 1 + 11
    assert len({c.case_id for c in cases}) == len(cases)
    assert all(len(c.case_id) == 16 and int(c.case_id, 16) >= 0 for c in cases)
    assert REFERENCE.strategy is Strategy.ONE_AT_A_TIME
    assert REFERENCE.issues == ()


def test_knob_allowlist_is_exactly_the_contracts() -> None:
    assert {path: spec.knob.lifecycle for path, spec in KNOBS.items()} == {
        "batch.size": Lifecycle.REQUEST,
        "rollout.tensor_parallel_size": Lifecycle.PROCESS,
        "rollout.context_parallel_size": Lifecycle.PROCESS,
        "rollout.dtype": Lifecycle.ENGINE_CONSTRUCTION,
        "rollout.enable_prefix_caching": Lifecycle.ENGINE_CONSTRUCTION,
        "rollout.enforce_eager": Lifecycle.ENGINE_CONSTRUCTION,
        "training.attention_backend": Lifecycle.ENGINE_CONSTRUCTION,
        "training.compute_dtype": Lifecycle.ENGINE_CONSTRUCTION,
        "logp.backend": Lifecycle.ENGINE_CONSTRUCTION,
        "training.sharding": Lifecycle.PROCESS,
        # Issue 13: sampling semantics, beyond the contract's ten.
        "rollout.logprobs_mode": Lifecycle.ENGINE_CONSTRUCTION,
        "training.logprob_semantics": Lifecycle.ENGINE_CONSTRUCTION,
        "training.lm_head_dtype": Lifecycle.ENGINE_CONSTRUCTION,
        "rollout.lm_head_dtype": Lifecycle.ENGINE_CONSTRUCTION,
        # How the rollout gets its weights (docs/WEIGHT_SYNC.md).
        "rollout.weight_sync": Lifecycle.ENGINE_CONSTRUCTION,
        # Issue 55: mixture-of-experts knobs (docs/MOE.md).
        "rollout.expert_parallel": Lifecycle.PROCESS,
        "training.moe_routing": Lifecycle.REQUEST,
        "training.router_dtype": Lifecycle.REQUEST,
    }


def test_planning_is_deterministic() -> None:
    assert ok_plan(make_config()) == REFERENCE


# ----------------------------------------------------------------------------- invariance


@SETTINGS
@given(st.randoms(use_true_random=False))
def test_case_ids_ignore_key_order(rng: random.Random) -> None:
    plan = ok_plan(shuffled(make_config(), rng))
    assert ids_by_label(plan) == REFERENCE_IDS
    assert [c.label for c in plan.cases] == [c.label for c in REFERENCE.cases]


@SETTINGS
@given(st.randoms(use_true_random=False))
def test_case_ids_ignore_intervention_order(rng: random.Random) -> None:
    doc = make_config()
    rng.shuffle(doc["interventions"])
    assert ids_by_label(ok_plan(doc)) == REFERENCE_IDS


def _spelled(draw: Callable[[st.SearchStrategy[Any]], Any], options: list[Any]) -> Any:
    return draw(st.sampled_from(options))


@st.composite
def alias_spellings(draw: Callable[[st.SearchStrategy[Any]], Any]) -> dict[str, Any]:
    bf16 = ["bfloat16", "bf16", "BF16", "torch.bfloat16", " bf16 ", "BFloat16"]
    fp32 = ["float32", "fp32", "f32", "float", "torch.float32", "FP32"]
    true = [True, "true", "True", "TRUE", "on", "yes"]
    false = [False, "false", "False", "off", "no"]
    fa2 = ["flash_attention_2", "fa2", "FA2", "flash_attn_2", "flash-attention-2"]
    doc = make_config(attention="flash_attention_2")
    rollout: dict[str, Any] = {}
    rollout[_spelled(draw, ["tensor_parallel_size", "tp", "tp_size", "tensor_parallel"])] = 4
    rollout[_spelled(draw, ["context_parallel_size", "cp", "cp_size"])] = 2
    rollout["dtype"] = _spelled(draw, bf16)
    rollout[_spelled(draw, ["enable_prefix_caching", "prefix_caching"])] = _spelled(draw, true)
    rollout[_spelled(draw, ["enforce_eager", "eager"])] = _spelled(draw, false)
    rollout[_spelled(draw, ["logprobs_mode", "logprob_mode"])] = _spelled(
        draw, ["raw_logprobs", "raw", "RAW"]
    )
    rollout[_spelled(draw, ["lm_head_dtype", "cast_lm_head_to_fp32"])] = _spelled(
        draw, ["compute", "compute_dtype", "model"]
    )
    rollout[_spelled(draw, ["weight_sync", "weights"])] = _spelled(
        draw, ["checkpoint", "disk", "load", "Checkpoint"]
    )
    rollout[_spelled(draw, ["expert_parallel", "ep", "enable_expert_parallel"])] = _spelled(
        draw, false
    )
    training: dict[str, Any] = {}
    training[_spelled(draw, ["attention_backend", "attn", "attn_implementation"])] = _spelled(
        draw, fa2
    )
    training[_spelled(draw, ["compute_dtype", "dtype"])] = _spelled(draw, bf16)
    training["sharding"] = _spelled(draw, ["fsdp", "FSDP", "fsdp2", "full_shard"])
    training[_spelled(draw, ["logprob_semantics", "semantics"])] = _spelled(
        draw, ["raw", "raw_logprobs", "Raw"]
    )
    training[_spelled(draw, ["lm_head_dtype", "cast_lm_head_to_fp32"])] = _spelled(
        draw, ["compute", "compute_dtype", "model"]
    )
    training[_spelled(draw, ["moe_routing", "routing_replay"])] = _spelled(
        draw, ["natural", "Natural", "router"]
    )
    training[_spelled(draw, ["router_dtype", "moe_router_dtype"])] = _spelled(
        draw, ["model", "compute", "Model"]
    )
    doc["baseline"]["rollout"] = rollout
    doc["baseline"]["training"] = training
    doc["baseline"]["logp"] = {_spelled(draw, ["backend", "impl"]): "native"}
    doc["interventions"] = [
        {"path": _spelled(draw, ["batch.size", "batch_size", " batch.size"]), "values": [1, 2]},
        {
            "path": _spelled(
                draw, ["rollout.tensor_parallel_size", "rollout.tp", "rollout.tp_size"]
            ),
            "values": [1, 2],
        },
        {"path": "rollout.dtype", "values": [_spelled(draw, fp32)]},
        {
            "path": _spelled(draw, ["rollout.enable_prefix_caching", "rollout.prefix_caching"]),
            "values": [_spelled(draw, false)],
        },
        {
            "path": _spelled(draw, ["rollout.enforce_eager", "rollout.eager"]),
            "values": [_spelled(draw, true)],
        },
        {
            "path": _spelled(draw, ["training.attention_backend", "training.attn"]),
            "values": [_spelled(draw, ["eager", "math", "EAGER"])],
        },
        {
            "path": _spelled(draw, ["training.compute_dtype", "training.dtype"]),
            "values": [_spelled(draw, fp32)],
        },
        {
            "path": "training.sharding",
            "values": [_spelled(draw, ["none", "unsharded", "no_shard", "ddp"])],
        },
        {
            "path": _spelled(draw, ["logp.backend", "logp.impl"]),
            "values": [_spelled(draw, ["rlkernel.reference_logp", " rlkernel.reference_logp"])],
        },
    ]
    return doc


FA2_REFERENCE_IDS = ids_by_label(ok_plan(make_config(attention="flash_attention_2")))


@SETTINGS
@given(alias_spellings())
def test_case_ids_ignore_alias_spelling(doc: dict[str, Any]) -> None:
    plan = ok_plan(doc)
    assert ids_by_label(plan) == FA2_REFERENCE_IDS
    # Labels use canonical paths and values whatever the spelling.
    assert "rollout.tensor_parallel_size=1" in ids_by_label(plan)
    assert "rollout.enforce_eager=true" in ids_by_label(plan)


@SETTINGS
@given(
    indent=st.one_of(st.none(), st.integers(0, 8), st.sampled_from(["\t", " \n "])),
    item_sep=st.sampled_from([",", ", ", " ,  ", ",\n"]),
    key_sep=st.sampled_from([":", ": ", " : ", ":\t"]),
    ensure_ascii=st.booleans(),
    trailing=st.sampled_from(["", "\n", "\r\n\n  "]),
)
def test_case_ids_ignore_whitespace(
    tmp_path: Path, indent: Any, item_sep: str, key_sep: str, ensure_ascii: bool, trailing: str
) -> None:
    doc = make_config()
    doc["description"] = "Unicode ok: \u00e9\u4e2d"
    text = (
        json.dumps(doc, indent=indent, separators=(item_sep, key_sep), ensure_ascii=ensure_ascii)
        + trailing
    )
    path = tmp_path / "config.json"
    path.write_text(text, encoding="utf-8")
    assert ids_by_label(ok_plan_config(path)) == REFERENCE_IDS


def ok_plan_config(path: Path) -> ExperimentPlan:
    plan = plan_experiment(load_config(path))
    assert not plan.has_errors
    return plan


def test_case_ids_are_the_documented_hash() -> None:
    # The case-id rule: first 16 hex of SHA-256 over canonical JSON (sorted keys, no spaces) of the
    # normalized requested values, identity, resolved contract version and scenario definition.
    config = parse_config(make_config())
    for case in REFERENCE.cases:
        payload = {
            "requested": dict(case.requested),
            "identity": config.identity.canonical_identity(),
            "contract": {"source": "ws1", "version": REFERENCE.contract.version},
            "scenario": {"scenario_id": "planner-test-scenario", "level": "S2", "device": "cuda"},
            "operators": [],
        }
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert case.case_id == hashlib.sha256(text.encode()).hexdigest()[:16]
        assert case.case_id == case_id(
            requested=case.requested, config=config, contract=REFERENCE.contract
        )


def test_large_prompt_sets_plan_quickly(tmp_path: Path) -> None:
    # The identity (all prompt token ids) goes into every case id; it must be hashed once per
    # plan, not once per case.
    prompts = [[(i * 31 + j) % 150_000 for j in range(1024)] for i in range(128)]
    (tmp_path / "prompts.json").write_text(json.dumps(prompts), encoding="utf-8")
    doc = make_config()
    doc["identity"]["prompts"] = {"file": "prompts.json"}
    doc["interventions"] = [{"path": "batch.size", "values": _batch_values(CASE_CAP - 1)}]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    start = time.perf_counter()
    plan = ok_plan_config(path)
    elapsed = time.perf_counter() - start
    assert len(plan.cases) == CASE_CAP
    assert elapsed < 5.0, f"planning 256 cases over 131k prompt tokens took {elapsed:.1f}s"


# ----------------------------------------------------------------------------- sensitivity


def _set(doc: dict[str, Any], dotted: str, value: Any) -> None:
    node = doc
    *parents, last = dotted.split(".")
    for part in parents:
        node = node[part]
    node[last] = value


IDENTITY_CHANGES: list[tuple[str, Any]] = [
    ("identity.checkpoint.uri", "/models/tiny-other"),
    ("identity.checkpoint.model_version", "tiny-v2"),
    ("identity.checkpoint.digest", "ab" * 32),
    ("identity.tokenizer.id", "tiny-tok-2"),
    ("identity.tokenizer.add_special_tokens", True),
    ("identity.tokenizer.chat_template", "{{ messages }}"),
    ("identity.prompts.token_ids", [[1, 2, 3], [4, 6]]),
    ("identity.prompts.token_ids", [[1, 2, 3], [4, 5], [7]]),
    ("identity.prompts.token_ids", [[4, 5], [1, 2, 3]]),
    ("identity.sampling.seed", 1),
    ("identity.sampling.max_new_tokens", 9),
    ("identity.sampling.temperature", 0.7),
    ("identity.mask_policy", "response_before_eos"),
    ("identity.training_kv_cache", True),
]
SCENARIO_CHANGES: list[tuple[str, Any]] = [
    ("scenario_id", "another-scenario"),
    ("scenario.level", "S3"),
    ("scenario.level", "S0"),
    ("scenario.device", "cpu"),
]


@pytest.mark.parametrize(
    ("path", "value"),
    IDENTITY_CHANGES + SCENARIO_CHANGES,
    ids=[f"{p}={v!r}"[:40] for p, v in IDENTITY_CHANGES + SCENARIO_CHANGES],
)
def test_every_case_id_changes_with_identity_and_scenario(path: str, value: Any) -> None:
    doc = make_config()
    _set(doc, path, value)
    changed = ids_by_label(ok_plan(doc))
    assert changed.keys() == REFERENCE_IDS.keys()
    for label, new_id in changed.items():
        assert new_id != REFERENCE_IDS[label], label


@SETTINGS
@given(
    seed=st.integers(0, 2**32 - 1),  # config.limits.MAX_SEED
    max_new=st.integers(1, 10**6),
    temperature=st.floats(0, 100, allow_nan=False),
    tokens=st.lists(
        st.lists(st.integers(0, 2**31), min_size=1, max_size=6), min_size=1, max_size=4
    ),
)
def test_case_ids_track_identity_values(
    seed: int, max_new: int, temperature: float, tokens: list[list[int]]
) -> None:
    doc = make_config()
    doc["identity"]["sampling"] = {
        "seed": seed,
        "max_new_tokens": max_new,
        "temperature": temperature,
    }
    doc["identity"]["prompts"] = {"token_ids": tokens}
    same = (seed, max_new, float(temperature), tokens) == (0, 8, 1.0, [[1, 2, 3], [4, 5]])
    ids = ids_by_label(ok_plan(doc))
    assert (ids == REFERENCE_IDS) is same


def test_identity_defaults_hash_like_their_explicit_values() -> None:
    doc = make_config()
    for key in ("mask_policy", "training_kv_cache", "packing", "positions"):
        del doc["identity"][key]
    del doc["identity"]["checkpoint"]["digest"]
    del doc["identity"]["tokenizer"]["chat_template"]
    assert ids_by_label(ok_plan(doc)) == REFERENCE_IDS


def test_non_identity_fields_do_not_change_case_ids() -> None:
    doc = make_config()
    doc["experiment_id"] = "renamed"
    doc["description"] = "words"
    doc["strict_fallback"] = False
    assert ids_by_label(ok_plan(doc)) == REFERENCE_IDS


def _valid_values(path: str) -> st.SearchStrategy[Any]:
    if path in ("batch.size", "rollout.tensor_parallel_size", "rollout.context_parallel_size"):
        return st.integers(1, 64)
    if path in ("rollout.dtype", "training.compute_dtype"):
        return st.sampled_from(DTYPES)
    if path in ("rollout.enable_prefix_caching", "rollout.enforce_eager"):
        return st.booleans()
    if path == "training.attention_backend":
        return st.sampled_from(ATTENTION_BACKENDS)
    if path == "training.sharding":
        return st.sampled_from(SHARDINGS)
    if path == "rollout.logprobs_mode":
        return st.sampled_from(LOGPROBS_MODES)
    if path == "training.logprob_semantics":
        return st.sampled_from(LOGPROB_SEMANTICS)
    if path in ("training.lm_head_dtype", "rollout.lm_head_dtype"):
        return st.sampled_from(LM_HEAD_DTYPES)
    if path == "rollout.weight_sync":
        return st.sampled_from(WEIGHT_SYNCS)
    if path == "rollout.expert_parallel":
        return st.booleans()
    if path == "training.moe_routing":
        return st.sampled_from(MOE_ROUTINGS)
    if path == "training.router_dtype":
        return st.sampled_from(ROUTER_DTYPES)
    return st.sampled_from(BACKENDS)


BASELINE_VALUES = dict(REFERENCE.cases[0].requested)


@st.composite
def baseline_change(draw: Callable[[st.SearchStrategy[Any]], Any]) -> tuple[str, Any]:
    path = draw(st.sampled_from(sorted(KNOBS)))
    value = draw(_valid_values(path).filter(lambda v: v != BASELINE_VALUES[path]))
    return path, value


@SETTINGS
@given(baseline_change())
def test_case_id_changes_exactly_when_requested_values_change(change: tuple[str, Any]) -> None:
    path, value = change
    doc = make_config()
    section, key = path.split(".")
    doc["baseline"][section][key] = value
    # Drop intervention values that would now equal the baseline (they are reported, not cased).
    for item in doc["interventions"]:
        if item["path"] == path:
            item["values"] = [v for v in item["values"] if v != value] or [BASELINE_VALUES[path]]
    plan = ok_plan(doc)
    assert plan.cases[0].case_id != REFERENCE_IDS["baseline"]
    reference = {c.label: c for c in REFERENCE.cases}
    for case in plan.cases:
        if case.label in reference:
            same_request = dict(case.requested) == dict(reference[case.label].requested)
            assert (case.case_id == reference[case.label].case_id) is same_request, case.label


def test_changing_one_intervention_value_changes_only_that_case() -> None:
    doc = make_config()
    doc["interventions"][0]["values"] = [1, 3]
    ids = ids_by_label(ok_plan(doc))
    assert "batch.size=2" not in ids
    assert ids["batch.size=3"] not in REFERENCE_IDS.values()
    assert {k: v for k, v in ids.items() if k != "batch.size=3"} == {
        k: v for k, v in REFERENCE_IDS.items() if k != "batch.size=2"
    }


def test_explicit_operator_mapping_is_part_of_the_case_id() -> None:
    def with_operators(training: str) -> dict[str, str]:
        doc = make_config()
        del doc["baseline"]["logp"]
        doc["interventions"] = doc["interventions"][:-1]
        doc["operators"] = {"selected_logprob": {"rollout": "native", "training": training}}
        return ids_by_label(ok_plan(doc))

    a, b = with_operators("native"), with_operators("rlkernel.reference_logp")
    assert a.keys() == b.keys()
    assert all(a[k] != b[k] for k in a)


TWO_VERSION_CONTRACT = {
    "schema_version": "cross_config.numerical_contract.v1",
    "sources": {
        "ws1": {
            "current": "ws1.v2",
            "versions": {
                "ws1.v1": {"threshold": 0.001, "unit": "nats"},
                "ws1.v2": {"threshold": 0.001, "unit": "nats"},
            },
        }
    },
}


def test_case_ids_change_with_the_contract_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        contract_module, "_load_document", lambda: copy.deepcopy(TWO_VERSION_CONTRACT)
    )

    def ids(version: str) -> dict[str, str]:
        doc = make_config()
        doc["contract_version"] = version
        plan = ok_plan(doc)
        assert plan.contract.version == ("ws1.v2" if version == "current" else version)
        return ids_by_label(plan)

    v1, v2, current = ids("ws1.v1"), ids("ws1.v2"), ids("current")
    assert v1.keys() == v2.keys()
    assert all(v1[k] != v2[k] for k in v1)
    # "current" is hashed as the concrete version it resolves to.
    assert current == v2


def test_current_contract_hashes_as_its_concrete_version() -> None:
    doc = make_config()
    doc["contract_version"] = REFERENCE.contract.version
    assert REFERENCE.contract.version != "current"
    assert ids_by_label(ok_plan(doc)) == REFERENCE_IDS


# ----------------------------------------------------------------------------- OAT / pairwise


@st.composite
def interventions(
    draw: Callable[[st.SearchStrategy[Any]], Any], max_values: int = 4
) -> list[dict[str, Any]]:
    paths = draw(st.lists(st.sampled_from(sorted(KNOBS)), min_size=1, max_size=10, unique=True))
    return [
        {"path": p, "values": draw(st.lists(_valid_values(p), min_size=1, max_size=max_values))}
        for p in paths
    ]


def _distinct_new(values: list[Any], baseline: Any) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if v != baseline and v not in out:
            out.append(v)
    return out


def _check_against_baseline(plan: ExperimentPlan) -> dict[str, Any]:
    baseline = dict(plan.cases[0].requested)
    assert plan.cases[0].kind is CaseKind.BASELINE and plan.cases[0].label == "baseline"
    for case in plan.cases[1:]:
        diff = sorted(p for p in baseline if case.requested[p] != baseline[p])
        assert sorted(case.changed) == diff, case.label
        assert case.requested.keys() == baseline.keys()
        assert case.label == case_label([(p, case.requested[p]) for p in case.changed])
        assert case.lifecycle == max(
            (KNOBS[p].knob.lifecycle for p in case.changed), key=lambda lc: lc.rank
        )
    return baseline


@SETTINGS
@given(interventions())
def test_oat_cases_differ_from_the_baseline_in_exactly_one_path(
    items: list[dict[str, Any]],
) -> None:
    doc = make_config(attention="flash_attention_2")
    doc["interventions"] = items
    plan = ok_plan(doc)
    baseline = _check_against_baseline(plan)
    expected = [
        (item["path"], v)
        for item in items
        for v in _distinct_new(item["values"], baseline[item["path"]])
    ]
    assert [(c.changed[0], c.requested[c.changed[0]]) for c in plan.cases[1:]] == expected
    for case in plan.cases[1:]:
        assert case.kind is CaseKind.ONE_AT_A_TIME and len(case.changed) == 1
    assert len({c.case_id for c in plan.cases}) == len(plan.cases)
    warnings = [i for i in plan.issues if i.severity is IssueSeverity.WARNING]
    total_values = sum(len(i["values"]) for i in items)
    assert len(warnings) == total_values - len(expected)


@SETTINGS
@given(st.data())
def test_pairwise_cases_differ_only_in_a_listed_pair(data: st.DataObject) -> None:
    items = data.draw(interventions(max_values=3).filter(lambda xs: len(xs) >= 2))
    doc = make_config(attention="flash_attention_2")
    doc["interventions"] = items
    paths = [i["path"] for i in items]
    all_pairs = [(a, b) for i, a in enumerate(paths) for b in paths[i + 1 :]]
    pairs = data.draw(st.lists(st.sampled_from(all_pairs), min_size=1, max_size=5, unique=True))
    doc["pairs"] = [list(p) if data.draw(st.booleans()) else [p[1], p[0]] for p in pairs]
    doc["strategy"] = "pairwise"
    plan = ok_plan(doc)
    assert plan.strategy is Strategy.PAIRWISE
    baseline = _check_against_baseline(plan)
    listed = {frozenset(p) for p in pairs}
    new = {i["path"]: _distinct_new(i["values"], baseline[i["path"]]) for i in items}
    pairwise = [c for c in plan.cases if c.kind is CaseKind.PAIRWISE]
    oat = [c for c in plan.cases if c.kind is CaseKind.ONE_AT_A_TIME]
    assert len(oat) == sum(len(v) for v in new.values())
    assert len(pairwise) == sum(len(new[a]) * len(new[b]) for a, b in pairs)
    for case in pairwise:
        assert len(case.changed) == 2
        assert frozenset(case.changed) in listed
        a, b = case.changed  # catalog order, whatever order the pair was listed in
        assert list(KNOBS).index(a) < list(KNOBS).index(b)
    assert len({c.case_id for c in plan.cases}) == len(plan.cases)


def test_pairwise_flag_expands_pairs_of_an_oat_config() -> None:
    doc = make_config()
    doc["pairs"] = [["batch.size", "rollout.tp"]]
    oat = plan_of(doc)
    assert [i.code for i in oat.issues] == ["PAIRS_IGNORED"]
    assert not oat.has_errors and len(oat.cases) == len(REFERENCE.cases)
    pw = ok_plan(doc, pairwise=True)
    assert pw.strategy is Strategy.PAIRWISE
    assert [c.label for c in pw.cases if c.kind is CaseKind.PAIRWISE] == [
        "batch.size=1,rollout.tensor_parallel_size=1",
        "batch.size=1,rollout.tensor_parallel_size=2",
        "batch.size=2,rollout.tensor_parallel_size=1",
        "batch.size=2,rollout.tensor_parallel_size=2",
    ]
    # OAT cases keep their ids when pairwise cases are added.
    assert {
        c.label: c.case_id for c in pw.cases if c.kind is not CaseKind.PAIRWISE
    } == REFERENCE_IDS


# ----------------------------------------------------------------------------- the case cap


def _batch_values(n: int) -> list[int]:
    return [v for v in range(1, n + 2) if v != 8][:n]


def test_exactly_the_cap_is_planned() -> None:
    doc = make_config()
    doc["interventions"] = [{"path": "batch.size", "values": _batch_values(CASE_CAP - 1)}]
    plan = ok_plan(doc)
    assert len(plan.cases) == CASE_CAP == 256


def test_one_over_the_cap_is_refused_before_expansion(monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_expand(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("_expand called although the plan exceeds the cap")

    monkeypatch.setattr(planner_module, "_expand", must_not_expand)
    doc = make_config()
    doc["interventions"] = [{"path": "batch.size", "values": _batch_values(CASE_CAP)}]
    plan = plan_of(doc)
    assert codes(plan) == [("CASE_CAP_EXCEEDED", "$.interventions")]
    assert "257 cases" in plan.issues[0].message and "256" in plan.issues[0].message
    assert plan.cases == ()


def test_pairwise_product_over_the_cap_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planner_module, "_expand", lambda *a, **k: pytest.fail("expanded"))
    doc = make_config()
    doc["interventions"] = [
        {"path": "batch.size", "values": _batch_values(16)},
        {"path": "rollout.tp", "values": [1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]},
    ]
    doc["pairs"] = [["batch.size", "rollout.tp"]]
    assert 1 + 16 + 15 <= CASE_CAP  # OAT alone fits; the pair does not
    plan = plan_of(doc, pairwise=True)
    assert [i.code for i in plan.issues] == ["CASE_CAP_EXCEEDED"]
    assert f"{1 + 16 + 15 + 16 * 15} cases" in plan.issues[0].message
    assert plan.cases == ()


def test_huge_pairwise_product_is_refused_quickly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planner_module, "_expand", lambda *a, **k: pytest.fail("expanded"))
    doc = make_config()
    doc["interventions"] = [
        {"path": "batch.size", "values": list(range(100, 10_100))},
        {"path": "rollout.tensor_parallel_size", "values": list(range(100, 10_100))},
    ]
    doc["strategy"] = "pairwise"
    doc["pairs"] = [["batch.size", "rollout.tensor_parallel_size"]]
    config = parse_config(doc)
    start = time.perf_counter()
    plan = plan_experiment(config)
    elapsed = time.perf_counter() - start
    assert [i.code for i in plan.issues] == ["CASE_CAP_EXCEEDED"]
    assert f"{1 + 20_000 + 10_000 * 10_000} cases" in plan.issues[0].message
    assert plan.cases == ()
    assert elapsed < 1.0, f"refusing took {elapsed:.2f}s"


# ----------------------------------------------------------------------------- issues


def test_intervention_equal_to_baseline_is_a_warning_not_a_case() -> None:
    doc = make_config()
    doc["interventions"] = [{"path": "rollout.dtype", "values": ["bf16", "float32"]}]
    plan = ok_plan(doc)
    assert codes(plan) == [("EQUALS_BASELINE", "$.interventions[0].values[0]")]
    assert plan.issues[0].severity is IssueSeverity.WARNING
    assert "rollout.dtype=bfloat16 equals the baseline" in plan.issues[0].message
    assert [c.label for c in plan.cases] == ["baseline", "rollout.dtype=float32"]


def test_intervention_of_only_baseline_values_plans_only_the_baseline() -> None:
    doc = make_config()
    doc["interventions"] = [{"path": "rollout.enable_prefix_caching", "values": ["on", True]}]
    plan = ok_plan(doc)
    assert [i.code for i in plan.issues] == ["EQUALS_BASELINE", "EQUALS_BASELINE"]
    assert [c.label for c in plan.cases] == ["baseline"]


def test_duplicate_value_is_planned_once() -> None:
    doc = make_config()
    doc["interventions"] = [
        {"path": "rollout.dtype", "values": ["fp32", "float32", "float16"]},
        {"path": "batch.size", "values": [1, 1]},
    ]
    plan = ok_plan(doc)
    assert codes(plan) == [
        ("DUPLICATE_VALUE", "$.interventions[0].values[1]"),
        ("DUPLICATE_VALUE", "$.interventions[1].values[1]"),
    ]
    assert all(i.severity is IssueSeverity.WARNING for i in plan.issues)
    assert [c.label for c in plan.cases] == [
        "baseline",
        "rollout.dtype=float32",
        "rollout.dtype=float16",
        "batch.size=1",
    ]


def test_intervention_without_baseline_value() -> None:
    doc = make_config()
    del doc["baseline"]["rollout"]["context_parallel_size"]
    doc["interventions"] = [{"path": "rollout.cp", "values": [1]}]
    plan = plan_of(doc)
    assert codes(plan) == [("INTERVENTION_WITHOUT_BASELINE", "$.interventions[0].path")]
    assert "rollout.context_parallel_size has no baseline value" in plan.issues[0].message
    assert plan.cases == ()


def test_unknown_knob_in_an_intervention() -> None:
    doc = make_config()
    doc["interventions"].append({"path": "rollout.quantization", "values": ["fp8"]})
    plan = plan_of(doc)
    assert codes(plan) == [("UNKNOWN_KNOB", "$.interventions[9].path")]
    assert "'rollout.quantization' is not an allowlisted knob" in plan.issues[0].message
    assert plan.cases == ()


def test_invalid_intervention_value_names_its_path() -> None:
    doc = make_config()
    doc["interventions"][1]["values"] = [1, 0, "two", True]
    plan = plan_of(doc)
    assert codes(plan) == [
        ("INVALID_VALUE", "$.interventions[1].values[1]"),
        ("INVALID_VALUE", "$.interventions[1].values[2]"),
        ("INVALID_VALUE", "$.interventions[1].values[3]"),
    ]
    assert all("expected a positive integer" in i.message for i in plan.issues)


def test_duplicate_knobs_through_aliases() -> None:
    doc = make_config()
    doc["baseline"]["rollout"]["tp"] = 2
    doc["interventions"].append({"path": "rollout.tp", "values": [8]})
    plan = plan_of(doc)
    assert ("DUPLICATE_KNOB", "$.baseline.rollout.tp") in codes(plan)
    assert ("DUPLICATE_INTERVENTION", "$.interventions[9].path") in codes(plan)
    assert plan.cases == ()


@pytest.mark.parametrize(
    ("where", "path"),
    [
        ("baseline", "$.baseline.training.attention_backend"),
        ("intervention", "$.interventions[5].values[1]"),
    ],
)
def test_flash_attention_on_cpu_is_unsupported(where: str, path: str) -> None:
    doc = make_config(device="cpu")
    if where == "baseline":
        doc["baseline"]["training"]["attention_backend"] = "fa2"
    else:
        doc["interventions"][5]["values"] = ["eager", "flash_attention_2"]
    plan = plan_of(doc)
    assert codes(plan) == [("UNSUPPORTED_ON_DEVICE", path)]
    assert "flash_attention_2 needs cuda" in plan.issues[0].message
    assert "'cpu'" in plan.issues[0].message
    assert plan.cases == ()


def test_flash_attention_on_cuda_is_fine() -> None:
    assert (
        ok_plan(make_config(attention="fa2")).cases[0].requested["training.attention_backend"]
        == "flash_attention_2"
    )


def test_pairwise_without_pairs() -> None:
    doc = make_config()
    doc["strategy"] = "pairwise"
    doc["pairs"] = []
    plan = plan_of(doc)
    assert codes(plan) == [("PAIRWISE_WITHOUT_PAIRS", "$.pairs")]
    assert plan.cases == ()
    plan = plan_of(make_config(), pairwise=True)
    assert codes(plan) == [("PAIRWISE_WITHOUT_PAIRS", "$.pairs")]


def test_bad_pairs() -> None:
    doc = make_config()
    doc["strategy"] = "pairwise"
    doc["pairs"] = [
        ["batch.size", "batch_size"],
        ["batch.size", "rollout.cp"],
        ["batch.size", "rollout.foo"],
        ["rollout.tp", "batch.size"],
        ["batch.size", "rollout.tp"],
    ]
    plan = plan_of(doc)
    assert codes(plan) == [
        ("INVALID_PAIR", "$.pairs[0]"),
        ("PAIR_WITHOUT_INTERVENTION", "$.pairs[1]"),
        ("UNKNOWN_KNOB", "$.pairs[2][1]"),
        ("DUPLICATE_PAIR", "$.pairs[4]"),
    ]
    assert "rollout.context_parallel_size has no declared intervention" in plan.issues[1].message


def test_all_issues_are_reported_at_once() -> None:
    doc = make_config(device="cpu")
    doc["baseline"]["training"]["attention_backend"] = "flash_attention_2"
    doc["baseline"]["rollout"]["foo"] = 1
    doc["baseline"]["batch"]["size"] = 0
    doc["interventions"] = [
        {"path": "nope", "values": [1]},
        {"path": "rollout.dtype", "values": ["bf16", "int4"]},
        {"path": "training.sharding", "values": ["fsdp", "none", "none"]},
    ]
    plan = plan_of(doc)
    assert sorted(codes(plan)) == sorted(
        [
            ("INVALID_VALUE", "$.baseline.batch.size"),
            ("UNKNOWN_KNOB", "$.baseline.rollout.foo"),
            ("UNSUPPORTED_ON_DEVICE", "$.baseline.training.attention_backend"),
            ("UNKNOWN_KNOB", "$.interventions[0].path"),
            ("EQUALS_BASELINE", "$.interventions[1].values[0]"),
            ("INVALID_VALUE", "$.interventions[1].values[1]"),
            ("EQUALS_BASELINE", "$.interventions[2].values[0]"),
            ("DUPLICATE_VALUE", "$.interventions[2].values[2]"),
        ]
    )
    assert plan.has_errors and plan.cases == ()


# ----------------------------------------------------------------------------- labels


def test_labels() -> None:
    assert case_label([]) == "baseline"
    assert case_label([("batch.size", 1)]) == "batch.size=1"
    assert case_label([("rollout.enforce_eager", True)]) == "rollout.enforce_eager=true"
    assert (
        case_label([("rollout.enable_prefix_caching", False)])
        == "rollout.enable_prefix_caching=false"
    )
    assert (
        case_label([("batch.size", 1), ("rollout.tensor_parallel_size", 2)])
        == "batch.size=1,rollout.tensor_parallel_size=2"
    )
    assert [c.label for c in REFERENCE.cases] == [
        "baseline",
        "batch.size=1",
        "batch.size=2",
        "rollout.tensor_parallel_size=1",
        "rollout.tensor_parallel_size=2",
        "rollout.dtype=float32",
        "rollout.enable_prefix_caching=false",
        "rollout.enforce_eager=true",
        "training.attention_backend=eager",
        "training.compute_dtype=float32",
        "training.sharding=none",
        "logp.backend=rlkernel.reference_logp",
    ]


def test_case_lifecycles() -> None:
    lifecycles = {c.label: c.lifecycle for c in REFERENCE.cases}
    assert lifecycles["baseline"] is None
    assert lifecycles["batch.size=1"] is Lifecycle.REQUEST
    assert lifecycles["rollout.tensor_parallel_size=1"] is Lifecycle.PROCESS
    assert lifecycles["rollout.dtype=float32"] is Lifecycle.ENGINE_CONSTRUCTION
    pw = ok_plan(
        {**make_config(), "strategy": "pairwise", "pairs": [["batch.size", "rollout.dtype"]]}
    )
    assert {c.lifecycle for c in pw.cases if c.kind is CaseKind.PAIRWISE} == {
        Lifecycle.ENGINE_CONSTRUCTION
    }


def test_case_records_are_frozen() -> None:
    case = REFERENCE.cases[0]
    with pytest.raises(AttributeError):
        case.case_id = "0" * 16  # type: ignore[misc]
    with pytest.raises(TypeError):
        case.requested["batch.size"] = 3  # type: ignore[index]


def test_temporary_directory_load_round_trip() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.json"
        path.write_text(json.dumps(make_config()), encoding="utf-8")
        assert ids_by_label(ok_plan_config(path)) == REFERENCE_IDS
