"""A side's weight report decoded once into ``SideReport`` (``runtimes.weights.side_report``):
what the workers or ranks sent, typed; a malformed one is a refused document naming where."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_logprob_drift.runtimes.weights.side_document import side_document
from pytest_logprob_drift.runtimes.weights.side_report import (
    HeldSlice,
    HeldTensor,
    SideReport,
    side_report,
)

PLAIN = {
    "point": "vLLM workers before post-load processing",
    "dtype": "float32",
    "tp_size": 2,
    "seconds": 0.25,
    "tensors": {
        "model.norm.weight": {
            "held": True,
            "shape": [64],
            "dtype": "float32",
            "sha256": "ab" * 32,
            "vllm_name": "model.norm.weight",
            "slices": [
                {"dim": 0, "start": 0, "stop": 64, "sha256": "cd" * 32, "rank": 0},
                {"dim": 0, "start": 0, "stop": 64, "sha256": "cd" * 32, "rank": 1},
            ],
        },
        "model.gone": {"held": False, "vllm_name": "model.gone"},
    },
    "tied": {"lm_head.weight": "model.embed_tokens.weight"},
    "skipped": {"rotary_emb.inv_freq": "recomputed"},
    "extra": {},
    "refused": None,
}


def test_a_plain_report_decodes_into_its_types() -> None:
    report = side_report(PLAIN)
    assert report.error is None and report.tp_size == 2
    norm = report.tensors["model.norm.weight"]
    assert norm.shape == (64,) and norm.sha256 == "ab" * 32
    assert norm.slices[1] == HeldSlice(rank=1, dim=0, start=0, stop=64, sha256="cd" * 32)
    assert report.tensors["model.gone"] == HeldTensor(held=False, vllm_name="model.gone")
    assert report.tied == {"lm_head.weight": "model.embed_tokens.weight"}
    assert side_report(report) is report
    assert side_report({"error": "no push has run"}) == SideReport(error="no push has run")


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"tp_size": 0}, "$.tp_size"),
        ({"tensors": {"x": {"held": True, "slices": [{"dim": 0}]}}}, "$.tensors[...].slices[0]"),
        ({"tensors": {"x": {"held": "yes"}}}, "$.tensors[...].held"),
        ({"tensors": {"x": {"held": True, "shape": [-1]}}}, "$.tensors[...].shape[0]"),
    ],
)
def test_a_malformed_report_is_a_refused_document_naming_where(
    change: dict[str, object], where: str, tmp_path: Path
) -> None:
    report = side_report({**PLAIN, **change})
    assert report.error is not None and where in report.error, report.error
    document = side_document(
        side="rollout",
        runtime="vllm",
        declared_dtype="float32",
        report={**PLAIN, **change},
        model_dir=tmp_path / "never-read",
    )
    assert document.refused == report.error
    assert document.point == PLAIN["point"]
    assert document.tensors == ()
