"""``actual.json`` v2 (nested read-back parts) and v1 (three parts sealed as JSON text, parsed
once by the store's reader), and the walker that finds a format inside a sealed string."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from text_in_strings import text_in_strings

from pytest_logprob_drift.report.findings import weights_fact
from pytest_logprob_drift.store.decode import JSONDocumentError, decode
from pytest_logprob_drift.store.documents import Actual
from pytest_logprob_drift.store.read_back import V1_TEXT_MEMBERS, read_back_part

WAVE4 = Path(__file__).parent / "data" / "wave4" / "runs" / "wave4-vllm-weight-sync"


def _pushed_v1() -> dict[str, Any]:
    """The sealed ``actual.json`` of the previous release's pushed case (v1)."""
    for path in sorted(WAVE4.glob("cases/*/*/actual.json")):
        document: dict[str, Any] = json.loads(path.read_text())
        if document["read_back"].get("rollout.weight_sync") == "trainer":
            return document
    raise AssertionError("no pushed case in the wave4 fixture")


def test_the_walker_finds_every_planted_format_in_a_string() -> None:
    planted = {
        "a": {"b": "[1, 2]", "fine": "pushed from the trainer"},
        "c": ["{'x': 1}", 3, None, "[not a list"],
        "d": "(1, 2)",
        "e": ' {"k": [true]}',
        "f": "[False]",
        "g": {"nested": [{"deep": "{}"}]},
        "h": "(none)",
        "i": "1.5",
    }
    assert sorted(text_in_strings(planted)) == [
        "$.a.b",
        "$.c[0]",
        "$.d",
        "$.e",
        "$.f",
        "$.g.nested[0].deep",
    ]
    assert text_in_strings({"a": [1, {"b": ["x", "y"]}], "c": "mixed: rollout|training"}) == []


def test_a_v1_read_back_has_its_text_members_parsed_once_by_the_store() -> None:
    sealed = _pushed_v1()
    assert "schema_version" not in sealed
    actual = decode(json.dumps(sealed).encode(), Actual)
    assert actual.read_back is not None
    for name in V1_TEXT_MEMBERS:
        text = sealed["read_back"][name]
        assert isinstance(text, str)
        assert actual.read_back[name] == json.loads(text)
    arrived = actual.weights_arrived()
    assert arrived is not None
    assert arrived.weight_sync == "trainer"
    assert (
        arrived.prefix_cache_reset
        is json.loads(sealed["read_back"]["vllm.weights_arrived"])["prefix_cache_reset"]
    )
    assert weights_fact(actual.read_back) == (
        "pushed from the trainer (trainer); prefix cache reset after the push"
    )


def test_a_v2_read_back_is_kept_as_sealed() -> None:
    sealed = _pushed_v1()
    read_back = dict(sealed["read_back"])
    for name in V1_TEXT_MEMBERS:
        read_back[name] = json.loads(read_back[name])
    read_back["vllm.note"] = '{"a text": "a v2 reader never parses"}'
    document = {**sealed, "read_back": read_back, "schema_version": "cross_config.actual.v2"}
    actual = decode(json.dumps(document).encode(), Actual)
    assert actual.read_back == read_back
    assert actual.schema_version == "cross_config.actual.v2"


@pytest.mark.parametrize(
    ("version", "member", "value", "where"),
    [
        (None, "vllm.weights_arrived", "{", "$.read_back.vllm.weights_arrived"),
        (None, "vllm.sampling_applied", "[1,", "$.read_back.vllm.sampling_applied"),
        (None, "vllm.logp_injection", "NaN", "$.read_back.vllm.logp_injection"),
        (
            "cross_config.actual.v2",
            "vllm.weights_arrived",
            {"weight_sync": 3},
            "$.read_back.vllm.weights_arrived.weight_sync",
        ),
        (
            "cross_config.actual.v2",
            "vllm.weights_arrived",
            {"prefix_cache_reset": True},
            "$.read_back.vllm.weights_arrived",
        ),
        ("cross_config.actual.v3", None, None, "$.schema_version"),
    ],
)
def test_a_read_back_of_the_wrong_shape_is_refused_with_its_path(
    version: str | None, member: str | None, value: Any, where: str
) -> None:
    sealed = _pushed_v1()
    if version is not None:
        sealed["schema_version"] = version
        for name in V1_TEXT_MEMBERS:
            sealed["read_back"][name] = json.loads(sealed["read_back"][name])
    if member is not None:
        sealed["read_back"][member] = value
    with pytest.raises(JSONDocumentError) as caught:
        decode(json.dumps(sealed).encode(), Actual)
    assert str(caught.value).startswith(f"{where}:"), str(caught.value)


def test_a_read_back_part_is_plain_nested_json() -> None:
    class Dtype:
        def __str__(self) -> str:
            return "torch.bfloat16"

    part = read_back_part({"ranks": ({"rank": 0, "load": 1.5},), "dtype": Dtype(), 7: [True]})
    assert part == {"ranks": [{"rank": 0, "load": 1.5}], "dtype": "torch.bfloat16", "7": [True]}
    assert msgspec.json.decode(msgspec.json.encode(part)) == part


def test_the_attempt_writer_picks_the_file_from_the_document_type() -> None:
    from pytest_logprob_drift.store import layout
    from pytest_logprob_drift.store.documents import (
        Actual,
        Materialized,
        Requested,
        WeightsDocument,
        WeightSide,
        document_file,
    )

    requested = Requested(case_id="c", label="baseline", knobs={}, changed=(), binding={})
    assert document_file(requested) == layout.REQUESTED
    assert document_file(Materialized(knobs={}, operators=())) == layout.MATERIALIZED
    empty = Actual(knobs={}, read_back=None, operator_provenance=(), training_evidence=None)
    assert document_file(empty) == layout.ACTUAL
    sides: tuple[tuple[WeightSide, str], ...] = (
        ("rollout", layout.WEIGHTS_ROLLOUT),
        ("training", layout.WEIGHTS_TRAINING),
    )
    for side, name in sides:
        weights = WeightsDocument(
            schema_version="cross_config.weights.v1",
            side=side,
            runtime="r",
            dtype="float32",
            point="p",
            tensor_parallel_size=1,
            tensors=(),
        )
        assert document_file(weights) == name
    from pytest_logprob_drift.store.documents import ImportedInput

    with pytest.raises(TypeError, match="ImportedInput is no attempt document"):
        document_file(ImportedInput(path="p", sha256="0" * 64, size=1))
