"""The layer diagnostics' statuses without an engine: a side without a capture, a side that
refuses, a capture of the wrong shape, the vLLM engine's refusal under compiled graphs
(checked before the engine is touched), and with TP > 1 the choice of rank 0's reduction after
every rank's SHA-256 agrees (the real engine loop behind a stand-in ``vllm.LLM``)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from pytest_logprob_drift.execute.layers import layer_diagnostics
from pytest_logprob_drift.execute.protocol import LayersUnavailable
from pytest_logprob_drift.numerics.comparison import LayerDiagnostics, from_builtins
from pytest_logprob_drift.numerics.layer_reduction import (
    reduce_states,
    reduction_sha256,
    stack_reductions,
)
from pytest_logprob_drift.runtimes.vllm.layer_ranks import rank_zero_reduction
from pytest_logprob_drift.tensorio import tensor_bytes, tensors_from_bytes

ACTIVE = torch.tensor([[False, True, True, False], [False, False, True, True]])
ROLLOUT = SimpleNamespace(tensors={"active_mask": ACTIVE})


def _reduction(states: int = 5, scale: float = 1.0) -> dict[str, torch.Tensor]:
    where = ACTIVE[:, 1:].nonzero()
    g = torch.Generator().manual_seed(5)
    return stack_reductions(
        [[reduce_states(scale * torch.randn(len(where), 8, generator=g))] for _ in range(states)],
        where,
    )


class Captures:
    def __init__(self, result: Any) -> None:
        self.result = result

    def capture_layers(self, identity: Any, rollout: Any, *, batch_size: int) -> Any:
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


class NoCapture:
    pass


def test_statuses_per_side_and_figures_only_when_both_captured() -> None:
    both = layer_diagnostics(
        Captures(_reduction(scale=2.0)), Captures(_reduction()), None, ROLLOUT, batch_size=2
    )  # type: ignore[arg-type]
    record = from_builtins(both.entry, LayerDiagnostics)
    assert record.training.captured and record.rollout.captured
    assert record.figures is not None and record.figures.first_unequal_state == "0"
    assert set(both.files) == {"layers_training.pt", "layers_rollout.pt"}
    cases = [
        (NoCapture(), "the rollout engine (NoCapture) has no layer capture"),
        (Captures(LayersUnavailable("compiled graphs")), "compiled graphs"),
        (Captures(_reduction(states=6)), "not comparable with the training's"),
        (Captures({"digests": torch.zeros(1)}), "layer capture failed: expected tensors"),
    ]
    for engine, reason in cases:
        result = layer_diagnostics(engine, Captures(_reduction()), None, ROLLOUT, batch_size=2)  # type: ignore[arg-type]
        record = from_builtins(result.entry, LayerDiagnostics)
        assert record.training.captured and record.figures is None
        assert record.rollout.status == "layers_unavailable"
        assert reason in (record.rollout.reason or ""), record.rollout.reason
        assert set(result.files) == {"layers_training.pt"}


class SaysHow(Captures):
    """A side that says how its capture ran (as the FSDP trainer does)."""

    def layer_capture_evidence(self) -> dict[str, Any]:
        return {"world_size": 2, "ranks_agree": True, "states": 99}


def test_a_side_that_says_how_it_captured_adds_that_to_its_evidence() -> None:
    result = layer_diagnostics(
        Captures(_reduction()), SaysHow(_reduction()), None, ROLLOUT, batch_size=2
    )  # type: ignore[arg-type]
    record = from_builtins(result.entry, LayerDiagnostics)
    assert record.training.evidence == {
        "world_size": 2,
        "ranks_agree": True,
        "states": 5,  # the counts are the reduction's, whatever the side says
        "decoder_layers": 2,
        "positions": 4,
    }
    assert record.rollout.evidence == {"states": 5, "decoder_layers": 2, "positions": 4}


@pytest.mark.slow
def test_the_vllm_engine_refuses_compiled_graphs_before_touching_the_engine() -> None:
    pytest.importorskip("vllm")
    from pytest_logprob_drift.runtimes.vllm.engine import VllmRolloutEngine

    def live() -> None:
        raise AssertionError("the engine must not be used")

    engine = SimpleNamespace(spec=SimpleNamespace(enforce_eager=False), _live=live)
    with pytest.raises(ValueError, match=r"compiled graphs \(enforce_eager=false\)"):
        VllmRolloutEngine.capture_layers(engine, [[1, 2, 3]], [[0, 1]])  # type: ignore[arg-type]


def _figures(medians: dict[str, float]) -> Any:
    from pytest_logprob_drift.numerics.comparison import LayerFigures, LayerStateFigures

    return LayerFigures(
        positions=4,
        states=tuple(
            LayerStateFigures(
                state=state,
                bitwise_equal_share=0.0,
                median_rel_error=value,
                max_rel_error=value,
                median_cosine=1.0,
            )
            for state, value in medians.items()
        ),
        first_unequal_state=None,
    )


def test_drift_enters_at_the_first_state_above_the_baseline_by_more_than_its_floor() -> None:
    from pytest_logprob_drift.diagnostics.layers.attribution import drift_enters

    # dyadic values: every difference below is exact in binary floating point
    reference = _figures({"0": 0.0, "1": 0.125, "2": 0.25, "final_norm": 0.25, "logits": 0.375})
    case = _figures({"0": 0.0, "1": 0.1328125, "2": 0.5, "final_norm": 0.625, "logits": 0.875})
    # no floor (no repeats): any excess counts, an equal state does not
    assert drift_enters(case, reference) == "1"
    # a floor at layer 1 wider than its excess (2**-7) moves the answer to layer 2
    assert drift_enters(case, reference, {"1": 0.015625}) == "2"
    # an excess exactly at the floor is within the noise
    assert drift_enters(case, reference, {"1": 0.015625, "2": 0.25}) == "final_norm"
    wide = dict.fromkeys(("0", "1", "2", "final_norm", "logits"), 1.0)
    assert drift_enters(case, reference, wide) is None
    assert drift_enters(reference, reference) is None
    assert drift_enters(None, reference) is None and drift_enters(case, None) is None
    # a state the reference lacks is not compared
    assert drift_enters(_figures({"7": 1.0, "logits": 0.5}), reference) == "logits"


# ---------------------------------------------------- TP > 1: rank 0 read, ranks checked equal


def _wire(states: int = 4, seed: int = 5) -> dict[str, torch.Tensor]:
    """One sequence's reduction as a worker sends it (``{k}.digests`` ...)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k in range(states):
        d, p, m = reduce_states(torch.randn(3, 8, generator=g))
        out.update({f"{k}.digests": d, f"{k}.projections": p, f"{k}.norms": m})
    return out


