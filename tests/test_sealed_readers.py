"""The strict readers every sealed file goes through (issue 21, class 4), on their own.

``store.decode.decode`` (every stored JSON file, into its type), ``tensorio.tensors_from_bytes``
(every ``.pt``) and ``check.sealed_tensors.check_sealed_tensors`` (each ``.pt`` against its
file's schema): what they accept is what ``json.loads``/``torch.load`` give for the same bytes,
and each refusal says what is wrong in one line (with the JSON path, or the byte offset).
The end-to-end cases (a re-sealed run through ``verify``, ``report`` and ``run``)
are in ``test_hardening_sealed_files`` and ``test_hardening_sealed_fuzz``.
"""

from __future__ import annotations

import io
import json
from typing import Annotated, Any

import msgspec
import pytest
import torch

from pytest_logprob_drift.check.sealed_tensors import check_sealed_tensors
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.decode import (
    MAX_JSON_NESTING,
    Document,
    JSONDocumentError,
    decode,
    decode_any,
)
from pytest_logprob_drift.store.seal import SealError
from pytest_logprob_drift.tensorio import TensorFormatError, tensor_bytes, tensors_from_bytes


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize(
    "data",
    [
        b'{"a": [1, 2.5, -3, true, null, "x"], "b": {"c": []}}',
        _nested(MAX_JSON_NESTING),
        b"[" + b",".join([b"7"] * 100_000) + b"]",
        b'[[1, 2], [3, 18446744073709551615], ["\\u00e9"]]',
        b"[1e-400, -0.0, 1.7976931348623157e308]",
        b'{"digest": "00000000000000000000000", "n": 18446744073709551615, "f": 0.000116467475891}',
        b'{"text": "a 123456789012345678901234 b", "x": -18446744073709551615}',
        json.dumps({"\u2603": "\u202e"}).encode(),
    ],
)
def test_what_the_store_writes_reads_back_as_json_loads_reads_it(data: bytes) -> None:
    assert decode_any(data) == json.loads(data)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"[NaN]", "invalid JSON at byte 1: NaN is not valid JSON"),
        (b'{"a": -Infinity}', "invalid JSON at byte 7: -Infinity is not valid JSON"),
        (b"[1e999]", "$[0]: Number out of range"),
        (b"[1, 18446744073709551616]", "$[1]: integer out of range (at most 2**64)"),
        (b"[2.5, -18446744073709551616]", "$[1]: integer out of range (at most 2**64)"),
        (
            b'{"a": [[1], [2, 99999999999999999999999]]}',
            "$.a[1][1]: integer out of range (at most 2**64)",
        ),
        (b"[" + b"9" * 5000 + b"]", "$[0]: Integer value out of range"),
        (b'{"a": {"b":\n 18446744073709551616}}', "$.a.b: integer 18446744073709551616 is out of"),
        (b'{"s": "0.5", "n": -18446744073709551616}', "$.n: integer -18446744073709551616 is out"),
        (b'["a", "\\udc00"]', "$[1]: a string holds a lone surrogate (not Unicode)"),
        (b'{"\\ud800": 1}', "$.<key>: a string holds a lone surrogate (not Unicode)"),
        (b'{"a": "\xff\xfe"}', "not UTF-8 (invalid start byte at byte 7)"),
        (_nested(MAX_JSON_NESTING + 1), "nested deeper than 64 levels"),
        (_nested(100_000), "nested deeper than 64 levels"),
        (b'{"a": ', "invalid JSON at byte 6 (line 1 column 7): Expecting value"),
    ],
)
def test_what_the_store_never_writes_is_refused(data: bytes, reason: str) -> None:
    with pytest.raises(JSONDocumentError) as refused:
        decode_any(data)
    assert reason in str(refused.value)
    assert "\n" not in str(refused.value)


def _torch_save(tensors: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    return buffer.getvalue()


def test_written_tensors_read_back_bit_for_bit() -> None:
    tensors = {
        "a": torch.arange(12, dtype=torch.float64).reshape(3, 4),
        "b": torch.tensor(1.5),
        "c": torch.ones(2, 3, dtype=torch.bfloat16)[1:],  # contiguous, offset into its storage
        "d": torch.zeros(0, 5, dtype=torch.bool),
    }
    loaded = tensors_from_bytes(tensor_bytes(tensors))
    assert set(loaded) == set(tensors)
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor)


@pytest.mark.parametrize(
    ("tensor", "reason"),
    [
        (
            torch.zeros(1, dtype=torch.float64).expand(100_000, 100_000),
            "is a non-contiguous view (strides [0, 0])",
        ),
        (torch.zeros(4)[::2], "is a non-contiguous view (strides [2])"),
        (torch.zeros(3, dtype=torch.complex64), "has dtype torch.complex64"),
        (torch.zeros(3, dtype=torch.uint16), "has dtype torch.uint16"),
        (torch.zeros(3, 3).to_sparse(), "has layout torch.sparse_coo, not a dense tensor"),
    ],
)
def test_tensors_no_writer_writes_are_refused_before_they_are_used(
    tensor: torch.Tensor, reason: str
) -> None:
    data = _torch_save({"x": tensor})
    assert len(data) < 1 << 16  # a few KB, whatever the declared shape
    with pytest.raises(TensorFormatError, match="tensor 'x' ") as refused:
        tensors_from_bytes(data)
    assert reason in str(refused.value)


def _score(batch: int = 2, width: int = 5) -> dict[str, torch.Tensor]:
    return {
        "token_ids": torch.zeros(batch, width, dtype=torch.int64),
        "attention_mask": torch.ones(batch, width, dtype=torch.bool),
        "active_mask": torch.ones(batch, width, dtype=torch.bool),
        "position_ids": torch.zeros(batch, width, dtype=torch.int64),
        "logprobs": torch.zeros(batch, width),
        "prompt_lengths": torch.full((batch,), 2, dtype=torch.int64),
    }


