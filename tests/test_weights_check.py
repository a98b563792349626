"""The weight check's comparison and its offline re-check (``check.weights_check``).

Documents are built by hand here, so every kind of difference is produced on purpose; each
expected line is written out in the test, not derived from the module under test. The last
tests seal such a document into a ``cpu-smoke`` attempt, re-seal it as anyone who can write an
unkeyed run can, and run ``verify``: it must name the weights file and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import msgspec
import pytest

from pytest_logprob_drift.check.weights_check import (
    check_weights,
    differences,
    summary,
    violations,
)
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.store.decode import JSONDocumentError, decode
from pytest_logprob_drift.store.documents import (
    NamedReason,
    PackedBuffer,
    SliceDigest,
    TensorDigest,
    TiedTensor,
    WeightsDocument,
)
from pytest_logprob_drift.store.seal import SealError


def _hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


A, B, C = _hex("a"), _hex("b"), _hex("c")


def _tensor(name: str, *, side: str | None = A, **changes: object) -> TensorDigest:
    fields: dict[str, object] = {
        "name": name,
        "shape": (4, 2),
        "checkpoint": A,
        "side": side,
        "side_shape": (4, 2) if side is not None else None,
        "side_dtype": "bfloat16" if side is not None else None,
    }
    fields.update(changes)
    return TensorDigest(**fields)  # type: ignore[arg-type]


def _document(*tensors: TensorDigest, **changes: object) -> WeightsDocument:
    fields: dict[str, object] = {
        "schema_version": "cross_config.weights.v1",
        "side": "rollout",
        "runtime": "vllm",
        "dtype": "bfloat16",
        "point": "test",
        "tensor_parallel_size": 2,
        "tensors": tensors,
    }
    fields.update(changes)
    return WeightsDocument(**fields)  # type: ignore[arg-type]


def _slices(rank1: str) -> tuple[SliceDigest, ...]:
    return (
        SliceDigest(rank=0, dim=0, start=0, stop=2, checkpoint=B, side=B),
        SliceDigest(rank=1, dim=0, start=2, stop=4, checkpoint=C, side=rank1),
    )


def test_equal_digests_show_no_difference_and_the_summary_says_so() -> None:
    document = _document(
        _tensor("model.embed_tokens.weight", slices=_slices(C)),
        _tensor("model.norm.weight"),
        tied=(TiedTensor(name="lm_head.weight", shares="model.embed_tokens.weight"),),
        skipped=(NamedReason(name="model.rotary_emb.inv_freq", reason="non-persistent"),),
    )
    assert differences(document) == []
    assert summary(document) == (
        "2 tensors, all equal to the checkpoint cast to bfloat16; lm_head.weight tied to "
        "model.embed_tokens.weight; 1 skipped (model.rotary_emb.inv_freq)"
    )
    assert violations(document) == []


def test_every_kind_of_difference_is_named_with_side_and_rank() -> None:
    document = _document(
        _tensor("a.missing", side=None),
        _tensor("b.shape", side_shape=(2, 4)),
        _tensor("c.dtype", side_dtype="float32"),
        _tensor("d.values", side=B),
        _tensor("e.stale_rank", slices=_slices(A)),
        _tensor("f.head", side=A, dtype="float32", side_dtype="float32"),
        extra=(NamedReason(name="g.extra", reason="held by vLLM; no checkpoint tensor"),),
    )
    found = [(d.name, d.side, d.rank, d.kind) for d in differences(document)]
    assert found == [
        ("a.missing", "rollout", None, "missing"),
        ("b.shape", "rollout", None, "shape"),
        ("c.dtype", "rollout", None, "dtype"),
        ("d.values", "rollout", None, "values"),
        ("e.stale_rank", "rollout", 1, "slice"),
        ("g.extra", "rollout", None, "unexpected"),
    ]
    details = {d.name: d.detail for d in differences(document)}
    assert details["b.shape"] == "checkpoint [4, 2], side [2, 4]"
    assert details["c.dtype"] == "side holds float32, declares bfloat16"
    assert details["e.stale_rank"].startswith("rows [2, 4) held by rank 1: sha256 ")
    recorded = msgspec.structs.replace(document, differences=tuple(differences(document)))
    lines = violations(recorded)
    assert lines[4].startswith("weights (rollout, TP rank 1): e.stale_rank: slice: rows [2, 4)")
    assert summary(recorded).startswith("6 difference(s) in 6 tensors: a.missing: missing")
    assert summary(recorded).endswith("and 3 more")


W13 = "model.layers.1.mlp.experts.routed_experts.w13_weight"


def _packed(rank: int, held: str, tensor: str = "w13_weight") -> PackedBuffer:
    layer = W13.removesuffix(".w13_weight")
    return PackedBuffer(layer=layer, tensor=tensor, rank=rank, expected=B, held=held)


def test_a_prepacked_buffer_that_is_not_the_prepack_of_the_loaded_weights_is_named() -> None:
    """The read-back after processing (vLLM's CPU MoE prepack): equal buffers show nothing;
    rank 1's w13 holding other bytes is one ``packed`` difference naming layer, tensor and
    rank, a violation line and INVALID_IDENTITY-only under verify."""
    clean = _document(_tensor("x.weight"), packed=(_packed(0, B), _packed(1, B)))
    assert differences(clean) == []
    bad = msgspec.structs.replace(clean, packed=(_packed(0, B), _packed(1, C)))
    [found] = differences(bad)
    assert (found.name, found.side, found.rank, found.kind) == (W13, "rollout", 1, "packed")
    assert found.detail == (
        f"the prepacked buffer rank 1 holds after processing (sha256 {C[:12]}) is not "
        f"vLLM's prepack of what the layer loaded ({B[:12]}): the kernel reads other experts "
        "than were loaded"
    )
    recorded = msgspec.structs.replace(bad, differences=(found,))
    assert violations(recorded) == [f"weights (rollout, TP rank 1): {W13}: packed: {found.detail}"]
    check_weights("weights_rollout.json", recorded, "rollout", Outcome.INVALID_IDENTITY)
    with pytest.raises(SealError) as info:
        check_weights("weights_rollout.json", bad, "rollout", Outcome.PASS)
    assert f"{W13} packed" in info.value.message


def test_a_document_sealed_before_the_packed_read_back_still_decodes() -> None:
    """Runs sealed before the member existed have no ``packed`` key: they decode with none,
    and a document with it round-trips."""
    document = _document(_tensor("x.weight"), packed=(_packed(0, B),))
    data = msgspec.json.encode(document)
    assert decode(data, WeightsDocument) == document
    old = json.loads(data)
    del old["packed"]
    assert decode(json.dumps(old), WeightsDocument).packed == ()
    old["packed"] = [{"layer": "l", "tensor": "w2_weight", "rank": -1, "expected": B, "held": B}]
    with pytest.raises(JSONDocumentError) as info:
        decode(json.dumps(old), WeightsDocument)
    assert "$.packed[0].rank" in str(info.value)


def test_a_refused_side_is_summarised_with_its_reason() -> None:
    document = _document(refused="model.layers.0.mlp is a FusedMoE (fused MoE experts)")
    assert summary(document) == "not checked: model.layers.0.mlp is a FusedMoE (fused MoE experts)"


def test_check_weights_refuses_recorded_differences_the_digests_do_not_show() -> None:
    clean = _document(_tensor("x.weight"))
    check_weights("weights_rollout.json", clean, "rollout", Outcome.PASS)
    tampered = msgspec.structs.replace(clean, tensors=(_tensor("x.weight", side=B),))
    with pytest.raises(SealError) as info:
        check_weights("weights_rollout.json", tampered, "rollout", Outcome.PASS)
    assert info.value.file == "weights_rollout.json"
    assert "1 recomputed, 0 recorded; first: x.weight values" in info.value.message


def test_check_weights_refuses_differences_under_an_outcome_other_than_invalid_identity() -> None:
    bad = _document(_tensor("x.weight", side=B), side="training")
    recorded = msgspec.structs.replace(bad, differences=tuple(differences(bad)))
    check_weights("weights_training.json", recorded, "training", Outcome.INVALID_IDENTITY)
    with pytest.raises(SealError) as info:
        check_weights("weights_training.json", recorded, "training", Outcome.PASS)
    assert info.value.file == "weights_training.json"
    assert "the outcome is PASS, not INVALID_IDENTITY" in info.value.message


def test_check_weights_refuses_the_other_sides_document() -> None:
    with pytest.raises(SealError) as info:
        check_weights("weights_training.json", _document(), "training", Outcome.PASS)
    assert info.value.message == "holds the rollout side's digests, not the training side's"


def test_the_document_decodes_strictly() -> None:
    document = _document(_tensor("x.weight"))
    data = msgspec.json.encode(document)
    assert decode(data, WeightsDocument) == document
    broken = data.replace(b'"side_dtype"', b'"side_dtyp"')
    with pytest.raises(JSONDocumentError):
        decode(broken, WeightsDocument)


# --------------------------------------------------------------------------- verify, end to end


@pytest.fixture(scope="module")
def smoke_run(sealed_s0: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from drift_testing import copy_of_s0

    return copy_of_s0(sealed_s0, tmp_path_factory.mktemp("weights-verify")) / "s0-cpu-smoke"


def _with_weights(smoke_run: Path, tmp_path: Path, document: WeightsDocument, name: str) -> Path:
    """A copy of the smoke run whose baseline attempt also seals ``document`` as ``name`` and
    the other side's document agreeing with the checkpoint, re-sealed as anyone who can write
    an unkeyed run can."""
    from resealing import reseal

    run_dir = tmp_path / "runs" / smoke_run.name
    shutil.copytree(smoke_run, run_dir)
    [attempt] = [
        p.parent
        for p in run_dir.glob("cases/*/*/comparison.json")
        if json.loads(p.read_text())["label"] == "baseline"
    ]
    document = _as_float32(document)  # the smoke run's dtype, which verify checks it against
    (attempt / name).write_bytes(msgspec.json.encode(document))
    reseal(run_dir, attempt / name)
    other = "training" if name == "weights_rollout.json" else "rollout"
    agreeing = msgspec.structs.replace(  # a weight check writes both sides
        document,
        side=other,
        differences=(),
        tensors=tuple(
            msgspec.structs.replace(t, side=t.checkpoint, side_shape=t.shape, side_dtype="float32")
            for t in document.tensors
        ),
    )
    (attempt / f"weights_{other}.json").write_bytes(msgspec.json.encode(agreeing))
    reseal(run_dir, attempt / f"weights_{other}.json")
    return attempt


def _as_float32(document: WeightsDocument) -> WeightsDocument:
    """``document`` declaring and holding float32 where it said bfloat16."""
    return msgspec.structs.replace(
        document,
        dtype="float32",
        tensors=tuple(
            msgspec.structs.replace(t, side_dtype="float32") if t.side_dtype == "bfloat16" else t
            for t in document.tensors
        ),
    )


def _verify(run_dir: Path) -> dict[str, object]:
    from drift_testing import cli

    code, out, _ = cli("verify", run_dir, "--json")
    document: dict[str, object] = json.loads(out)
    document["code"] = code
    return document


def test_verify_accepts_a_sealed_weights_document_that_agrees(
    smoke_run: Path, tmp_path: Path
) -> None:
    attempt = _with_weights(
        smoke_run, tmp_path, _document(_tensor("x.weight")), "weights_rollout.json"
    )
    result = _verify(attempt.parents[2])
    assert result["code"] == 0, result


def test_verify_names_a_tampered_digest_in_a_resealed_weights_document(
    smoke_run: Path, tmp_path: Path
) -> None:
    tampered = _document(_tensor("x.weight", side=B))  # the digest differs, none recorded
    attempt = _with_weights(smoke_run, tmp_path, tampered, "weights_rollout.json")
    result = _verify(attempt.parents[2])
    assert result["code"] == 1
    [entry] = [a for a in result["attempts"] if a["attempt_id"] == attempt.name]  # type: ignore[union-attr]
    assert entry["status"] == "invalid"
    assert entry["file"] == "weights_rollout.json"
    assert "recorded differences disagree with the sealed digests" in entry["detail"]


def test_verify_names_a_tampered_prepacked_digest_in_a_resealed_weights_document(
    smoke_run: Path, tmp_path: Path
) -> None:
    tampered = _document(_tensor("x.weight"), packed=(_packed(0, C),))  # none recorded
    attempt = _with_weights(smoke_run, tmp_path, tampered, "weights_rollout.json")
    result = _verify(attempt.parents[2])
    assert result["code"] == 1
    [entry] = [a for a in result["attempts"] if a["attempt_id"] == attempt.name]  # type: ignore[union-attr]
    assert (entry["status"], entry["file"]) == ("invalid", "weights_rollout.json")
    assert f"{W13} packed" in entry["detail"]


def test_verify_refuses_recorded_differences_on_a_passing_attempt(
    smoke_run: Path, tmp_path: Path
) -> None:
    bad = _document(_tensor("x.weight", side=B), side="training")
    recorded = msgspec.structs.replace(bad, differences=tuple(differences(bad)))
    attempt = _with_weights(smoke_run, tmp_path, recorded, "weights_training.json")
    result = _verify(attempt.parents[2])
    [entry] = [a for a in result["attempts"] if a["attempt_id"] == attempt.name]  # type: ignore[union-attr]
    assert (entry["status"], entry["file"]) == ("invalid", "weights_training.json")
    assert "not INVALID_IDENTITY" in entry["detail"]


def test_verify_names_a_weights_document_of_the_wrong_side(smoke_run: Path, tmp_path: Path) -> None:
    attempt = _with_weights(smoke_run, tmp_path, _document(), "weights_training.json")
    result = _verify(attempt.parents[2])
    [entry] = [a for a in result["attempts"] if a["attempt_id"] == attempt.name]  # type: ignore[union-attr]
    assert (entry["status"], entry["file"]) == ("invalid", "weights_training.json")
    assert entry["detail"] == "holds the rollout side's digests, not the training side's"