def _replies(tensors: list[dict[str, torch.Tensor]]) -> list[dict[str, Any]]:
    """What ``layers_collect`` returns on each rank: rank r reduced ``tensors[r]``."""
    return [
        {
            "tp_rank": rank,
            "tp_size": len(tensors),
            "sha256": reduction_sha256(t),
            "reduction": tensor_bytes(t) if rank == 0 else None,
        }
        for rank, t in enumerate(tensors)
    ]


def test_reduction_sha256_is_of_names_dtypes_shapes_and_bytes() -> None:
    wide = torch.float64
    tensors = {"b": torch.arange(6, dtype=wide).reshape(2, 3), "a": torch.ones(2, dtype=wide)}
    expected = hashlib.sha256()
    for name, t in sorted(tensors.items()):
        expected.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        expected.update(t.numpy().tobytes())
    assert reduction_sha256(tensors) == expected.hexdigest()
    assert reduction_sha256(dict(reversed(tensors.items()))) == expected.hexdigest()
    assert reduction_sha256(tensors_from_bytes(tensor_bytes(tensors))) == expected.hexdigest()
    bit = tensors["a"].clone()
    bit.view(torch.int64)[1] ^= 1  # the last mantissa bit of one element
    flipped = {**tensors, "a": bit}
    assert reduction_sha256(flipped) != expected.hexdigest()  # one bit of one element
    same_bytes = {**tensors, "b": tensors["b"].view(torch.int64)}
    assert reduction_sha256(same_bytes) != expected.hexdigest()  # the dtype counts
    assert reduction_sha256({**tensors, "b": tensors["b"].reshape(3, 2)}) != expected.hexdigest()


def test_rank_zero_reduction_keeps_rank_zero_when_every_rank_agrees() -> None:
    wire = _wire()
    for size in (1, 2, 4):
        replies = _replies([wire] * size)
        kept = rank_zero_reduction(list(reversed(replies)), size, "sequence 0")
        assert set(kept) == set(wire)
        assert all(torch.equal(kept[k], wire[k]) for k in wire)
        assert sum(r["reduction"] is not None for r in replies) == 1  # only rank 0's bytes


def test_rank_zero_reduction_names_the_ranks_that_disagree() -> None:
    wire, other = _wire(), _wire(seed=6)
    replies = _replies([wire, wire, other, wire])
    with pytest.raises(ValueError, match=r"sequence 3: the TP ranks' layer states differ") as exc:
        rank_zero_reduction(replies, 4, "sequence 3")
    message = str(exc.value)
    assert "rank 0 " + reduction_sha256(wire)[:12] in message
    assert "rank 2 " + reduction_sha256(other)[:12] in message
    assert "rank 1" not in message and "rank 3" not in message


