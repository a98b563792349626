"""The store never writes or vouches through a symbolic link below its root (issue 21, class 2).

A ``.lock``, ``seals/``, ``cases/``, a case, ``attributions/`` or the run directory that is a
symbolic link would make ``run`` create files wherever it points, or ``verify`` vouch for
another directory's attempts. Every create and open below the store root refuses links; a store
that holds one is refused with one line (a StorageError, exit 2). The ``--artifacts`` path
itself may be, or pass through, a link.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from attribution_records import attribution_data
from drift_testing import cli, plan_row, run_s0

from pytest_logprob_drift.attribution.sealed import open_attribution, write_attribution
from pytest_logprob_drift.errors import ExitCode, StorageError
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.run import ArtifactStore
from pytest_logprob_drift.store.seal import SealError

EXPERIMENT = {"experiment_id": "exp"}
ROWS = [plan_row("c1")]
FIXTURE_RUN = Path(__file__).parent / "data" / "pre_issue20" / "runs" / "fixture-pre20-cpu-smoke"


def outside(tmp_path: Path) -> Path:
    """A directory outside the store, where a link below the store points."""
    target = tmp_path / "outside"
    target.mkdir(exist_ok=True)
    return target


def refused(store: ArtifactStore, rows: list[dict[str, str]] = ROWS) -> StorageError:
    with pytest.raises(StorageError) as caught:
        store.initialize(EXPERIMENT, rows)
    error = caught.value
    assert error.exit_code is ExitCode.USAGE_ERROR
    assert "symbolic link" in str(error) and "\n" not in str(error)
    return error


def test_a_lock_that_is_a_link_is_refused_and_nothing_is_created_where_it_points(
    tmp_path: Path,
) -> None:
    store = ArtifactStore(tmp_path / "runs", "exp")
    store.directory.mkdir(parents=True)
    target = outside(tmp_path) / "planted"
    (store.directory / layout.LOCK).symlink_to(target)
    refused(store)
    assert not target.exists()


def test_a_seals_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "runs", "exp")
    store.initialize(EXPERIMENT, ROWS)
    seals = store.directory / layout.SEALS
    shutil.rmtree(seals)
    seals.symlink_to(outside(tmp_path), target_is_directory=True)
    refused(store, [*ROWS, plan_row("c2")])
    assert list(outside(tmp_path).iterdir()) == []


@pytest.mark.parametrize("name", [layout.CASES, layout.ATTRIBUTIONS])
def test_a_cases_or_attributions_directory_that_is_a_link_is_refused(
    tmp_path: Path, name: str
) -> None:
    store = ArtifactStore(tmp_path / "runs", "exp")
    store.initialize(EXPERIMENT, ROWS)
    path = store.directory / name
    if path.exists():
        path.rmdir()
    path.symlink_to(outside(tmp_path), target_is_directory=True)
    refused(store)  # the fast path (every row recorded) too


def test_a_run_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "exp").symlink_to(outside(tmp_path), target_is_directory=True)
    refused(ArtifactStore(tmp_path / "runs", "exp"))
    assert list(outside(tmp_path).iterdir()) == []


def test_a_case_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "runs", "exp")
    store.initialize(EXPERIMENT, ROWS)
    store.case_dir("c1").symlink_to(outside(tmp_path), target_is_directory=True)
    with pytest.raises(StorageError, match="symbolic link"):
        store.new_attempt("c1", "e" * 64)
    assert list(outside(tmp_path).iterdir()) == []


def test_an_attributions_link_is_never_written_through(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / layout.ATTRIBUTIONS).symlink_to(outside(tmp_path), target_is_directory=True)
    with pytest.raises(StorageError, match="symbolic link"):
        write_attribution(run_dir, attribution_data([], []))
    assert list(outside(tmp_path).iterdir()) == []


def test_an_attribution_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    sealed = write_attribution(run_dir, attribution_data([], [])).directory
    moved = outside(tmp_path) / sealed.name
    sealed.rename(moved)
    sealed.symlink_to(moved, target_is_directory=True)
    with pytest.raises(SealError, match="not a directory") as caught:
        open_attribution(sealed)
    assert caught.value.file == layout.COMPLETE


@pytest.fixture
def fixture_run(tmp_path: Path) -> Path:
    """A writable copy of a sealed run (made before issue 20)."""
    target = tmp_path / "runs" / FIXTURE_RUN.name
    shutil.copytree(FIXTURE_RUN, target)
    return target


@pytest.mark.parametrize("name", [layout.CASES, layout.SEALS, layout.ATTRIBUTIONS])
def test_verify_refuses_a_run_whose_directories_are_links(
    fixture_run: Path, tmp_path: Path, name: str
) -> None:
    """The linked directory holds genuine sealed files: verify must not vouch for them."""
    assert cli("verify", fixture_run)[0] == 0
    moved = tmp_path / "elsewhere"
    (fixture_run / name).rename(moved)
    (fixture_run / name).symlink_to(moved, target_is_directory=True)
    code, out, err = cli("verify", fixture_run)
    assert code == ExitCode.USAGE_ERROR, out + err
    assert "symbolic link" in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_run_may_write_through_an_artifacts_path_that_is_or_passes_through_a_link(
    tmp_path: Path,
) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    for artifacts in (tmp_path / "link", tmp_path / "link" / "nested"):
        code, _, err = run_s0(artifacts)
        assert code == 0, err
        run_dir = next(artifacts.iterdir())
        assert cli("verify", run_dir)[0] == 0
    assert {p.name for p in real.iterdir()} == {"nested", "s0-cpu-smoke"}


@pytest.mark.parametrize("name", [layout.LOCK, layout.CASES, layout.SEALS])
def test_run_refuses_a_store_holding_a_link_with_one_line(tmp_path: Path, name: str) -> None:
    artifacts = tmp_path / "runs"
    run_dir = artifacts / "s0-cpu-smoke"
    run_dir.mkdir(parents=True)
    target = outside(tmp_path) / "target"
    (run_dir / name).symlink_to(target, target_is_directory=name != layout.LOCK)
    code, out, err = run_s0(artifacts)
    assert code == ExitCode.USAGE_ERROR, out + err
    assert "symbolic link" in err and len(err.strip().splitlines()) == 1, err
    assert not target.exists()
