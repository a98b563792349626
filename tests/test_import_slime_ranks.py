"""slime's dumps as its releases write them (issue 48, points 1 and 5).

The per-rank files of slime v0.3.1 and miles (``train_data/{rollout_id}_{rank}.pt``, written by
``tests/production_dumps.py``'s copy of slime's writer, named there with its tag) are imported
as one step per rollout: the files of one ``rollout_id`` merge, the samples ordered by
``sample_indices``, a sample that tensor-parallel ranks hold again read once, the pipeline
stages without ``log_probs`` left to the last one. Every step's active tokens, mismatches and
max |diff| equal a numpy float64 computation over the written samples with slime's mask
(``loss_masks``), and slime's own ``train_rollout_logprob_abs_diff`` (both modes) equals
slime's formula written here in numpy; on planted drift of uneven samples it differs from the
token mean, which the report no longer calls slime's. Refused, one line, exit 2: a run in
slime's default configuration (no trainer ``log_probs``: the line names the flag), a sample
two ranks hold differently, a rollout's files split by another's, two ``format_version`` 2
dumps of one ``rollout_id``.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from drift_testing import cli
from production_dumps import (
    Sample,
    expected,
    make_samples,
    slime_figures_numpy,
    write_slime_dump,
    write_slime_rank_dumps,
)

SLIME_FIGURE = "slime_train_rollout_logprob_abs_diff"
SLIME_PER_TOKEN = "slime_train_rollout_logprob_abs_diff_per_token_loss"


def _rollouts() -> dict[int, list[Sample]]:
    """Two rollouts of uneven samples (3 to 40 response tokens) with drift planted in short
    ones, some samples sharing a multi-turn rollout id."""
    rng = np.random.default_rng(4831)
    rollouts = {}
    for rollout_id, planted in ((3, [(0, 1, 0.4), (2, 0, 0.05)]), (7, [(5, 1, 1.5), (8, 0, 0.2)])):
        samples = make_samples(rng, 9, lengths=(3, 40), planted=planted)
        for i, s in enumerate(samples):
            s.sample_id = 100 * rollout_id + (17 * i) % 9  # not in rollout order
            s.rollout_id = i // 3 if i < 6 else None  # two three-sample rollouts, three alone
        rollouts[rollout_id] = samples
    return rollouts


def _import(inputs: list[Path] | Path, artifacts: Path, name: str) -> tuple[int, Any, str]:
    paths = inputs if isinstance(inputs, list) else [inputs]
    code, out, err = cli(
        "import", "--format", "slime", *paths, "--artifacts", artifacts,
        "--experiment-id", name, "--json",
    )  # fmt: skip
    return code, (json.loads(out) if out.strip() else None), err


@pytest.fixture(scope="module")
def rank_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("slime-ranks")
    rollouts = _rollouts()
    files = {
        rid: write_slime_rank_dumps(tmp / "dump", rid, samples, dp_size=2, tp_size=2)
        for rid, samples in rollouts.items()
    }
    code, result, err = _import(tmp / "dump", tmp / "runs", "ranks")
    assert code == 1, err  # MISMATCH steps
    return {"tmp": tmp, "rollouts": rollouts, "files": files, "result": result}


def _comparison(result: dict[str, Any]) -> dict[str, Any]:
    return json.loads((Path(result["attempt_dir"]) / "comparison.json").read_text())


def _imported(result: dict[str, Any]) -> dict[str, Any]:
    return json.loads((Path(result["attempt_dir"]) / "imported.json").read_text())


def test_the_rank_files_of_a_rollout_are_one_step_checked_in_numpy(
    rank_run: dict[str, Any],
) -> None:
    results = {r["step"]: r for r in rank_run["result"]["results"]}
    assert sorted(results) == sorted(rank_run["rollouts"])
    for rollout_id, samples in rank_run["rollouts"].items():
        result, want = results[rollout_id], expected(samples)
        assert result["samples"] == len(samples)
        assert result["outcome"] == want.outcome == "MISMATCH"
        assert (result["active_tokens"], result["mismatches"]) == (want.active, want.mismatches)
        assert result["max_abs_diff"] == want.extra["max_abs_diff"]
        imported = _imported(result)
        assert [row["sample"] for row in imported["rows"]] == sorted(s.sample_id for s in samples)
        # four rank files (two data-parallel ranks, each written by two tensor-parallel ranks)
        assert sorted(imported["inputs"]) == sorted(str(p) for p in rank_run["files"][rollout_id])
        shares = {row["input"] for row in imported["rows"]}
        assert len(shares) == 2  # each sample read once, from one rank of its pair


def test_slime_figure_is_slime_formula_in_both_modes(rank_run: dict[str, Any]) -> None:
    ratios = []
    for result in rank_run["result"]["results"]:
        samples = rank_run["rollouts"][result["step"]]
        want = slime_figures_numpy(samples)
        diagnostics = _comparison(result)["diagnostics"]
        for key in (SLIME_FIGURE, SLIME_PER_TOKEN):
            assert math.isclose(diagnostics[key], want[key], rel_tol=1e-12), key
        # with an active token in every sample the per-token-loss figure is the token mean
        assert math.isclose(
            diagnostics[SLIME_PER_TOKEN], diagnostics["mean_abs_diff"], rel_tol=1e-12
        )
        ratios.append(diagnostics["mean_abs_diff"] / diagnostics[SLIME_FIGURE])
    assert all(abs(r - 1) > 0.05 for r in ratios), ratios  # slime's default is not the token mean


@pytest.mark.slow
def test_a_rank_run_verifies_and_reports_slime_own_figure(rank_run: dict[str, Any]) -> None:
    run = Path(rank_run["result"]["run_dir"])
    code, out, err = cli("verify", run)
    assert code == 0, err
    page = rank_run["tmp"] / "page.html"
    code, out, err = cli("report", run, "--json", "--html", page)
    assert code == 0, err
    cases = json.loads(out)["cases"]
    assert all(SLIME_FIGURE in c["diagnostics"] for c in cases)
    html = page.read_text()
    assert "slime train_rollout_logprob_abs_diff" in html
    assert "--calculate-per-token-loss" in html


def test_pipeline_stages_without_log_probs_leave_them_to_the_last(tmp_path: Path) -> None:
    samples = _rollouts()[3]
    files = write_slime_rank_dumps(tmp_path / "dump", 3, samples, dp_size=2, pp_size=2)
    first = torch.load(files[0], weights_only=True)
    assert "log_probs" not in first["rollout_data"]
    code, result, err = _import(tmp_path / "dump", tmp_path / "runs", "pp")
    assert code == 1, err
    (step,) = result["results"]
    want = expected(samples)
    assert (step["active_tokens"], step["mismatches"]) == (want.active, want.mismatches)
    assert step["max_abs_diff"] == want.extra["max_abs_diff"]


def _refused(tmp_path: Path, inputs: list[Path] | Path) -> str:
    code, result, err = _import(inputs, tmp_path / "runs", "refused")
    assert code == 2, err
    assert result is None and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "runs" / "refused").exists()
    return err


def test_slime_default_configuration_is_refused_naming_the_flag(tmp_path: Path) -> None:
    write_slime_rank_dumps(tmp_path / "dump", 0, _rollouts()[3], log_probs=False)
    err = _refused(tmp_path, tmp_path / "dump")
    assert "no log_probs in rollout_data" in err and "--get-mismatch-metrics" in err
    assert "train_data/0_" in err


def test_a_sample_two_ranks_hold_differently_is_refused(tmp_path: Path) -> None:
    files = write_slime_rank_dumps(tmp_path / "dump", 0, _rollouts()[3], tp_size=2)
    dump = torch.load(files[1], weights_only=True)
    dump["rollout_data"]["rollout_log_probs"][0][0] += 0.5
    torch.save(dump, files[1])
    err = _refused(tmp_path, tmp_path / "dump")
    assert "rollout_log_probs differs from the same sample in" in err
    assert f"{files[0]}" in err and f"{files[1]}" in err


def test_a_rollout_split_by_another_is_refused(tmp_path: Path) -> None:
    rollouts = _rollouts()
    a = write_slime_rank_dumps(tmp_path / "dump", 3, rollouts[3])
    b = write_slime_rank_dumps(tmp_path / "dump", 7, rollouts[7])
    err = _refused(tmp_path, [a[0], b[0], a[1]])
    assert "rollout_id 3 again, after other rollouts" in err


def test_the_same_rank_twice_is_refused(tmp_path: Path) -> None:
    a = write_slime_rank_dumps(tmp_path / "dump", 3, _rollouts()[3])
    copy = tmp_path / "copy_of_3_0.pt"
    shutil.copy(a[0], copy)
    err = _refused(tmp_path, [a[0], copy])
    assert "rank 0 of rollout_id 3 again" in err


def test_two_version_2_dumps_of_one_rollout_stay_refused(tmp_path: Path) -> None:
    samples = _rollouts()[3]
    first = write_slime_dump(tmp_path / "a", 3, samples)
    second = write_slime_dump(tmp_path / "b", 3, samples[:4])
    err = _refused(tmp_path, [first, second])
    assert "step 3 again" in err


def test_a_version_2_dump_gets_slime_figure_too(tmp_path: Path) -> None:
    samples = _rollouts()[7]
    for s in samples:
        s.rollout_id = None  # the version-2 writer of production_dumps records no rollout ids
    path = write_slime_dump(tmp_path, 7, samples)
    code, result, err = _import(path, tmp_path / "runs", "v2")
    assert code == 1, err
    diagnostics = _comparison(result["results"][0])["diagnostics"]
    want = slime_figures_numpy(samples)
    for key in (SLIME_FIGURE, SLIME_PER_TOKEN):
        assert math.isclose(diagnostics[key], want[key], rel_tol=1e-12), key


def test_a_rollout_trained_in_several_steps_gets_no_slime_figure(tmp_path: Path) -> None:
    """slime logs one figure per training step, over samples the dump does not tell apart."""
    files = write_slime_rank_dumps(tmp_path / "dump", 3, _rollouts()[3])
    for path in files:
        dump = torch.load(path, weights_only=True)
        dump["rollout_data"]["global_batch_sizes"] = [4, 5]
        torch.save(dump, path)
    code, result, err = _import(tmp_path / "dump", tmp_path / "runs", "two-steps")
    assert code == 1, err
    diagnostics = _comparison(result["results"][0])["diagnostics"]
    assert SLIME_FIGURE not in diagnostics and SLIME_PER_TOKEN not in diagnostics
    assert "mean_abs_diff" in diagnostics