def test_rank_zero_reduction_refuses_malformed_replies() -> None:
    wire = _wire()
    two = _replies([wire, wire])
    tampered = dict(two[0], reduction=tensor_bytes(_wire(seed=7)))
    cases: list[tuple[list[Any], str]] = [
        (two[:1], r"one reply from each TP rank 0\.\.1, got ranks \[0\]"),
        ([two[0], two[0]], r"got ranks \[0, 0\]"),
        ([two[0], dict(two[1], tp_size=4)], r"TP sizes \[2, 4\], not 2"),
        ([two[0], dict(two[1], reduction=tensor_bytes(wire))], r"TP ranks \[0, 1\] sent"),
        ([dict(two[0], reduction=None), two[1]], r"TP ranks \[\] sent"),
        ([tampered, two[1]], "does not hash to the SHA-256 it sent"),
        ([dict(two[0], reduction=b"not a tensor file"), two[1]], "reduction is unreadable"),
        ([b"bytes", two[1]], "worker reply 0 is not a layers_collect reply"),
        ([two[0], dict(two[1], tp_rank="1")], "worker reply 1 has a malformed"),
        ([dict(two[0], reduction="text"), two[1]], "sent a reduction that is not bytes"),
    ]
    for replies, message in cases:
        with pytest.raises(ValueError, match=message):
            rank_zero_reduction(replies, 2, "sequence 0")


class _FakeLLM:
    """Stands in for ``vllm.LLM`` behind the real ``VllmRolloutEngine.capture_layers`` loop:
    ``collective_rpc`` answers like ``tp`` workers, rank ``bad`` reducing other states."""

    def __init__(self, tp: int, bad: int | None = None) -> None:
        self.tp, self.bad = tp, bad
        cache = SimpleNamespace(enable_prefix_caching=False)
        self.llm_engine = SimpleNamespace(vllm_config=SimpleNamespace(cache_config=cache))

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        if method == "layers_arm":
            return [1] * self.tp  # one decoder layer: 4 states
        assert method == "layers_collect"
        return _replies([_wire(seed=6 if rank == self.bad else 5) for rank in range(self.tp)])

    def generate(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []


def _vllm_rollout(llm: _FakeLLM) -> Any:
    from pytest_logprob_drift.runtimes.vllm.adapter import VllmRollout
    from pytest_logprob_drift.runtimes.vllm.engine import VllmRolloutEngine

    engine = object.__new__(VllmRolloutEngine)
    engine.spec = SimpleNamespace(enforce_eager=True, tensor_parallel_size=llm.tp)  # type: ignore[assignment]
    engine._live = lambda: llm  # type: ignore[method-assign]
    rollout = object.__new__(VllmRollout)
    rollout.engine = engine
    rollout._layer_evidence = {}
    return rollout


@pytest.mark.slow
def test_the_rollout_record_says_which_rank_was_read_or_which_ranks_disagree() -> None:
    pytest.importorskip("vllm")
    batch = {
        "token_ids": torch.tensor([[7, 8, 9, 10], [7, 8, 9, 10]]),
        "attention_mask": torch.ones(2, 4, dtype=torch.bool),
        "active_mask": torch.tensor([[False, True, True, True], [False, True, True, True]]),
    }
    rollout = SimpleNamespace(tensors=batch)
    where = batch["active_mask"][:, 1:].nonzero()

    def training() -> Captures:
        g = torch.Generator().manual_seed(5)
        return Captures(
            stack_reductions(
                [[reduce_states(torch.randn(len(where), 8, generator=g))] for _ in range(4)],
                where,
            )
        )

    agreed = layer_diagnostics(_vllm_rollout(_FakeLLM(2)), training(), None, rollout, batch_size=2)  # type: ignore[arg-type]
    record = from_builtins(agreed.entry, LayerDiagnostics)
    assert record.rollout.captured and record.rollout.evidence is not None
    assert {k: record.rollout.evidence[k] for k in ("tensor_parallel_size", "read_rank")} == {
        "tensor_parallel_size": 2,
        "read_rank": 0,
    }
    assert record.rollout.evidence["ranks_agree"] is True
    assert record.rollout.evidence["states"] == 4 and record.rollout.evidence["positions"] == 6
    assert "tensor_parallel_size" not in (record.training.evidence or {})
    engine = _vllm_rollout(_FakeLLM(2, bad=1))
    split = layer_diagnostics(engine, training(), None, rollout, batch_size=2)  # type: ignore[arg-type]
    record = from_builtins(split.entry, LayerDiagnostics)
    assert record.rollout.status == "layers_unavailable" and record.training.captured
    assert "layer capture of sequence 0: the TP ranks' layer states differ" in (
        record.rollout.reason or ""
    )
    assert "rank 1 " in (record.rollout.reason or "") and record.figures is None
    assert set(split.files) == {"layers_training.pt"}
    assert engine.layer_capture_evidence() == {}  # nothing left over from a refused capture


def test_the_engine_and_the_rank_check_import_neither_torch_nor_vllm() -> None:
    code = (
        "import sys\n"
        "import pytest_logprob_drift.runtimes.vllm.engine\n"
        "import pytest_logprob_drift.runtimes.vllm.layer_ranks\n"
        "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
