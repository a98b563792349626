"""The layer diagnostics' statuses without an engine: a side without a capture, a side that
refuses, a capture of the wrong shape, and the vLLM engine's refusal under compiled graphs
(checked before the engine is touched)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from pytest_logprob_drift.execute.layers import layer_diagnostics
from pytest_logprob_drift.execute.protocol import LayersUnavailable
from pytest_logprob_drift.numerics.comparison import read_layers
from pytest_logprob_drift.numerics.layer_reduction import reduce_states, stack_reductions

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
    record = read_layers(both.entry)
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
        record = read_layers(result.entry)
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
    record = read_layers(result.entry)
    assert record.training.evidence == {
        "world_size": 2,
        "ranks_agree": True,
        "states": 5,  # the counts are the reduction's, whatever the side says
        "decoder_layers": 2,
        "positions": 4,
    }
    assert record.rollout.evidence == {"states": 5, "decoder_layers": 2, "positions": 4}


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
    from pytest_logprob_drift.attribution.layers import drift_enters

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
