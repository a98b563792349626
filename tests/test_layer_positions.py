"""The object form of ``diagnostics.layers`` (issue 23): ``{"positions_per_row": k}`` picks the
positions both sides capture. The config's errors, the plan (not in case ids, in the
execution key), and ``capture_mask`` against subsets written out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from drift_testing import S0, experiment_config

from pytest_logprob_drift import ConfigError, plan_file
from pytest_logprob_drift.numerics.comparison import LayerDiagnostics, from_builtins
from pytest_logprob_drift.numerics.layer_reduction import capture_mask
from pytest_logprob_drift.records import LayerSpec
from pytest_logprob_drift.store.decode import JSONDocumentError, decode
from pytest_logprob_drift.store.files import json_bytes


def _config(work: Path, diagnostics: object | None, name: str = "config.json") -> str:
    changes = {} if diagnostics is None else {"diagnostics": diagnostics}
    return str(experiment_config(work, S0, changes, file_name=name))


def test_true_and_the_object_form_plan_the_same_cases(tmp_path: Path) -> None:
    without = plan_file(_config(tmp_path, None, "a.json"))
    on = plan_file(_config(tmp_path, {"layers": True}, "b.json"))
    some = plan_file(_config(tmp_path, {"layers": {"positions_per_row": 3}}, "c.json"))
    every = plan_file(_config(tmp_path, {"layers": {}}, "d.json"))
    off = plan_file(_config(tmp_path, {"layers": False}, "e.json"))
    ids = [c.case.case_id for c in without.cases]
    assert ids  # a non-empty plan
    for plan in (on, some, every, off):
        assert [c.case.case_id for c in plan.cases] == ids
    assert without.plan.layers is None and off.plan.layers is None
    assert on.plan.layers == LayerSpec() == every.plan.layers
    assert some.plan.layers == LayerSpec(positions_per_row=3)


@pytest.mark.parametrize(
    ("layers", "where", "what"),
    [
        (1, "$.diagnostics.layers", "expected a boolean or an object, got"),
        ("yes", "$.diagnostics.layers", "expected a boolean or an object, got"),
        ({"positions_per_row": 0}, "$.diagnostics.layers.positions_per_row", "positive integer"),
        ({"positions_per_row": True}, "$.diagnostics.layers.positions_per_row", "positive integer"),
        ({"positions_per_row": 2.5}, "$.diagnostics.layers.positions_per_row", "positive integer"),
        ({"positions_per_row": 1 << 21}, "$.diagnostics.layers.positions_per_row", "up to"),
        ({"positions": 3}, "$.diagnostics.layers.positions", "unknown"),
    ],
)
def test_a_bad_layers_value_is_one_error_naming_its_path(
    tmp_path: Path, layers: object, where: str, what: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        plan_file(_config(tmp_path, {"layers": layers}))
    text = str(caught.value)
    assert where in text and what in text, text


def test_the_cli_says_the_error_with_exit_code_2(tmp_path: Path) -> None:
    from drift_testing import cli

    code, out, err = cli("plan", _config(tmp_path, {"layers": {"positions_per_row": -1}}))
    assert code == 2
    assert "$.diagnostics.layers.positions_per_row" in err and "Traceback" not in err + out


def test_capture_mask_against_subsets_written_out() -> None:
    active = torch.zeros((4, 12), dtype=torch.bool)
    active[0, 2:12] = True  # 10 active tokens at 2..11
    active[1, [3, 5, 6]] = True  # 3 active tokens
    active[2, 4:9] = True  # 5 active tokens at 4..8
    # row 3: none
    picked = capture_mask(active, 4)
    # 10 tokens, k=4: indices 0, 3, 6, 9 -> tokens 2, 5, 8, 11
    assert picked[0].nonzero().flatten().tolist() == [2, 5, 8, 11]
    assert picked[1].nonzero().flatten().tolist() == [3, 5, 6]  # fewer than k: all
    # 5 tokens, k=4: indices 0, 1, 2, 4 -> tokens 4, 5, 6, 8
    assert picked[2].nonzero().flatten().tolist() == [4, 5, 6, 8]
    assert not picked[3].any()
    assert capture_mask(active, 1)[0].nonzero().flatten().tolist() == [11]  # the last
    assert capture_mask(active, 2)[2].nonzero().flatten().tolist() == [4, 8]
    assert capture_mask(active, None) is active
    assert picked.dtype == active.dtype and picked.shape == active.shape
    with pytest.raises(ValueError, match="positions_per_row must be >= 1"):
        capture_mask(active, 0)


def test_capture_mask_is_a_subset_with_first_and_last_kept() -> None:
    generator = torch.Generator().manual_seed(7)
    active = torch.rand((16, 40), generator=generator) < 0.6
    for k in range(1, 12):
        picked = capture_mask(active, k)
        assert not (picked & ~active).any()
        for row in range(16):
            mine = active[row].nonzero().flatten().tolist()
            got = picked[row].nonzero().flatten().tolist()
            assert len(got) == min(len(mine), k)
            if mine and k >= 2:
                assert got[0] == mine[0] and got[-1] == mine[-1]


def test_the_reduction_may_name_its_positions_per_row() -> None:
    entry = {
        "training": {"status": "layers_unavailable", "reason": "x"},
        "rollout": {"status": "layers_unavailable", "reason": "y"},
        "reduction": {
            "projection_dim": 64,
            "projection_seed": 1,
            "digest_bytes": 16,
            "positions_per_row": 3,
        },
        "figures": None,
    }
    assert from_builtins(entry, LayerDiagnostics).reduction.positions_per_row == 3
    assert from_builtins(entry, LayerDiagnostics).to_json() == entry
    for bad_value, expected in (
        (-3, "Expected `int` >= 1"),
        (0, "Expected `int` >= 1"),
        ((1 << 20) + 1, "Expected `int` <= 1048576"),
    ):
        bad = {**entry, "reduction": {**entry["reduction"], "positions_per_row": bad_value}}
        with pytest.raises(JSONDocumentError) as refused:
            decode(json_bytes(bad), LayerDiagnostics)
        assert str(refused.value) == f"$.reduction.positions_per_row: {expected}"