def test_a_score_file_of_its_schema_is_accepted() -> None:
    check_sealed_tensors(layout.SCORE_ROLLOUT, _score())
    integer = {**_score(), "logprobs": torch.zeros(2, 5, dtype=torch.int64)}  # a faulty scorer
    check_sealed_tensors(layout.SCORE_TRAINING, integer)
    check_sealed_tensors(layout.SCORE_ROLLOUT, {**_score(), "extra": torch.zeros(7)})


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"attention_mask": None}, "has no 'attention_mask' tensor"),
        ({"active_mask": torch.ones(2, 5)}, "'active_mask' is torch.float32, not a bool tensor"),
        ({"logprobs": torch.ones(2, 5, dtype=torch.bool)}, "not a numeric tensor"),
        ({"token_ids": torch.zeros(10, dtype=torch.int64)}, "has 1 dimensions, not 2"),
        ({"position_ids": torch.zeros(2, 4, dtype=torch.int64)}, "its T dimension is 4, not 5"),
        ({"prompt_lengths": torch.full((3,), 2)}, "its B dimension is 3, not 2"),
        ({"prompt_lengths": torch.tensor([2, 6])}, "'prompt_lengths' holds lengths outside 0..5"),
    ],
)
def test_a_score_file_off_its_schema_names_the_tensor(
    change: dict[str, torch.Tensor | None], reason: str
) -> None:
    tensors = {k: v for k, v in {**_score(), **change}.items() if v is not None}
    with pytest.raises(SealError) as refused:
        check_sealed_tensors(layout.SCORE_ROLLOUT, tensors)
    assert refused.value.file == layout.SCORE_ROLLOUT
    assert reason in refused.value.message


class Inner(Document, frozen=True, kw_only=True):
    flag: bool


class Shaped(Document, frozen=True, kw_only=True):
    name: str
    count: int
    value: float | None
    inner: Inner
    tags: tuple[str, ...] = ()


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"name": "a", "count": 1, "value": None, "inner": {"flag": True}}, None),
        ({"name": "a", "count": 1, "value": 2, "tags": ["x"], "inner": {"flag": False}}, None),
        (
            {"name": "a", "count": True, "value": 1.0, "inner": {"flag": True}},
            "$.count: Expected `int`, got `bool`",
        ),
        (
            {"name": "a", "count": 1, "value": "1", "inner": {"flag": True}},
            "$.value: Expected `float | null`, got `str`",
        ),
        (
            {"name": "a", "count": 1, "value": 1, "tags": ["x", 2], "inner": {"flag": True}},
            "$.tags[1]: Expected `str`, got `int`",
        ),
        ({"name": "a", "count": 1, "value": 1}, "$: Object missing required field `inner`"),
        (
            {"name": "a", "count": 1, "value": 1, "inner": []},
            "$.inner: Expected `object`, got `array`",
        ),
        (
            {"name": "a", "count": 1, "value": 1, "inner": {"flag": True, "more": 1}},
            "$.inner: Object contains unknown field `more`",
        ),
        (
            {"name": "a", "count": 2**64, "value": 1, "inner": {"flag": True}},
            "$.count: integer 18446744073709551616 is out of range (at most 2**64)",
        ),
        ([], "$: Expected `object`, got `array`"),
    ],
)
def test_a_typed_document_names_the_first_path_at_fault(document: Any, problem: str | None) -> None:
    data = json.dumps(document).encode()
    if problem is None:
        decoded = decode(data, Shaped)
        assert (decoded.name, decoded.count, decoded.value) == (
            document["name"],
            document["count"],
            document["value"],
        )
        assert decoded.inner == Inner(flag=document["inner"]["flag"])
        assert decoded.tags == tuple(document.get("tags", ()))
        return
    with pytest.raises(JSONDocumentError) as refused:
        decode(data, Shaped)
    assert str(refused.value) == problem


class Renamed(Document, frozen=True, kw_only=True, rename="camel"):
    run_count: Annotated[int, msgspec.Meta(ge=0)]
    evidence: Any = None


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (  # the first fault in document order, named by the JSON member (not the field)
            b'{"runCount": 18446744073709551616, "evidence": [18446744073709551617]}',
            "$.runCount: integer 18446744073709551616 is out of range (at most 2**64)",
        ),
        (
            b'{"runCount": 1, "evidence": {"x": [0, -18446744073709551616]}}',
            "$.evidence.x[1]: integer out of range (at most 2**64)",
        ),
        (b'{"runCount": -1}', "$.runCount: Expected `int` >= 0"),  # the bound lives in the type
        (
            b'{"runCount": 1, "evidence": ' + _nested(MAX_JSON_NESTING) + b"}",
            "$.evidence" + "[0]" * (MAX_JSON_NESTING - 1) + ": nested deeper than 64 levels",
        ),
    ],
)
def test_a_bound_no_type_says_is_named_by_its_json_path(data: bytes, problem: str) -> None:
    with pytest.raises(JSONDocumentError) as refused:
        decode(data, Renamed)
    assert str(refused.value) == problem


def test_a_lone_surrogate_anywhere_is_named_by_its_path() -> None:
    for data, path in [(b'"\\udc00"', "$"), (b'{"a": [{"b": ["\\ud800x"]}]}', "$.a[0].b[0]")]:
        with pytest.raises(JSONDocumentError) as refused:
            decode_any(data)
        assert str(refused.value) == f"{path}: a string holds a lone surrogate (not Unicode)"
    assert decode(b'{"runCount": 18446744073709551615}', Renamed).run_count == 2**64 - 1
