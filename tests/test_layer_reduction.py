"""numerics.layer_reduction against exact float64 recomputations written here, and the strict
reading of comparison.json's ``diagnostics.layers``."""

from __future__ import annotations

import hashlib

import pytest
import torch

from pytest_logprob_drift.numerics.comparison import (
    Diagnostics,
    LayerDiagnostics,
    from_builtins,
)
from pytest_logprob_drift.numerics.layer_reduction import (
    DIGEST_BYTES,
    PROJECTION_DIM,
    RELATIVE_ERROR_BAND,
    check_reduction,
    compare,
    projection_matrix,
    reduce_states,
    relative_errors,
    stack_reductions,
    state_digests,
    state_names,
)
from pytest_logprob_drift.store.decode import JSONDocumentError, decode
from pytest_logprob_drift.store.files import json_bytes


def _side(states: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    n = states[0].shape[0]
    positions = torch.stack([torch.zeros(n, dtype=torch.long), torch.arange(n)], dim=1)
    return stack_reductions([[reduce_states(s)] for s in states], positions)


def test_digests_are_sha256_of_the_dtype_and_the_bytes() -> None:
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(1))
    got = state_digests(x)
    for i in range(5):
        want = hashlib.sha256(b"torch.float32\0" + x[i].numpy().tobytes()).digest()
        assert bytes(got[i].tolist()) == want[:DIGEST_BYTES]
    y = x.clone()
    y[2, 3] = torch.nextafter(y[2, 3], torch.tensor(float("inf")))  # one ulp, one row
    same = (state_digests(y) == got).all(-1)
    assert same.tolist() == [True, True, False, True, True]
    assert not (state_digests(x.bfloat16()) == state_digests(x.bfloat16().float())).all(-1).any()


def test_norms_exact_and_projection_fixed() -> None:
    x = torch.randn(9, 128, generator=torch.Generator().manual_seed(2)).bfloat16()
    _d, projected, norms = reduce_states(x)
    exact = torch.tensor(
        [sum(float(v) ** 2 for v in row) ** 0.5 for row in x.double()], dtype=torch.float64
    )
    assert torch.allclose(norms, exact, rtol=1e-14, atol=0)
    assert torch.equal(projection_matrix(128), projection_matrix(128))
    assert projection_matrix(128).shape == (128, PROJECTION_DIM)
    assert torch.equal(projected, x.double() @ projection_matrix(128))


@pytest.mark.parametrize("width", [128, 1024, 4096])
def test_projected_relative_error_is_within_the_stated_band(width: int) -> None:
    """Estimated / exact relative error over many positions and kinds of difference:
    >= 99.5% inside RELATIVE_ERROR_BAND, all within a factor 2, medians near 1."""
    g = torch.Generator().manual_seed(width)
    a = torch.randn(600, width, generator=g, dtype=torch.float64)
    kinds = [
        a.float().bfloat16().double(),  # bf16 rounding
        a + 1e-3 * torch.randn(600, width, generator=g, dtype=torch.float64),
        a * (1 + 1e-2 * torch.rand(600, 1, generator=g, dtype=torch.float64)),
    ]
    spike = a.clone()
    spike[torch.arange(600), torch.randint(0, width, (600,), generator=g)] += 0.5
    kinds.append(spike)
    ref = _side([a, a, a, a])
    for b in kinds:
        exact = torch.linalg.vector_norm(a - b, dim=-1) / torch.linalg.vector_norm(a, dim=-1)
        est = relative_errors(ref, _side([b, b, b, b]))[0]
        ratio = est / exact
        low, high = RELATIVE_ERROR_BAND
        assert float(((ratio >= low) & (ratio <= high)).double().mean()) >= 0.995
        assert float(ratio.min()) > 0.5 and float(ratio.max()) < 2.0
        assert 0.9 < float(ratio.median()) < 1.1


