"""Strict config loading: every rejection names the JSON path and what was expected."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from drift_testing import EXPERIMENTS as EXPERIMENTS_DIR

from pytest_logprob_drift import (
    ConfigError,
    ConfigErrors,
    load_config,
    parse_config,
    plan_experiment,
)
from pytest_logprob_drift.config.loader import REQUIRED_TOP_LEVEL, forbidden_reason
from pytest_logprob_drift.records import IssueSeverity, ScenarioLevel, Strategy

EXPERIMENTS = sorted(EXPERIMENTS_DIR.glob("*.json"))

BASE: dict[str, Any] = {
    "schema_version": "cross_config.experiment_config.v1",
    "experiment_id": "cfg-test",
    "scenario_id": "cfg-test-cuda",
    "contract_source": "ws1",
    "contract_version": "current",
    "strategy": "one_at_a_time",
    "strict_fallback": True,
    "identity": {
        "checkpoint": {"uri": "/models/tiny", "model_version": "tiny-v1"},
        "tokenizer": {"id": "tiny-tok", "add_special_tokens": False},
        "prompts": {"token_ids": [[1, 2, 3], [4, 5]]},
        "sampling": {"seed": 0, "max_new_tokens": 8, "temperature": 1.0},
    },
    "baseline": {
        "batch": {"size": 8},
        "rollout": {"tensor_parallel_size": 2, "dtype": "bfloat16"},
        "training": {"compute_dtype": "bfloat16", "sharding": "fsdp"},
        "logp": {"backend": "native"},
    },
    "interventions": [
        {"path": "batch.size", "values": [1]},
        {"path": "rollout.dtype", "values": ["float32"]},
    ],
    "scenario": {"level": "S2", "device": "cuda"},
}


def base() -> dict[str, Any]:
    return copy.deepcopy(BASE)


def put(doc: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """Set ``a.b[0].c`` style paths (relative to ``$``) in a document; returns the document."""
    node: Any = doc
    parts = _split(dotted)
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value
    return doc


def drop(doc: dict[str, Any], dotted: str) -> dict[str, Any]:
    node: Any = doc
    parts = _split(dotted)
    for part in parts[:-1]:
        node = node[part]
    del node[parts[-1]]
    return doc


def _split(dotted: str) -> list[str | int]:
    parts: list[str | int] = []
    for chunk in dotted.split("."):
        name, _, rest = chunk.partition("[")
        if name:
            parts.append(name)
        while rest:
            index, _, rest = rest.partition("]")
            parts.append(int(index))
            rest = rest.removeprefix("[")
    return parts


def config_errors(doc: Any, **kwargs: Any) -> list[ConfigError]:
    with pytest.raises((ConfigError, ConfigErrors)) as info:
        parse_config(doc, **kwargs)
    exc = info.value
    return list(exc.errors) if isinstance(exc, ConfigErrors) else [exc]  # type: ignore[list-item]


def rejected(doc: Any, path: str, *expected: str) -> ConfigError:
    """Assert the document is refused with an error at exactly ``path`` mentioning ``expected``."""
    errors = config_errors(doc)
    at_path = [e for e in errors if e.path == path]
    assert at_path, f"no error at {path}; got {[e.render() for e in errors]}"
    error = at_path[0]
    for needle in expected:
        assert needle in error.message, (needle, error.message)
    assert path in error.render()
    return error


# ----------------------------------------------------------------------------- acceptance


def test_base_document_is_valid() -> None:
    config = parse_config(base())
    assert config.strategy is Strategy.ONE_AT_A_TIME
    assert config.scenario.level is ScenarioLevel.S2
    assert config.baseline["rollout.tensor_parallel_size"] == 2
    assert config.baseline_json_paths["rollout.dtype"] == "$.baseline.rollout.dtype"
    assert [i.json_path for i in config.interventions] == [
        "$.interventions[0]",
        "$.interventions[1]",
    ]
    assert config.identity.prompts.token_ids == ((1, 2, 3), (4, 5))
    assert config.identity.training_kv_cache is False  # the default forbids a training KV cache


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_shipped_experiments_load(path: Path) -> None:
    config = load_config(path)
    assert config.source == str(path)
    assert not plan_experiment(config).has_errors


def test_config_record_is_frozen() -> None:
    config = parse_config(base())
    with pytest.raises(AttributeError):
        config.experiment_id = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.baseline["batch.size"] = 1  # type: ignore[index]


# ----------------------------------------------------------------------------- unknown keys


def test_unknown_top_level_key() -> None:
    rejected(
        put(base(), "foo", 1),
        "$.foo",
        "unknown key",
        "expected one of",
        "schema_version",
        "baseline",
    )


@pytest.mark.parametrize(
    ("where", "allowed"),
    [
        ("identity", "checkpoint"),
        ("identity.checkpoint", "model_version"),
        ("identity.tokenizer", "add_special_tokens"),
        ("identity.prompts", "token_ids"),
        ("identity.sampling", "max_new_tokens"),
        ("baseline", "rollout"),
        ("interventions[0]", "values"),
        ("scenario", "device"),
    ],
)
def test_unknown_nested_key(where: str, allowed: str) -> None:
    doc = base()
    put(doc, f"{where}.bogus_key", 1)
    rejected(doc, f"$.{where}.bogus_key", "unknown key", "expected one of", allowed)


def test_unknown_operator_keys() -> None:
    doc = put(base(), "operators", {"other_op": {}})
    rejected(doc, "$.operators.other_op", "unknown key", "selected_logprob")
    doc = put(
        base(),
        "operators",
        {"selected_logprob": {"rollout": "native", "training": {"backend": "native", "extra": 1}}},
    )
    rejected(doc, "$.operators.selected_logprob.training.extra", "unknown key", "options")
    doc = put(base(), "operators", {"selected_logprob": {"rollout": "native"}})
    rejected(doc, "$.operators.selected_logprob.training", "missing required key")


def test_unknown_knob_inside_a_baseline_section_reaches_the_planner() -> None:
    # The config owns sections; the knob allowlist is the planner's, reported as an issue.
    config = parse_config(put(base(), "baseline.rollout.foo", 1))
    plan = plan_experiment(config)
    issues = [i for i in plan.issues if i.code == "UNKNOWN_KNOB"]
    assert len(issues) == 1
    assert issues[0].path == "$.baseline.rollout.foo"
    assert issues[0].severity is IssueSeverity.ERROR
    assert "'rollout.foo' is not an allowlisted knob" in issues[0].message
    assert "rollout.tensor_parallel_size" in issues[0].message
    assert "$.baseline.rollout.foo" in issues[0].render()
    assert plan.cases == ()


# ----------------------------------------------------------------------------- wrong types


def test_baseline_value_of_the_wrong_type_is_a_planner_issue() -> None:
    plan = plan_experiment(parse_config(put(base(), "baseline.batch.size", "8")))
    errors = [i for i in plan.issues if i.severity is IssueSeverity.ERROR]
    # Exactly one error: the bad value; the batch.size intervention is not also reported as
    # lacking a baseline value (it has one, it is just invalid).
    assert [(i.code, i.path) for i in errors] == [("INVALID_VALUE", "$.baseline.batch.size")]
    assert "expected a positive integer, got '8'" in errors[0].message
    assert plan.cases == ()


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("strict_fallback", "yes", "expected a boolean, got string 'yes'"),
        ("experiment_id", 3, "expected a non-empty id"),
        ("experiment_id", "../escape", "expected a non-empty id"),
        ("scenario_id", "", "expected a non-empty string"),
        ("contract_version", 1, "expected a non-empty string"),
        ("strategy", "grid", "expected one of 'one_at_a_time', 'pairwise'"),
        ("description", 5, "expected a string"),
        ("scenario.level", "S9", "expected one of 'S0', 'S1', 'S2', 'S3'"),
        ("scenario.device", "tpu", "expected 'cpu' or 'cuda'"),
        ("scenario", "S3", "expected an object, got string"),
        ("identity", [], "expected an object, got array"),
        ("identity.checkpoint.uri", 7, "expected a non-empty string"),
        ("identity.checkpoint.digest", "abc", "64-hex-digit SHA-256"),
        ("identity.tokenizer.add_special_tokens", 1, "expected a boolean, got integer"),
        ("identity.tokenizer.chat_template", 1, "null or a string"),
        ("identity.sampling.seed", -1, "expected a non-negative integer"),
        ("identity.sampling.seed", True, "expected a non-negative integer, got boolean"),
        ("identity.sampling.max_new_tokens", 0, "expected a positive integer"),
        ("identity.sampling.temperature", "hot", "expected a finite number >= 0"),
        ("identity.sampling.temperature", float("nan"), "expected a finite number >= 0"),
        ("identity.sampling.temperature", float("inf"), "expected a finite number >= 0"),
        ("identity.mask_policy", "everything", "expected one of 'response_through_eos'"),
        ("identity.training_kv_cache", "no", "expected a boolean"),
        ("identity.packing", "packed", "expected one of 'padded'"),
        ("identity.positions", 3, "expected one of 'from_attention_mask'"),
        ("identity.prompts.token_ids", [], "expected a non-empty array of token-id arrays"),
        ("identity.prompts.token_ids[1]", 5, "expected a non-empty array of token ids"),
        ("identity.prompts.token_ids[0][2]", -3, "expected a non-negative integer token id"),
        ("identity.prompts.token_ids[0][0]", 1.5, "expected a non-negative integer token id"),
        ("baseline.rollout", 3, "expected an object, got integer"),
        ("baseline.batch.size", None, "expected a string, integer or boolean knob value, got null"),
        ("baseline.rollout.dtype", ["bf16"], "expected a string, integer or boolean knob value"),
        ("interventions", {"path": "batch.size"}, "expected an array of {path, values} objects"),
        ("interventions[0].path", 3, "expected a knob path string"),
        ("interventions[0].values", [], "expected a non-empty array"),
        ("interventions[0].values", 1, "expected a non-empty array, got integer"),
        (
            "interventions[1].values[0]",
            {"a": 1},
            "expected a string, integer or boolean knob value",
        ),
        ("pairs", "batch.size", "expected an array of [path, path] pairs"),
        ("pairs", [["batch.size"]], "expected a pair of two knob path strings"),
        ("operators", [], "expected an object, got array"),
    ],
)
def test_wrong_type(path: str, value: Any, expected: str) -> None:
    doc = put(base(), path, value)
    error_path = "$." + path
    if path == "pairs" and isinstance(value, list):
        error_path = "$.pairs[0]"
    rejected(doc, error_path, expected)


def test_operator_backend_options_must_be_an_object() -> None:
    doc = put(
        base(),
        "operators",
        {
            "selected_logprob": {
                "rollout": "native",
                "training": {"backend": "native", "options": 3},
            }
        },
    )
    rejected(doc, "$.operators.selected_logprob.training.options", "expected an object")
    doc = put(base(), "operators", {"selected_logprob": {"rollout": "", "training": "native"}})
    rejected(doc, "$.operators.selected_logprob.rollout", "expected an object")


def test_unknown_schema_version() -> None:
    rejected(
        put(base(), "schema_version", "cross_config.experiment_config.v2"),
        "$.schema_version",
        "unknown schema_version",
        "v2",
        "expected 'cross_config.experiment_config.v1'",
    )


def test_top_level_must_be_an_object() -> None:
    rejected([base()], "$", "expected an object, got array")


# ----------------------------------------------------------------------------- missing fields


def test_missing_baseline() -> None:
    rejected(drop(base(), "baseline"), "$.baseline", "missing required key")


def test_empty_baseline() -> None:
    rejected(put(base(), "baseline", {}), "$.baseline", "baseline is empty")


@pytest.mark.parametrize("key", REQUIRED_TOP_LEVEL)
def test_missing_required_top_level_key(key: str) -> None:
    rejected(drop(base(), key), f"$.{key}", "missing required key")


def test_strict_fallback_defaults_to_true() -> None:
    assert parse_config(drop(base(), "strict_fallback")).strict_fallback is True


@pytest.mark.parametrize(
    "path",
    [
        "identity.checkpoint",
        "identity.tokenizer",
        "identity.prompts",
        "identity.sampling",
        "identity.checkpoint.uri",
        "identity.checkpoint.model_version",
        "identity.tokenizer.id",
        "identity.sampling.seed",
        "identity.sampling.max_new_tokens",
        "scenario.level",
        "scenario.device",
        "interventions[0].path",
        "interventions[0].values",
    ],
)
def test_missing_identity_and_structure_fields(path: str) -> None:
    rejected(drop(base(), path), f"$.{path}", "missing required key")


def test_prompts_need_exactly_one_source() -> None:
    rejected(put(base(), "identity.prompts", {}), "$.identity.prompts", "exactly one of")
    rejected(
        put(base(), "identity.prompts", {"token_ids": [[1]], "file": "p.json"}),
        "$.identity.prompts",
        "exactly one of",
    )


def test_pairwise_strategy_needs_pairs() -> None:
    rejected(put(base(), "strategy", "pairwise"), "$.pairs", "explicit list of path pairs")


# ----------------------------------------------------------------------------- forbidden keys

FORBIDDEN = [
    "mode",
    "plan_only",
    "expected",
    "expect",
    "allow_smoke_operators",
    "authorize_test_operators",
    "threshold",
]
LOCATIONS = [
    "",
    "baseline.",
    "baseline.rollout.",
    "identity.",
    "identity.sampling.",
    "interventions[0].",
    "scenario.",
    "operators.selected_logprob.training.options.",
]


@pytest.mark.parametrize("key", FORBIDDEN)
@pytest.mark.parametrize("where", LOCATIONS)
def test_forbidden_keys_anywhere(where: str, key: str) -> None:
    doc = base()
    doc["operators"] = {
        "selected_logprob": {"rollout": "native", "training": {"backend": "native", "options": {}}}
    }
    doc["baseline"].pop("logp")
    put(doc, f"{where}{key}", True)
    path = f"$.{where}{key}"
    errors = config_errors(doc)
    assert [e.path for e in errors] == [path], [e.render() for e in errors]
    assert errors[0].message.startswith("not allowed in a config: ")
    reason = forbidden_reason(key)
    assert reason is not None and reason in errors[0].message
    assert "to the CLI" in errors[0].message or "numerical contract" in errors[0].message


def test_forbidden_keys_cover_the_contract_list() -> None:
    for key in (
        "mode",
        "execution_mode",
        "plan_only",
        "expected",
        "expect",
        "expected_outcome",
        "expected_outcomes",
        "allow_smoke_operators",
        "authorize_smoke_operators",
        "threshold",
        "fixed_threshold",
    ):
        assert forbidden_reason(key) is not None
    assert forbidden_reason("allowance") is None and forbidden_reason("seed") is None


def test_forbidden_key_inside_a_list_item() -> None:
    doc = put(base(), "pairs", [{"threshold": 1}])
    errors = config_errors(doc)
    assert "$.pairs[0].threshold" in [e.path for e in errors]


# ----------------------------------------------------------------------------- JSON text


def write(tmp_path: Path, text: str, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load_error(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value


def test_duplicate_top_level_key_is_named(tmp_path: Path) -> None:
    text = json.dumps(base(), indent=2)
    text = text.replace(
        '"strategy": "one_at_a_time",', '"strategy": "one_at_a_time", "strategy": "pairwise",'
    )
    error = load_error(write(tmp_path, text))
    assert error.path == "$.strategy"
    assert "duplicate key 'strategy'" in error.message
    assert error.source == str(tmp_path / "config.json")


def test_duplicate_nested_key_is_named(tmp_path: Path) -> None:
    text = json.dumps(base(), indent=2).replace('"size": 8', '"size": 8, "size": 4')
    error = load_error(write(tmp_path, text))
    assert error.path == "$.baseline.batch.size"
    assert "duplicate key 'size'" in error.message


def test_duplicate_key_inside_a_list_item_is_named(tmp_path: Path) -> None:
    text = json.dumps(base()).replace('"values": [1]', '"values": [1], "values": [2]')
    assert text.count('"values": [2]') == 1
    error = load_error(write(tmp_path, text))
    assert error.path == "$.interventions[0].values"


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json(tmp_path: Path, constant: str) -> None:
    text = json.dumps(base(), indent=2).replace('"temperature": 1.0', f'"temperature": {constant}')
    error = load_error(write(tmp_path, text))
    assert error.path == "$.identity.sampling.temperature"
    assert f"{constant} is not valid JSON" in error.message


def test_invalid_json_reports_line_and_column(tmp_path: Path) -> None:
    text = '{\n  "schema_version": "cross_config.experiment_config.v1",\n  "x": 1,\n}\n'
    error = load_error(write(tmp_path, text))
    assert error.path == "$"
    assert "invalid JSON at line 4 column 1" in error.message
    assert str(tmp_path / "config.json") in error.render()


def test_empty_file_is_invalid_json(tmp_path: Path) -> None:
    assert "line 1 column 1" in load_error(write(tmp_path, "")).message


def test_deeply_nested_json_is_a_config_error(tmp_path: Path) -> None:
    error = load_error(write(tmp_path, "[" * 100_000))
    assert error.path == "$"


def test_missing_config_file(tmp_path: Path) -> None:
    error = load_error(tmp_path / "absent.json")
    assert (error.path, error.message) == ("$", "config file not found")


def test_config_path_is_a_directory(tmp_path: Path) -> None:
    assert "cannot read config file" in load_error(tmp_path).message


def test_config_file_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"experiment_id": "\xe9"}')
    assert "cannot read config file" in load_error(path).message


# ----------------------------------------------------------------------------- prompt files


def with_prompt_file(name: str) -> dict[str, Any]:
    return put(base(), "identity.prompts", {"file": name})


def test_prompt_file_is_relative_to_the_config_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_dir = tmp_path / "configs"
    (config_dir / "prompts").mkdir(parents=True)
    (config_dir / "prompts" / "p.json").write_text("[[1, 2, 3], [4, 5]]", encoding="utf-8")
    config_path = write(config_dir, json.dumps(with_prompt_file("prompts/p.json")))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config(config_path)
    assert config.identity.prompts.token_ids == ((1, 2, 3), (4, 5))
    assert config.identity.prompts.source == str(config_dir / "prompts" / "p.json")
    # The content is the identity, not where it was read from: same case ids as inline.
    inline = plan_experiment(parse_config(base()))
    from_file = plan_experiment(config)
    assert [c.case_id for c in from_file.cases] == [c.case_id for c in inline.cases]


def test_prompt_file_object_form(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text('{"token_ids": [[9, 8]]}', encoding="utf-8")
    config = load_config(write(tmp_path, json.dumps(with_prompt_file("p.json"))))
    assert config.identity.prompts.token_ids == ((9, 8),)


def test_prompt_file_absolute_path(tmp_path: Path) -> None:
    prompts = tmp_path / "abs.json"
    prompts.write_text("[[3]]", encoding="utf-8")
    config = parse_config(with_prompt_file(str(prompts)), base_dir=tmp_path / "nowhere")
    assert config.identity.prompts.token_ids == ((3,),)


def test_missing_prompt_file(tmp_path: Path) -> None:
    error = load_error(write(tmp_path, json.dumps(with_prompt_file("missing.json"))))
    assert error.path == "$.identity.prompts.file"
    assert "cannot read prompt file" in error.message
    assert str(tmp_path / "missing.json") in error.message


@pytest.mark.parametrize(
    ("contents", "path", "needle"),
    [
        ("[[1, 2", "$.identity.prompts.file", "invalid JSON at line 1"),
        ("[[1, 2], [1, 2, NaN]]", "$.identity.prompts.file", "NaN is not valid JSON"),
        ('{"token_ids": [[1]], "token_ids": [[2]]}', "$.identity.prompts.file", "duplicate key"),
        ("[]", "$.identity.prompts.file<p.json>", "expected a non-empty array of token-id arrays"),
        ('{"ids": [[1]]}', "$.identity.prompts.file<p.json>", "got object"),
        ("[[1, -2]]", "$.identity.prompts.file<p.json>[0][1]", "non-negative integer token id"),
        ('[[1], "abc"]', "$.identity.prompts.file<p.json>[1]", "non-empty array of token ids"),
    ],
)
def test_bad_prompt_file_contents(tmp_path: Path, contents: str, path: str, needle: str) -> None:
    (tmp_path / "p.json").write_text(contents, encoding="utf-8")
    error = load_error(write(tmp_path, json.dumps(with_prompt_file("p.json"))))
    assert error.path == path
    assert needle in error.message


# ----------------------------------------------------------------------------- many faults


def test_all_faults_are_reported_together() -> None:
    doc = base()
    doc["schema_version"] = "v0"
    doc["mode"] = "run"
    doc["strict_fallback"] = "yes"
    doc["extra"] = {}
    drop(doc, "identity.checkpoint.uri")
    put(doc, "identity.sampling.seed", -5)
    put(doc, "baseline.rollout.threshold", 0.5)
    put(doc, "interventions[0].values", [])
    put(doc, "scenario.device", "tpu")
    with pytest.raises(ConfigErrors) as info:
        parse_config(doc, source="many.json")
    paths = [e.path for e in info.value.errors]
    assert sorted(paths) == sorted(
        [
            "$.schema_version",
            "$.mode",
            "$.strict_fallback",
            "$.extra",
            "$.identity.checkpoint.uri",
            "$.identity.sampling.seed",
            "$.baseline.rollout.threshold",
            "$.interventions[0].values",
            "$.scenario.device",
        ]
    )
    rendered = info.value.render()
    assert "\n" not in rendered
    assert all(f"many.json: {p}: " in rendered for p in paths)
    assert all(isinstance(e, ConfigError) for e in info.value.errors)
    assert info.value.exit_code == 2


def test_single_fault_is_a_plain_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(put(base(), "strict_fallback", "yes"))
    assert info.value.exit_code == 2
    assert info.value.render() == "$.strict_fallback: expected a boolean, got string 'yes'"


# ----------------------------------------------------------------------------- contract refs


def test_unknown_contract_source_and_version_name_their_path() -> None:
    with pytest.raises(ConfigError) as info:
        plan_experiment(parse_config(put(base(), "contract_source", "ws9")))
    assert info.value.path == "$.contract_source"
    assert "unknown contract source 'ws9'" in info.value.message
    with pytest.raises(ConfigError) as info:
        plan_experiment(parse_config(put(base(), "contract_version", "v0")))
    assert info.value.path == "$.contract_version"
    assert "no version 'v0'" in info.value.message


# ----------------------------------------------------------------------------- issue 14


def parse_text(text: str) -> ConfigError:
    from pytest_logprob_drift.config.loader import parse_json_text

    with pytest.raises(ConfigError) as info:
        parse_config(parse_json_text(text, "t.json"), source="t.json")
    return info.value


@pytest.mark.parametrize(
    ("replace", "path", "needle"),
    [
        ('"seed": 0', '"seed": ' + "9" * 5000, "5000 digits is out of range"),
        ('"seed": 0', '"seed": 18446744073709551616', "out of range (at most 2**64)"),
        ('"tiny-tok"', '"tiny\\ud800"', "lone surrogate \\ud800"),
        ('"description"', '"\\udc00"', "key holds the lone surrogate"),
        ('"strategy"', '"x":' + "[" * 65 + "]" * 65 + ',"strategy"', "nested deeper than 64"),
    ],
)
def test_what_json_loads_lets_through_is_refused_with_its_path(
    replace: str, path: str, needle: str
) -> None:
    text = json.dumps({**base(), "description": "d"}).replace(replace, path, 1)
    error = parse_text(text)
    assert needle in error.render() and "\n" not in error.render()
    assert error.render().isprintable()


def test_odd_keys_are_bracketed_and_escaped_in_paths() -> None:
    doc = base()
    doc["baseline"]["rollout"]["a.b\n\x1b[2J"] = "x"
    with pytest.raises(ConfigError) as info:
        plan_experiment(parse_config(put(doc, "identity.sampling.seed", 2**32)))
    assert info.value.path == "$.identity.sampling.seed"  # a config fault comes first
    doc["identity"]["sampling"]["seed"] = 1
    plan = plan_experiment(parse_config(doc))
    (issue,) = [i for i in plan.issues if i.code == "UNKNOWN_KNOB"]
    assert issue.path == '$.baseline.rollout["a.b\\n\\x1b[2J"]'


@pytest.mark.parametrize(
    ("dotted", "value", "path", "needle"),
    [
        ("experiment_id", "a" * 201, "$.experiment_id", "at most 200 bytes"),
        ("experiment_id", "é" * 101, "$.experiment_id", "202 bytes of UTF-8 (101 characters)"),
        ("identity.sampling.seed", 2**32, "$.identity.sampling.seed", "0 .. 4294967295"),
        ("identity.checkpoint.uri", "tiny://nope", "$.identity.checkpoint.uri", "unknown"),
        ("identity.checkpoint.uri", "a" * 256, "$.identity.checkpoint.uri", "256-byte name"),
        ("identity.checkpoint.uri", "x\0y", "$.identity.checkpoint.uri", "NUL"),
    ],
)
def test_what_execution_would_refuse_is_refused_at_planning(
    dotted: str, value: Any, path: str, needle: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(put(base(), dotted, value))
    assert info.value.path == path and needle in info.value.message


def test_the_largest_accepted_values_load() -> None:
    doc = put(base(), "experiment_id", "é" * 100)
    put(doc, "identity.sampling.seed", 2**32 - 1)
    put(doc, "identity.checkpoint.uri", "synthetic://cpu-smoke/v1")
    put(doc, "identity.prompts.token_ids", [[1]])
    put(doc, "identity.sampling.max_new_tokens", 2**20 - 1)
    sampling = parse_config(doc).identity.sampling
    assert (sampling.seed, sampling.max_new_tokens) == (2**32 - 1, 2**20 - 1)


@pytest.mark.parametrize(
    ("uri", "tokens", "max_new", "path", "needle"),
    [
        ("synthetic://cpu-smoke/v1", [[1, 63], [64]], 8, "token_ids[1][0]", "vocabulary of"),
        ("tiny://qwen3-h64-v1", [[1023, 1024, 2000]], 8, "token_ids[0][1]", "1 more"),
        ("tiny://qwen3-h64-v1", [[1] * 10], 503, "max_new_tokens", "512 positions"),
        ("LOCAL", [[99, 100]], 8, "token_ids[0][1]", "(100 ids: 0 .. 99)"),
        ("LOCAL", [[1]], 48, "max_new_tokens", "48 positions"),
        ("synthetic://cpu-smoke/v1", [[1, 2]], 2**20 - 1, "max_new_tokens", "1048576 tokens"),
    ],
)
def test_token_ids_and_context_are_checked_where_the_checkpoint_is_known(
    tmp_path: Path, uri: str, tokens: list[list[int]], max_new: int, path: str, needle: str
) -> None:
    (tmp_path / "config.json").write_text('{"vocab_size": 100, "max_position_embeddings": 48}')
    doc = put(base(), "identity.checkpoint.uri", str(tmp_path) if uri == "LOCAL" else uri)
    put(doc, "identity.prompts.token_ids", tokens)
    put(doc, "identity.sampling.max_new_tokens", max_new)
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    assert info.value.path.endswith(path) and needle in info.value.message, info.value
