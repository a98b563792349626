"""The score tensors an import seals (issue 58): token ids in their narrowest exact dtype and
no position ids (the grid determines them); what runs sealed before hold (int64 ids, sealed
positions) still verifies, and a sealed position that is not the grid's is refused, as an
executed attempt without its position ids is."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from drift_testing import cli, copy_of_s0
from production_dumps import make_samples, write_nemo_rl_step
from resealing import reseal


def _verify(run_dir: Path) -> tuple[int, dict[str, object]]:
    code, out, _ = cli("verify", run_dir, "--json")
    return code, json.loads(out)


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two NeMo-RL steps: ids below 2**15 (step 1) and one id above it (step 2)."""
    root = tmp_path_factory.mktemp("sealed-forms")
    logs = root / "logs"
    logs.mkdir()
    rng = np.random.default_rng(58)
    small = make_samples(rng, 3)
    large = make_samples(rng, 3)
    large[1].tokens[2] = 151_000  # a real vocabulary's id past int16
    write_nemo_rl_step(logs, 1, small)
    write_nemo_rl_step(logs, 2, large)
    code, out, err = cli(
        "import", "--format", "nemo-rl", str(logs), "--artifacts", str(root / "runs"), "--json"
    )
    assert code == 0, err
    return Path(json.loads(out)["run_dir"])


def _attempts(run_dir: Path) -> dict[int, Path]:
    by_step = {}
    for complete in run_dir.glob("cases/*/*/COMPLETE"):
        step = json.loads((complete.parent / "imported.json").read_text())["step"]
        by_step[step] = complete.parent
    return by_step


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    import shutil

    target = tmp_path / run_dir.name
    shutil.copytree(run_dir, target)
    return target


def test_imported_ids_are_sealed_narrow_without_positions_and_verify(imported: Path) -> None:
    attempts = _attempts(imported)
    dtypes = {}
    for step, attempt in attempts.items():
        for name in ("score_rollout.pt", "score_training.pt"):
            tensors = torch.load(attempt / name, weights_only=True)
            assert "position_ids" not in tensors
            dtypes[step, name] = tensors["token_ids"].dtype
    assert dtypes[1, "score_rollout.pt"] == torch.int16
    assert dtypes[2, "score_rollout.pt"] == torch.int32
    rollout = torch.load(attempts[2] / "score_rollout.pt", weights_only=True)
    assert int(rollout["token_ids"].max()) == 151_000  # exact, not wrapped
    code, document = _verify(imported)
    assert code == 0, document


def _with_positions(attempt: Path, run_dir: Path, edit: int) -> None:
    """Seal position_ids into both score files as an import before issue 58 did (int64 ids,
    ``arange(T) * attention``), ``edit`` added at row 0 column 1, and reseal."""
    for name in ("score_rollout.pt", "score_training.pt"):
        path = attempt / name
        tensors = torch.load(path, weights_only=True)
        attention = tensors["attention_mask"]
        width = attention.shape[1]
        positions = torch.tensor(
            [
                [c if bool(attention[r, c]) else 0 for c in range(width)]
                for r in range(len(attention))
            ],
            dtype=torch.int64,
        )
        positions[0, 1] += edit
        tensors["position_ids"] = positions
        tensors["token_ids"] = tensors["token_ids"].to(torch.int64)
        torch.save(tensors, path)
        reseal(run_dir, path)


def test_an_import_sealed_with_positions_and_int64_ids_verifies(
    imported: Path, tmp_path: Path
) -> None:
    run_dir = _copy(imported, tmp_path)
    _with_positions(_attempts(run_dir)[1], run_dir, edit=0)
    code, document = _verify(run_dir)
    assert code == 0, document


def test_a_sealed_position_that_is_not_the_grids_is_refused(imported: Path, tmp_path: Path) -> None:
    run_dir = _copy(imported, tmp_path)
    _with_positions(_attempts(run_dir)[1], run_dir, edit=5)
    code, out, _ = cli("verify", run_dir)
    assert code != 0
    assert "score_rollout.pt" in out
    assert "position_ids" in out and "not the imported grid's" in out


def test_an_executed_attempt_without_position_ids_is_refused(
    sealed_s0: Path, tmp_path: Path
) -> None:
    run_dir = copy_of_s0(sealed_s0, tmp_path) / "s0-cpu-smoke"
    path = next(run_dir.glob("cases/*/*/score_training.pt"))
    tensors = torch.load(path, weights_only=True)
    del tensors["position_ids"]
    torch.save(tensors, path)
    reseal(run_dir, path)
    code, out, _ = cli("verify", run_dir)
    assert code != 0
    assert "score_training.pt" in out and "has no 'position_ids' tensor" in out
