"""``"diagnostics": {"layers": {"positions_per_row": 3}}`` on a real ``hf`` run (issue 23): both
sides capture the same 3 positions per row, evenly spaced over the row's active tokens; the
sealed digests and norms are those of states captured by hooks written here on plain
transformers at the positions picked here; ``verify`` accepts the run; and the object form is
part of the execution key (``layers: true`` on the same store runs anew, the same object form
reuses)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import DEEP_SMALL, cli, experiment_config
from layer_hooks import digests16, hooked_states, plain_model

pytestmark = pytest.mark.slow

PER_ROW = 3


def _config(directory: Path, layers: object) -> Path:
    changes = {
        **DEEP_SMALL,
        "experiment_id": "hf-layer-positions",
        "interventions": [{"path": "rollout.dtype", "values": ["float32"]}],
        "diagnostics": {"layers": layers},
    }
    name = f"config-{len(list(directory.glob('config-*')))}.json"
    return experiment_config(
        directory, "cross_config_s0_hf_tiny_bf16.json", changes, file_name=name
    )


def _run(directory: Path, layers: object) -> str:
    code, out, err = cli(
        "run", _config(directory, layers), "--runtime", "hf", "--artifacts", directory / "runs"
    )
    assert code in (0, 1), err[-3000:]
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("layer-positions")
    out = _run(directory, {"positions_per_row": PER_ROW})
    run_dir = directory / "runs" / "hf-layer-positions"
    cases = {}
    for path in (run_dir / "cases").glob("*/*/comparison.json"):
        comparison = json.loads(path.read_text())
        cases[comparison["label"]] = {"comparison": comparison, "attempt": path.parent}
    return {"directory": directory, "run_dir": run_dir, "text": out, "cases": cases}


def _load(path: Path) -> dict[str, torch.Tensor]:
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded


def _picked(active: torch.Tensor) -> torch.Tensor:
    """(row, t - 1) of the picked active tokens t: per row, ``PER_ROW`` of its ``n`` active
    tokens at indices 0, (n-1)/2, n-1 (integer division), all of them when n <= 3."""
    out = []
    for row in range(int(active.shape[0])):
        tokens = [int(t) for t in active[row].nonzero().flatten()]
        n = len(tokens)
        chosen = tokens if n <= PER_ROW else [tokens[0], tokens[(n - 1) // 2], tokens[-1]]
        out.extend([row, t - 1] for t in chosen)
    return torch.tensor(out, dtype=torch.long)


def test_both_sides_capture_the_picked_positions_of_plain_transformers(
    run: dict[str, Any],
) -> None:
    torch.set_num_threads(1)
    case = run["cases"]["rollout.dtype=float32"]
    batch = _load(case["attempt"] / "score_rollout.pt")
    where = _picked(batch["active_mask"])
    assert int(where.shape[0]) < int(batch["active_mask"].sum())  # a real subset
    layers = case["comparison"]["diagnostics"]["layers"]
    assert layers["reduction"]["positions_per_row"] == PER_ROW
    assert layers["figures"]["positions"] == int(where.shape[0])
    for name, dtype in (
        ("layers_training.pt", torch.bfloat16),
        ("layers_rollout.pt", torch.float32),
    ):
        sealed = _load(case["attempt"] / name)
        assert torch.equal(sealed["positions"], where), name
        full = hooked_states(plain_model(dtype), batch)
        for s, state in enumerate(x[where[:, 0], where[:, 1]] for x in full):
            assert [bytes(d.tolist()) for d in sealed["digests"][s]] == digests16(state), (name, s)
            exact = torch.linalg.vector_norm(state.double(), dim=-1)
            assert torch.allclose(sealed["norms"][s], exact, rtol=1e-12, atol=0), (name, s)


def test_verify_accepts_the_subset(run: dict[str, Any]) -> None:
    code, out, err = cli("verify", run["run_dir"], "--json")
    assert code == 0, out[-2000:] + err[-2000:]


def test_the_object_form_is_in_the_execution_key(run: dict[str, Any]) -> None:
    again = _run(run["directory"], {"positions_per_row": PER_ROW})
    assert again.count("(reused)") == 2 and "(new)" not in again, again
    every = _run(run["directory"], True)
    assert every.count("(new)") == 2 and "(reused)" not in every, every
