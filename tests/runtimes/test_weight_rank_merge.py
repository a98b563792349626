"""Merging the vLLM workers' weight reports (``vllm_layout.merge_ranks``, ``overlay``) into one
typed ``SideReport``: checked against the plain-dict merge written here and decoded with
``msgspec.convert`` (the form the reports had before they were typed), and on every error
path. No engine: the rank reports are the plain values a worker sends back."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from pytest_logprob_drift.runtimes.weights.side_report import SideReport
from pytest_logprob_drift.runtimes.weights.vllm_layout import merge_ranks, overlay


def _rank(rank: int, *, seconds: float, refused: str | None = None) -> Any:
    """A TP-2 rank's report: ``a`` split by rows (rank 0 has the whole digest), ``b`` held
    whole by rank 0 only, ``c`` not held anywhere."""
    return {
        "tp_rank": rank,
        "tp_size": 2,
        "point": "load",
        "dtype": "bfloat16",
        "tensors": {
            "a": {
                "held": True,
                "vllm_name": "model.a",
                "dtype": "bfloat16",
                "slice": {"dim": 0, "start": 4 * rank, "stop": 4 * rank + 4, "sha256": f"s{rank}"},
                "shape": [8, 3] if rank == 0 else None,
                "sha256": "whole-a" if rank == 0 else None,
            },
            "b": (
                {
                    "held": True,
                    "vllm_name": "model.b",
                    "dtype": "float32",
                    "slice": {"dim": 0, "start": 0, "stop": 2, "sha256": "sb"},
                    "shape": [2],
                    "sha256": "whole-b",
                }
                if rank == 0
                else {"held": False, "vllm_name": "model.b"}
            ),
            "c": {"held": False, "vllm_name": "model.c"},
        },
        "tied": {"lm_head.weight": "a"} if rank == 0 else {},
        "skipped": {"inv_freq": "recomputed"},
        "extra": {"model.x": "no source"},
        "refused": refused,
        "seconds": seconds,
    }


def _dict_merge(reports: list[Any]) -> dict[str, Any]:
    """The merge as plain dictionaries (the untyped form, written out here)."""
    ordered = sorted(reports, key=lambda r: r["tp_rank"])
    head = ordered[0]
    tensors = {}
    for name, entry in head["tensors"].items():
        merged = {k: v for k, v in entry.items() if k != "slice"}
        merged["slices"] = [
            {**r["tensors"][name]["slice"], "rank": r["tp_rank"]}
            for r in ordered
            if r["tensors"].get(name, {}).get("held")
        ]
        tensors[name] = merged
    return {
        "point": head["point"],
        "dtype": head["dtype"],
        "tp_size": len(ordered),
        "seconds": max(r["seconds"] for r in ordered),
        "tensors": tensors,
        "tied": head["tied"],
        "skipped": head["skipped"],
        "extra": head["extra"],
        "refused": next((r["refused"] for r in ordered if r["refused"]), None),
    }


def test_the_typed_merge_equals_the_plain_merge_decoded() -> None:
    reports = [_rank(1, seconds=0.5, refused="quantized"), _rank(0, seconds=0.25)]
    merged = merge_ranks(reports)
    assert merged == msgspec.convert(_dict_merge(reports), SideReport)
    a = merged.tensors["a"]
    assert (a.shape, a.sha256, a.vllm_name) == ((8, 3), "whole-a", "model.a")
    assert [(s.rank, s.start, s.stop, s.sha256) for s in a.slices] == [
        (0, 0, 4, "s0"),
        (1, 4, 8, "s1"),
    ]
    assert [s.rank for s in merged.tensors["b"].slices] == [0]
    assert merged.tensors["c"].held is False and merged.tensors["c"].slices == ()
    assert (merged.seconds, merged.refused, merged.tp_size) == (0.5, "quantized", 2)
    assert merged.tied == {"lm_head.weight": "a"}


def test_ranks_that_are_not_one_group_are_refused() -> None:
    with pytest.raises(RuntimeError, match=r"ranks \[0\]"):
        merge_ranks([_rank(0, seconds=0.1)])  # tp_size 2, one rank


def test_overlay_takes_what_the_live_model_holds_readably() -> None:
    loaded = merge_ranks([_rank(0, seconds=0.1), _rank(1, seconds=0.1)])
    live_reports = [_rank(0, seconds=0.2), _rank(1, seconds=0.2)]
    live_reports[0]["tensors"]["a"]["sha256"] = "live-a"
    live_reports[0]["tensors"]["b"] = {"held": False, "vllm_name": "model.b"}  # packed away
    live = merge_ranks(live_reports)
    both = overlay(loaded, live)
    assert both.tensors["a"].sha256 == "live-a"
    assert both.tensors["b"] == loaded.tensors["b"]  # not readable live: as loaded
    assert both.point.startswith("load; re-read from the live model")
    assert both.error is None


def test_overlay_of_an_error_is_that_error() -> None:
    loaded = merge_ranks([_rank(0, seconds=0.1), _rank(1, seconds=0.1)])
    failed = SideReport(error="no push was digested")
    assert overlay(loaded, failed) == SideReport(error="no push was digested")
    assert overlay(failed, loaded) == SideReport(error="no push was digested")


def test_the_ranks_declarations_are_merged_and_must_agree() -> None:
    """``declared`` (each rank's per-tensor dtypes, from construction) is the union over the
    ranks; a report without the member (from before it) declares nothing; two ranks declaring
    one tensor differently are refused; the overlay keeps the load's declarations."""
    reports = [_rank(0, seconds=0.1), _rank(1, seconds=0.1)]
    assert merge_ranks(reports).declared == {}
    reports[0]["declared"] = {"b": "float32"}
    reports[1]["declared"] = {"a": "float32"}
    merged = merge_ranks(reports)
    assert merged.declared == {"a": "float32", "b": "float32"}
    assert overlay(
        merged, merge_ranks([_rank(0, seconds=0.2), _rank(1, seconds=0.2)])
    ).declared == {
        "a": "float32",
        "b": "float32",
    }
    reports[1]["declared"] = {"b": "bfloat16"}
    with pytest.raises(RuntimeError, match="b: TP rank 1 declares bfloat16, another rank float32"):
        merge_ranks(reports)
