"""comparison.json is read once, strictly, into its typed record (issue 20).

``store.comparison.parse_comparison`` decodes the sealed bytes (msgspec, ``store.decode``) and
accepts exactly what the writer writes: every wrong type, missing required key, unknown key or
wrong nested type is refused naming its JSON path (a syntax error: its byte offset), optional
parts are optional, and ``to_json`` gives back the very bytes it
was read from, for the runs sealed before the read model (``tests/data/pre_issue20``) and for
freshly written attempts of every kind. ``verify`` and ``run`` judge an attempt whose
re-sealed comparison.json has a wrong type invalid (one line naming the field), never crash.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from drift_testing import S0, FaultyCpuSmokeAdapter, cli, copy_of_s0, run_by_label, run_s0

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.check.resume import check_attempt
from pytest_logprob_drift.numerics.comparison import Comparison
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.store.comparison import parse_comparison
from pytest_logprob_drift.store.files import json_bytes
from pytest_logprob_drift.store.layout import COMPARISON, COMPLETE
from pytest_logprob_drift.store.run import iter_attempt_dirs
from pytest_logprob_drift.store.seal import SealError

PRE_ISSUE20 = Path(__file__).parent / "data" / "pre_issue20" / "runs"
EXPERIMENT = "s0-cpu-smoke"


def _fixture_comparisons() -> list[Path]:
    return sorted(PRE_ISSUE20.rglob(COMPARISON))


def _full_vocabulary_fixture() -> dict[str, Any]:
    """A pre-issue-20 comparison with every part: statistics, full vocabulary, offset."""
    for path in _fixture_comparisons():
        document: dict[str, Any] = json.loads(path.read_bytes())
        full = document["diagnostics"].get("full_vocabulary", {})
        if full.get("worst_positions") and len(full["worst_positions"][0]["top_tokens"]) > 1:
            return document
    raise AssertionError("no fixture comparison with full-vocabulary worst positions")


# ----------------------------------------------------------------------------- round trip


def test_the_fixture_runs_hold_comparisons_of_both_kinds() -> None:
    documents = [json.loads(p.read_bytes()) for p in _fixture_comparisons()]
    assert len(documents) == 6
    assert sum("full_vocabulary" in d["diagnostics"] for d in documents) == 3
    assert {d["outcome"] for d in documents} == {"PASS", "MISMATCH"}


@pytest.mark.parametrize("path", _fixture_comparisons(), ids=lambda p: p.parent.parent.name)
def test_pre_issue20_comparisons_round_trip_byte_for_byte(path: Path) -> None:
    data = path.read_bytes()
    record = parse_comparison(data)
    assert isinstance(record, Comparison)
    assert json_bytes(record.to_json()) == data


def _full_config(work: Path) -> Path:
    document = json.loads(S0.read_text())
    document["diagnostics"] = {"full_vocabulary": {"top_k": 3, "worst_positions": 2}}
    path = work / "full.json"
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize(
    ("adapter", "outcomes"),
    [
        (None, {Outcome.PASS, Outcome.MISMATCH}),
        ("alter_tokens", {Outcome.INVALID_IDENTITY}),
        ("nan_scores", {Outcome.INVALID_ARTIFACT}),
    ],
)
def test_fresh_comparisons_are_the_record_written_once(
    tmp_path: Path, adapter: str | None, outcomes: set[Outcome]
) -> None:
    """Every freshly sealed comparison.json is its record's ``to_json``: parsing it back gives
    an equal record and the same bytes; the runner carries that record."""
    results = run_by_label(
        plan_file(str(_full_config(tmp_path))),
        runtime="cpu-smoke",
        artifacts=tmp_path / "runs",
        allow_smoke=True,
        adapter=None if adapter is None else FaultyCpuSmokeAdapter(adapter),
    )
    assert {r.outcome for r in results.values()} == outcomes
    for result in results.values():
        assert result.attempt_dir is not None and result.comparison is not None
        data = (result.attempt_dir / COMPARISON).read_bytes()
        record = parse_comparison(data)
        assert record == result.comparison
        assert json_bytes(record.to_json()) == data
        assert record.outcome is result.outcome and record.reason == result.reason
        assert check_attempt(result.attempt_dir, expected_key=None).comparison == record
        if adapter is None:
            assert record.numerical is not None
            assert record.numerical.outcome is record.outcome
            assert record.diagnostics.statistics is not None
        assert record.diagnostics.full_summary is not None
        assert record.diagnostics.semantic_offset is not None


def test_integers_in_number_fields_stay_integers() -> None:
    """A number written as an integer (a config's ``threshold: 1``) decodes as one, so the
    bytes re-encode unchanged: number fields are ``int | float``, never coerced."""
    document = _full_vocabulary_fixture()
    document["threshold"] = document["contract"]["threshold"] = 1
    document["diagnostics"]["semantic_offset"]["explained_fraction"] = 1
    document["diagnostics"]["mismatch_ratio"] = 0
    data = json_bytes(document)
    record = parse_comparison(data)
    assert type(record.threshold) is int and type(record.diagnostics.mismatch_ratio) is int
    assert json_bytes(record.to_json()) == data


def test_optional_parts_are_optional() -> None:
    document = _full_vocabulary_fixture()
    for key in ("full_vocabulary", "semantic_offset"):
        del document["diagnostics"][key]
    del document["numerical"]
    record = parse_comparison(json_bytes(document))
    assert record.numerical is None
    assert record.diagnostics.full_vocabulary is None
    assert record.diagnostics.semantic_offset is None
    assert record.diagnostics.statistics is not None
    assert record.to_json() == document
    document["diagnostics"] = {"full_vocabulary": {"unavailable": "no distributions"}}
    record = parse_comparison(json_bytes(document))
    assert record.diagnostics.statistics is None
    assert record.diagnostics.max_abs_diff is None
    assert record.diagnostics.unavailable == "no distributions"
    assert record.to_json() == document


# ----------------------------------------------------------------------------- error paths

Mutation = Callable[[dict[str, Any]], None]


def _set(path: tuple[str | int, ...], value: Any) -> Mutation:
    def mutate(document: dict[str, Any]) -> None:
        node: Any = document
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = value

    return mutate


def _delete(path: tuple[str | int, ...]) -> Mutation:
    def mutate(document: dict[str, Any]) -> None:
        node: Any = document
        for step in path[:-1]:
            node = node[step]
        del node[path[-1]]

    return mutate


DIAG = "diagnostics"
FULL = (DIAG, "full_vocabulary")
OFFSET = (DIAG, "semantic_offset")
ERRORS: list[tuple[Mutation, str]] = [
    (_delete(("case_id",)), "$: Object missing required field `case_id`"),
    (_delete(("records",)), "$: Object missing required field `records`"),
    (_set(("surprise",), 1), "$: Object contains unknown field `surprise`"),
    (_set(("case_id",), 7), "$.case_id: Expected `str`, got `int`"),
    (_set(("outcome",), "MAYBE"), "$.outcome: Invalid enum value 'MAYBE'"),
    (_set(("outcome",), None), "$.outcome: Expected `str`, got `null`"),
    (_set(("active_tokens",), "38"), "$.active_tokens: Expected `int`, got `str`"),
    (_set(("mismatches",), True), "$.mismatches: Expected `int`, got `bool`"),
    (_set(("mismatches",), -1), "$.mismatches: Expected `int` >= 0"),
    (_set(("threshold",), "0.001"), "$.threshold: Expected `int | float`, got `str`"),
    (_set(("threshold",), float("nan")), "invalid JSON at byte 6772: NaN is not valid JSON"),
    (_set(("reason",), ["x"]), "$.reason: Expected `str`, got `array`"),
    (_set(("contract",), "ws1"), "$.contract: Expected `object`, got `str`"),
    (
        _delete(("contract", "minor_version")),
        "$.contract: Object missing required field `minor_version`",
    ),
    (
        _set(("contract", "threshold"), {}),
        "$.contract.threshold: Expected `int | float`, got `object`",
    ),
    (_set((DIAG,), []), "$.diagnostics: Expected `object`, got `array`"),
    (
        _delete((DIAG, "max_abs_diff")),
        "$.diagnostics: Object missing required field `max_abs_diff` (statistics: all or none)",
    ),
    (
        _set((DIAG, "mean_abs_diff"), None),
        "$.diagnostics.mean_abs_diff: Expected `int | float`, got `null`",
    ),
    # a member not declared is a part sealed by a diagnostic not installed (issue 51)
    (_set((DIAG, "kl"), 1.0), "$.diagnostics.kl: sealed by diagnostic kl, not installed here"),
    (
        _set((DIAG, "installed_parts"), {}),
        "$.diagnostics.installed_parts: sealed by diagnostic installed_parts, not installed here",
    ),
    (_set(FULL, 3), "$.diagnostics.full_vocabulary: Expected `object`, got `int`"),
    (
        _set(FULL, {"unavailable": 3}),
        "$.diagnostics.full_vocabulary.unavailable: Expected `str`, got `int`",
    ),
    (
        _set((*FULL, "positions"), 1.5),
        "$.diagnostics.full_vocabulary.positions: Expected `int`, got `float`",
    ),
    (
        _set((*FULL, "total_variation", "infinite"), "0"),
        "$.diagnostics.full_vocabulary.total_variation.infinite: Expected `int`, got `str`",
    ),
    (
        _delete((*FULL, "kl_training_rollout", "p99")),
        "$.diagnostics.full_vocabulary.kl_training_rollout: Object missing required field `p99`",
    ),
    (
        _set((*FULL, "worst_positions"), {}),
        "$.diagnostics.full_vocabulary.worst_positions: Expected `array`, got `object`",
    ),
    (
        _set((*FULL, "worst_positions", 0, "top_tokens", 1, "token_id"), -1),
        "$.diagnostics.full_vocabulary.worst_positions[0].top_tokens[1].token_id: "
        "Expected `int` >= 0",
    ),
    (
        _set((*FULL, "worst_positions", 0, "top_tokens", 1, "tv_share"), None),
        "$.diagnostics.full_vocabulary.worst_positions[0].top_tokens[1].tv_share: "
        "Expected `int | float`, got `null`",
    ),
    (
        _set((*FULL, "worst_positions", 0, "total_variation"), "big"),
        "$.diagnostics.full_vocabulary.worst_positions[0].total_variation: "
        "Expected `int | float | null`, got `str`",
    ),
    (
        _set((*OFFSET, "fires"), "no"),
        "$.diagnostics.semantic_offset.fires: Expected `bool`, got `str`",
    ),
    (
        _set((*OFFSET, "explanation"), 1),
        "$.diagnostics.semantic_offset.explanation: Expected `str | null`, got `int`",
    ),
    (_set(("worst_tokens",), {}), "$.worst_tokens: Expected `array`, got `object`"),
    (
        _set(("worst_tokens", 0, "abs_diff"), "x"),
        "$.worst_tokens[0].abs_diff: Expected `int | float`, got `str`",
    ),
    (
        _delete(("worst_tokens", 1, "sample")),
        "$.worst_tokens[1]: Object missing required field `sample`",
    ),
    (_set(("identity_violations",), "x"), "$.identity_violations: Expected `array`, got `str`"),
    (_set(("identity_violations",), [3]), "$.identity_violations[0]: Expected `str`, got `int`"),
    (_set(("records", 0, "status"), "maybe"), "$.records[0].status: Invalid enum value 'maybe'"),
    (
        _set(("records", 1, "requested"), [1]),
        "$.records[1].requested: Expected `bool | int | str`, got `array`",
    ),
    (
        _set(("records", 0, "actual"), {}),
        "$.records[0].actual: Expected `bool | int | float | str | null`, got `object`",
    ),
    (_set(("records", 0, "lifecycle"), 0), "$.records[0].lifecycle: Expected `str`, got `int`"),
    (_set(("numerical",), None), "$.numerical: Expected `object`, got `null`"),
    (_set(("numerical", "mismatches"), 0.0), "$.numerical.mismatches: Expected `int`, got `float`"),
    (_set(("numerical", "outcome"), "pass"), "$.numerical.outcome: Invalid enum value 'pass'"),
]


@pytest.mark.parametrize(("mutate", "message"), ERRORS, ids=[e[1] for e in ERRORS])
def test_a_wrong_shape_is_a_seal_error_naming_its_json_path(mutate: Mutation, message: str) -> None:
    """The attempt's SealError on comparison.json: the JSON path and what is wrong there (a
    syntax error such as NaN: the byte offset)."""
    document = _full_vocabulary_fixture()
    parse_comparison(json_bytes(document))  # the unmutated document is fine
    mutate(document)
    with pytest.raises(SealError) as info:
        parse_comparison(json.dumps(document).encode())
    assert info.value.file == COMPARISON
    assert info.value.message == message
    assert str(info.value) == f"{COMPARISON}: {message}"
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("document", "kind"), [([], "array"), ("comparison", "str"), (None, "null"), (3, "int")]
)
def test_a_document_that_is_no_object_is_refused(document: Any, kind: str) -> None:
    with pytest.raises(SealError) as info:
        parse_comparison(json.dumps(document).encode())
    assert str(info.value) == f"comparison.json: $: Expected `object`, got `{kind}`"


def test_a_syntax_error_names_the_byte_offset() -> None:
    data = json_bytes(_full_vocabulary_fixture())
    at = data.index(b'"case_id"')
    with pytest.raises(SealError) as info:
        parse_comparison(data.replace(b'"case_id"', b"case_id", 1))
    assert str(info.value) == (
        f"comparison.json: invalid JSON at byte {at} (line 3 column 3): Expecting property "
        "name enclosed in double quotes"
    )


# ----------------------------------------------------------------------------- verify, run


@pytest.fixture(scope="module")
def sealed_run(sealed_s0: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_of_s0(sealed_s0, tmp_path_factory.mktemp("comparison-record"))


def _reseal_comparison(attempt: Path, document: dict[str, Any]) -> None:
    """Rewrite comparison.json and put its plain SHA-256 in COMPLETE (an unkeyed run)."""
    path = attempt / COMPARISON
    os.chmod(path, 0o644)
    path.write_bytes(json_bytes(document))
    seal = json.loads((attempt / COMPLETE).read_text())
    seal["files"][COMPARISON] = hashlib.sha256(path.read_bytes()).hexdigest()
    os.chmod(attempt / COMPLETE, 0o644)
    (attempt / COMPLETE).write_bytes(json_bytes(seal))


RESEALED = [
    (_set(("numerical",), []), "$.numerical: Expected `object`, got `array`"),
    (
        _set((DIAG, "max_abs_diff"), "small"),
        "$.diagnostics.max_abs_diff: Expected `int | float`, got `str`",
    ),
    (
        _set((DIAG, "semantic_offset"), {"fires": True}),
        "$.diagnostics.semantic_offset: Object missing required field `explanation`",
    ),
    (_set(("records", 0), "batch.size"), "$.records[0]: Expected `object`, got `str`"),
]


@pytest.mark.parametrize(("mutate", "detail"), RESEALED, ids=[r[1].split(":")[0] for r in RESEALED])
def test_verify_and_run_judge_a_resealed_wrong_type_invalid(
    sealed_run: Path, tmp_path: Path, mutate: Mutation, detail: str
) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(sealed_run, runs)
    run_dir = runs / EXPERIMENT
    attempt = next(
        a
        for a in iter_attempt_dirs(run_dir)
        if json.loads((a / COMPARISON).read_bytes())["label"] == "baseline"
    )
    document = json.loads((attempt / COMPARISON).read_bytes())
    mutate(document)
    _reseal_comparison(attempt, copy.deepcopy(document))

    code, out, err = cli("verify", run_dir)
    assert (code, err) == (1, ""), out
    lines = [line for line in out.splitlines() if line.startswith(attempt.parent.name)]
    assert len(lines) == 1 and attempt.name in lines[0] and "invalid" in lines[0], out
    assert COMPARISON in lines[0] and detail in lines[0], lines[0]
    assert "Traceback" not in out

    code, out, err = cli("verify", run_dir, "--json")
    report = {a["attempt_id"]: a for a in json.loads(out)["attempts"]}
    assert code == 1
    assert report[attempt.name]["status"] == "invalid"
    assert report[attempt.name]["file"] == COMPARISON
    assert report[attempt.name]["detail"].startswith(detail)

    # a following run skips it with one line and executes the case again
    code, out, err = run_s0(runs)
    assert code == 0, err
    assert f"skipped attempt {attempt.name}: {COMPARISON}: {detail}" in err
    baseline = next(r for r in json.loads(out)["results"] if r["label"] == "baseline")
    assert not baseline["reused"] and Path(baseline["attempt_dir"]) != attempt
