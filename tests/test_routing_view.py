"""The routing view (``numerics.routing``) against a numpy recompute written here, on random
routings with planted flips and unrouted positions; the checks of a side's sealed routing;
placing the rollout's per-request capture on the batch's grid (``routing_rows``), with its
error paths; and the config's opt-in ``diagnostics.routing``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from drift_testing import cli, experiment_config

from pytest_logprob_drift.numerics.routing import check_routing, figures
from pytest_logprob_drift.runtimes.vllm.routing_rows import on_grid


def _routing(rng: np.random.Generator, rows: int, width: int, layers: int) -> np.ndarray:
    ids = np.stack(
        [np.sort(rng.choice(4, size=2, replace=False)) for _ in range(rows * width * layers)]
    )
    return ids.reshape(rows, width, layers, 2).astype(np.int64)


def _numpy_view(a, b, attention, active, diff, threshold):
    rows, width, layers, _ = a.shape
    routed = (a[..., 0, 0] >= 0) & (b[..., 0, 0] >= 0) & attention
    agreement = []
    for k in range(layers):
        same = [
            bool((a[r, p, k] == b[r, p, k]).all())
            for r in range(rows)
            for p in range(width)
            if routed[r, p]
        ]
        agreement.append(sum(same) / len(same))
    flipped = np.zeros((rows, width), dtype=bool)
    for r in range(rows):
        for p in range(width):
            if routed[r, p]:
                flipped[r, p] = any(not (a[r, p, k] == b[r, p, k]).all() for k in range(layers))
    classes: dict[str, list[float]] = {"flip": [], "no_flip": [], "unknown": []}
    for r in range(rows):
        for t in range(width):
            if not active[r, t]:
                continue
            before = [p for p in range(t) if attention[r, p]]
            if any(not routed[r, p] for p in before):
                classes["unknown"].append(diff[r, t])
            elif any(flipped[r, p] for p in before):
                classes["flip"].append(diff[r, t])
            else:
                classes["no_flip"].append(diff[r, t])
    return agreement, flipped[routed].mean(), classes


def test_figures_equal_a_numpy_recompute() -> None:
    rng = np.random.default_rng(54)
    rows, width, layers = 5, 11, 3
    a = _routing(rng, rows, width, layers)
    b = a.copy()
    flips = rng.random((rows, width, layers)) < 0.15
    b[flips] = np.sort((b[flips] + 1) % 4, axis=-1)
    lengths = np.array([11, 7, 9, 4, 11])
    attention = np.arange(width)[None, :] < lengths[:, None]
    active = attention & (np.arange(width)[None, :] >= 3)
    a[~attention] = -1
    b[~attention] = -1
    b[1, 2] = -1  # a prompt token the rollout served from its prefix cache
    b[np.arange(rows), lengths - 1] = -1  # the last sampled token is never an input
    training = rng.normal(-2.0, 1.0, (rows, width))
    rollout = training + rng.normal(0.0, 2e-3, (rows, width))
    threshold = 1e-3
    view = figures(
        {"expert_ids": torch.from_numpy(a), "gate_weights": torch.zeros(a.shape)},
        {"expert_ids": torch.from_numpy(b), "gate_weights": torch.zeros(b.shape)},
        attention_mask=torch.from_numpy(attention),
        active_mask=torch.from_numpy(active),
        training_logprobs=torch.from_numpy(training).float(),
        rollout_logprobs=torch.from_numpy(rollout).float(),
        threshold=threshold,
    )
    diff = np.abs(
        torch.from_numpy(training).float().double().numpy()
        - torch.from_numpy(rollout).float().double().numpy()
    )
    agreement, flip_share, classes = _numpy_view(a, b, attention, active, diff, threshold)
    assert view["agreement_by_layer"] == pytest.approx(agreement, abs=1e-12)
    assert view["flip_share"] == pytest.approx(flip_share, abs=1e-12)
    assert 0 < flip_share < 1
    for name, values in classes.items():
        got = view["drift"][name]
        assert got["tokens"] == len(values), name
        if values:
            assert got["mismatch_share"] == pytest.approx(np.mean(np.array(values) > threshold))
            assert got["mean_abs_diff"] == pytest.approx(np.mean(values))
            assert got["max_abs_diff"] == pytest.approx(np.max(values))
    assert classes["unknown"] and classes["flip"]  # row 1 after its cached position
    worst = view["worst"][0]
    flat = np.where(active, diff, -1.0)
    r, t = np.unravel_index(np.argmax(flat), flat.shape)
    assert (worst["row"], worst["position"]) == (r, t)
    if worst["routing"] == "flip":
        p = worst["first_flip_position"]
        assert p < t and not (a[r, p] == b[r, p]).all()
        first = next(k for k in range(layers) if not (a[r, p, k] == b[r, p, k]).all())
        assert worst["first_flip_layer"] == first


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({"expert_ids": torch.zeros(2, 3, 1, 2, dtype=torch.long)}, "expected"),
        (
            {
                "expert_ids": torch.zeros(2, 3, 1, 2, dtype=torch.int32),
                "gate_weights": torch.zeros(2, 3, 1, 2),
            },
            "int64 and float32",
        ),
        (
            {
                "expert_ids": torch.zeros(2, 4, 1, 2, dtype=torch.long),
                "gate_weights": torch.zeros(2, 4, 1, 2),
            },
            "grid",
        ),
        (
            {
                "expert_ids": torch.tensor([[[[1, 1]], [[0, 1]], [[0, 1]]]] * 2),
                "gate_weights": torch.zeros(2, 3, 1, 2),
            },
            "ascending",
        ),
        (
            {
                "expert_ids": torch.tensor([[[[-1, -1]], [[0, 1]], [[0, -1]]]] * 2),
                "gate_weights": torch.zeros(2, 3, 1, 2),
            },
            "some layers only|ascending",
        ),
        (
            {
                "expert_ids": torch.tensor([[[[0, 1]], [[0, 1]], [[0, 1]]]] * 2),
                "gate_weights": torch.full((2, 3, 1, 2), float("nan")),
            },
            "non-finite",
        ),
    ],
)
def test_a_malformed_routing_is_named(tensors: dict[str, torch.Tensor], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_routing(tensors, (2, 3))


def _request(positions: list[int], tokens: list[int], expert: int) -> dict[str, torch.Tensor]:
    n = len(positions)
    return {
        "positions": torch.tensor(positions),
        "tokens": torch.tensor(tokens),
        "expert_ids": torch.full((n, 1, 2), expert, dtype=torch.long),
        "gate_weights": torch.full((n, 1, 2), 0.5),
    }


def _captured(*requests: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"{n}.{k}": v for n, r in enumerate(requests) for k, v in r.items()}


def test_requests_land_on_their_rows_by_tokens() -> None:
    token_ids = torch.tensor([[5, 6, 7, 8], [5, 6, 9, 0], [5, 6, 7, 8]])
    attention = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]])
    captured = _captured(
        _request([0, 1], [5, 6], 2),  # row 1 (last position 1 = length 3 - 2)
        _request([2], [7], 3),  # a cached prefix: only position 2 routed; row 0 or 2
        _request([0, 1, 2], [5, 6, 7], 1),
    )
    ids, weights = on_grid(captured, token_ids, attention, moe_layers=1, top_k=2)
    assert ids[1, :, 0, 0].tolist() == [2, 2, -1, -1]
    assert ids[0, :, 0, 0].tolist() == [-1, -1, 3, -1]  # identical rows: taken in order
    assert ids[2, :, 0, 0].tolist() == [1, 1, 1, -1]
    assert float(weights[2, 0, 0, 0]) == 0.5 and float(weights[2, 3, 0, 0]) == 0.0


def test_a_request_or_row_without_its_match_is_an_error() -> None:
    token_ids = torch.tensor([[5, 6, 7, 8]])
    attention = torch.ones(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="matches no row"):
        on_grid(
            _captured(_request([0, 1, 2], [5, 6, 9], 1)),
            token_ids,
            attention,
            moe_layers=1,
            top_k=2,
        )
    with pytest.raises(ValueError, match=r"rows \[0\] of the batch match no captured request"):
        on_grid({}, token_ids, attention, moe_layers=1, top_k=2)
    with pytest.raises(ValueError, match="expected"):
        on_grid(
            _captured(_request([0, 1, 2], [5, 6, 7], 1)),
            token_ids,
            attention,
            moe_layers=2,
            top_k=2,
        )


def test_diagnostics_routing_must_be_a_boolean(tmp_path: Path) -> None:
    config = experiment_config(
        tmp_path,
        "cross_config_s1_vllm_cpu_moe_bf16.json",
        {"diagnostics.routing": "yes"},
    )
    code, _out, err = cli("plan", config)
    assert code == 2
    assert "$.diagnostics.routing" in err and "a boolean" in err
    assert "Traceback" not in err
    shipped = json.loads(
        (
            Path(__file__).parents[1] / "experiments/cross_config_s1_vllm_cpu_moe_bf16.json"
        ).read_text()
    )
    assert shipped["diagnostics"] == {"routing": True}