def test_compare_finds_the_first_unequal_state_and_reads_back_strictly() -> None:
    g = torch.Generator().manual_seed(3)
    states = [torch.randn(6, 32, generator=g) for _ in range(5)]  # 2 layers: 0,1,2,norm,logits
    moved = [s.clone() for s in states]
    moved[2][4, 0] += 1e-3  # after layer 2, one position
    for k in (3, 4):
        moved[k] = moved[k] * 1.01
    ref, other = _side(states), _side(moved)
    same = compare(ref, _side(states))
    assert same["first_unequal_state"] is None
    for r in same["states"]:
        assert r["bitwise_equal_share"] == 1.0 and r["max_rel_error"] == 0.0
    figures = compare(ref, other)
    assert [r["state"] for r in figures["states"]] == list(state_names(2))
    assert figures["first_unequal_state"] == "2"
    row = figures["states"][2]
    assert row["bitwise_equal_share"] == 5 / 6 and row["median_rel_error"] == 0.0
    exact = float((states[2][4] - moved[2][4]).double().norm() / states[2][4].double().norm())
    assert RELATIVE_ERROR_BAND[0] * exact <= row["max_rel_error"] <= RELATIVE_ERROR_BAND[1] * exact
    assert figures["states"][4]["bitwise_equal_share"] == 0.0
    entry = {
        "training": {"status": "layers_captured", "evidence": {"states": 5}},
        "rollout": {"status": "layers_unavailable", "reason": "no capture"},
        "reduction": {"projection_dim": 64, "projection_seed": 1, "digest_bytes": 16},
        "figures": figures,
    }
    record = from_builtins(entry, LayerDiagnostics)
    assert record.to_json() == entry
    assert from_builtins({"layers": entry}, Diagnostics).layers == record
    for bad, where in (
        ({**entry, "extra": 1}, "$.layers: Object contains unknown field `extra`"),
        (
            {**entry, "training": {"status": "layers_maybe", "reason": "x"}},
            "$.layers.training.status: Invalid enum value 'layers_maybe'",
        ),
        (
            {**entry, "figures": {**figures, "first_unequal_state": "7"}},
            "$.layers.figures: first_unequal_state names no state: '7'",
        ),
        (
            {**entry, "figures": {**figures, "positions": -1}},
            "$.layers.figures.positions: Expected `int` >= 0",
        ),
        (
            {**entry, "rollout": {"status": "layers_unavailable"}},
            "$.layers.rollout: layers_unavailable has no reason",
        ),
        (
            {**entry, "reduction": {"projection_dim": 64, "projection_seed": 1}},
            "$.layers.reduction: Object missing required field `digest_bytes`",
        ),
        (
            {**entry, "reduction": {**entry["reduction"], "projection_dim": 0}},
            "$.layers.reduction.projection_dim: Expected `int` >= 1",
        ),
        (
            {**entry, "reduction": {**entry["reduction"], "positions_per_row": 0}},
            "$.layers.reduction.positions_per_row: Expected `int` >= 1",
        ),
    ):
        with pytest.raises(JSONDocumentError) as refused:
            decode(json_bytes({"layers": bad}), Diagnostics)
        assert str(refused.value).startswith(where)


def test_check_reduction_refuses_malformed_sides() -> None:
    good = _side([torch.randn(3, 8) for _ in range(4)])
    check_reduction(good)
    for key, value, match in (
        ("digests", good["digests"].long(), "uint8"),
        ("norms", good["norms"][:, :2], "norms"),
        ("positions", good["positions"][:, :1], "positions"),
        ("projections", good["projections"].float(), "float64"),
    ):
        with pytest.raises(ValueError, match=match):
            check_reduction({**good, key: value})
    with pytest.raises(ValueError, match="expected tensors"):
        check_reduction({k: v for k, v in good.items() if k != "norms"})
    nan = good["projections"].clone()
    nan[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        check_reduction({**good, "projections": nan})
    with pytest.raises(ValueError, match="different positions"):
        compare(good, {**good, "positions": good["positions"] + 1})


def test_stacking_refuses_a_state_with_another_position_count() -> None:
    chunk = reduce_states(torch.randn(3, 8))
    where = torch.zeros((3, 2), dtype=torch.long)
    for per_state in ([[chunk]] * 3 + [[chunk, chunk]], [[chunk]] * 3 + [[]]):
        with pytest.raises(ValueError, match="captured positions, expected 3"):
            stack_reductions([list(c) for c in per_state], where)
    stacked = stack_reductions([[chunk] for _ in range(4)], where)
    assert stacked["digests"].shape == (4, 3, DIGEST_BYTES)
    assert torch.equal(stacked["projections"][2], chunk[1])


def test_text_lines_and_junit_properties() -> None:
    from pytest_logprob_drift.diagnostics.layers import text as layer_text
    from pytest_logprob_drift.plugin.reporting import diagnostic_properties

    g = torch.Generator().manual_seed(4)
    states = [torch.randn(4, 16, generator=g) for _ in range(5)]
    moved = [*states[:1], *(s + 0.01 for s in states[1:])]
    figures = compare(_side(states), _side(moved))
    entry = {
        "training": {"status": "layers_captured", "evidence": {"states": 5}},
        "rollout": {"status": "layers_unavailable", "reason": "no hooks here"},
        "reduction": {"projection_dim": 64, "projection_seed": 1, "digest_bytes": 16},
        "figures": figures,
    }
    diagnostics = from_builtins({"layers": entry}, Diagnostics)
    (line, status) = layer_text.lines(diagnostics)
    assert line.startswith("layers: rollout vs training states first differ at layer 1;")
    assert f"logits {figures['states'][-1]['max_rel_error']:.3g}" in line
    assert "embeddings 0" in line and "final norm" in line
    assert status == "layers (rollout): layers_unavailable (no hooks here)"
    props = dict(layer_text.properties(diagnostics))
    assert props["drift_layers_training_status"] == "layers_captured"
    assert props["drift_layers_rollout_reason"] == "no hooks here"
    assert props["drift_layers_first_unequal_state"] == "1"
    assert (
        float(props["drift_layers_logits_max_rel_error"]) == figures["states"][-1]["max_rel_error"]
    )
    assert set(layer_text.properties(diagnostics)) <= set(diagnostic_properties(diagnostics))
    assert layer_text.lines(Diagnostics()) == layer_text.properties(None) == []
