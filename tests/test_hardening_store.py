"""The store confines and checks every read and write (issue 14, classes 4 to 6).

Seal entries are plain names inside their attempt (no '/', '..' or absolute names) and no
symbolic link or other non-regular file is followed; ``verify`` cross-checks ``token_diffs.pt``
against both scored tensor files; a keyed seal (HMAC-SHA256) catches what an unkeyed one
cannot (a rewrite with a recomputed manifest); ``experiment.json`` and ``plan.jsonl`` are
sealed by append-only run seals; a torn ``plan.jsonl`` tail is reported and never glued to;
a failed append is rolled back (a real full tmpfs when running as root).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import OFFSET_EXPECT, cli, experiment_document, plan_row, run_s0
from tmpfs import fill

from pytest_logprob_drift.check.resume import check_attempt
from pytest_logprob_drift.check.verify import verify_run, verify_run_files
from pytest_logprob_drift.errors import ExitCode, InvalidRunError, StorageError
from pytest_logprob_drift.store.attempt import read_seal
from pytest_logprob_drift.store.files import json_bytes
from pytest_logprob_drift.store.keys import SealKey, load_seal_key, sealing_with
from pytest_logprob_drift.store.layout import COMPLETE, run_seal_name
from pytest_logprob_drift.store.layout import PLAN as PLAN_FILE
from pytest_logprob_drift.store.run import (
    ArtifactStore,
    iter_attempt_dirs,
    read_plan_log,
    run_seal_manifest,
    run_seals,
)
from pytest_logprob_drift.store.seal import SealError, write_manifest
from pytest_logprob_drift.tensorio import tensor_bytes, tensors_from_bytes

EXPECT = OFFSET_EXPECT
EXPERIMENT = "s0-cpu-smoke"
KEY = "k" * 32


@pytest.fixture(scope="module")
def sealed_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One unkeyed and one keyed S0 run, made once."""
    root = tmp_path_factory.mktemp("sealed")
    plain, keyed = root / "plain", root / "keyed"
    assert run_s0(plain)[0] == 0
    assert run_s0(keyed, "--seal-key-env", "DRIFT_KEY", env={"DRIFT_KEY": KEY})[0] == 0
    return {"plain": plain, "keyed": keyed}


@pytest.fixture
def run_dir(sealed_runs: dict[str, Path], tmp_path: Path) -> Path:
    """A private copy of the unkeyed run directory."""
    shutil.copytree(sealed_runs["plain"], tmp_path / "runs")
    return tmp_path / "runs" / EXPERIMENT


def attempts(run_dir: Path) -> list[Path]:
    return list(iter_attempt_dirs(run_dir))


def mismatch_attempt(run_dir: Path) -> Path:
    for attempt in attempts(run_dir):
        if json.loads((attempt / "comparison.json").read_text())["outcome"] == "MISMATCH":
            return attempt
    raise AssertionError("no MISMATCH attempt")


def reseal(attempt: Path, files: dict[str, str], *, key: SealKey | None = None) -> None:
    """Rewrite COMPLETE with ``files`` as its manifest (what someone with write access, but
    without the key, can do)."""
    document: dict[str, Any] = json.loads((attempt / COMPLETE).read_text())
    document.pop("mac", None)
    document["files"] = files
    if key is not None:
        document["mac"] = key.mac(document)
    os.chmod(attempt / COMPLETE, 0o644)
    (attempt / COMPLETE).write_bytes(json_bytes(document))


def digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def invalid(run_dir: Path) -> list[tuple[str | None, str]]:
    return [(s.file, s.detail) for s in verify_run(run_dir) if s.status == "invalid"]


# ----------------------------------------------------------------------------- confinement


@pytest.mark.parametrize("name", ["../../outside.json", "/etc/hostname", "sub/file", "..", ""])
def test_a_seal_entry_must_be_a_plain_name_inside_the_attempt(run_dir: Path, name: str) -> None:
    attempt = mismatch_attempt(run_dir)
    outside = run_dir.parent / "outside.json"
    outside.write_text("{}")
    target = Path(name) if name.startswith("/") else attempt / name
    files = json.loads((attempt / COMPLETE).read_text())["files"]
    files[name] = digest(target) if target.is_file() else "0" * 64
    reseal(attempt, files)
    with pytest.raises(SealError, match="not a plain file name") as caught:
        read_seal(attempt)
    assert caught.value.file == COMPLETE
    assert any(file == COMPLETE for file, _ in invalid(run_dir))


def test_a_sealed_file_replaced_by_a_symlink_to_identical_bytes_is_refused(run_dir: Path) -> None:
    attempt = mismatch_attempt(run_dir)
    copy = run_dir.parent / "comparison-copy.json"
    shutil.copy(attempt / "comparison.json", copy)
    (attempt / "comparison.json").unlink()
    (attempt / "comparison.json").symlink_to(copy)
    with pytest.raises(SealError, match="symbolic link") as caught:
        read_seal(attempt)
    assert caught.value.file == "comparison.json"


def test_an_extra_symlink_or_fifo_in_an_attempt_is_refused_without_blocking(
    run_dir: Path,
) -> None:
    first, second = attempts(run_dir)[:2]
    (first / "extra").symlink_to("/etc/hostname")
    os.mkfifo(second / "pipe")
    with pytest.raises(SealError, match="symbolic link"):
        read_seal(first)
    with pytest.raises(SealError, match="not a regular file"):
        read_seal(second)
    assert {f for f, _ in invalid(run_dir)} == {"extra", "pipe"}


def test_an_attempt_directory_that_is_a_symlink_is_refused(run_dir: Path, tmp_path: Path) -> None:
    attempt = mismatch_attempt(run_dir)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(attempt, elsewhere)
    attempt.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(SealError, match="not a directory"):
        read_seal(attempt)


def test_a_resume_never_reuses_an_unconfined_attempt(run_dir: Path) -> None:
    attempt = mismatch_attempt(run_dir)
    files = json.loads((attempt / COMPLETE).read_text())["files"]
    files["../../outside.json"] = "0" * 64
    reseal(attempt, files)
    code, out, err = run_s0(run_dir.parent)
    assert code == 0, err
    result = next(r for r in json.loads(out)["results"] if r["outcome"] == "MISMATCH")
    assert not result["reused"] and Path(result["attempt_dir"]) != attempt


# ----------------------------------------------------------------------------- cross-check


def rewrite_tensors(attempt: Path, name: str, change: Any) -> None:
    """Change one tensor file and fix the manifest: a consistent forgery of an unkeyed seal."""
    tensors = tensors_from_bytes((attempt / name).read_bytes())
    change(tensors)
    os.chmod(attempt / name, 0o644)
    (attempt / name).write_bytes(tensor_bytes(tensors))
    files = json.loads((attempt / COMPLETE).read_text())["files"]
    files[name] = digest(attempt / name)
    reseal(attempt, files)


@pytest.mark.parametrize(
    ("name", "key", "message"),
    [
        ("token_diffs.pt", "rollout_logprobs", "rollout_logprobs differs from score_rollout.pt"),
        ("token_diffs.pt", "training_logprobs", "training_logprobs differs from score_training"),
        ("score_rollout.pt", "logprobs", "rollout_logprobs differs from score_rollout.pt"),
        ("score_training.pt", "logprobs", "training_logprobs differs from score_training"),
        ("score_rollout.pt", "active_mask", "active_mask differs from score_rollout.pt"),
    ],
)
def test_verify_cross_checks_token_diffs_against_both_scores(
    run_dir: Path, name: str, key: str, message: str
) -> None:
    """A change that keeps the verdict (an inactive position of one tensor) still fails."""
    attempt = mismatch_attempt(run_dir)
    active = tensors_from_bytes((attempt / "token_diffs.pt").read_bytes())["active_mask"]

    def change(tensors: dict[str, torch.Tensor]) -> None:
        tensor = tensors[key]
        inactive = (~active.bool()).nonzero()[0].tolist()
        if tensor.dtype == torch.bool:
            tensor[tuple(inactive)] = True
        else:
            tensor[tuple(inactive)] += 0.25

    rewrite_tensors(attempt, name, change)
    read_seal(attempt)  # the manifest is consistent: only the cross-check can tell
    with pytest.raises(SealError, match=message):
        check_attempt(attempt, expected_key=None)
    assert [f for f, _ in invalid(run_dir)] == ["token_diffs.pt" if "differs" in message else name]


# ----------------------------------------------------------------------------- keyed seals


def test_keyed_seals_verify_under_their_key_only(sealed_runs: dict[str, Path]) -> None:
    keyed = sealed_runs["keyed"] / EXPERIMENT
    assert all("mac" in json.loads((a / COMPLETE).read_text()) for a in attempts(keyed))
    assert all("mac" in json.loads(p.read_text()) for _, p in run_seals(keyed))
    env = {"DRIFT_KEY": KEY, "OTHER_KEY": "o" * 32}
    code, out, _ = cli("verify", keyed, "--seal-key-env", "DRIFT_KEY", "--json", env=env)
    assert code == 0 and json.loads(out)["invalid"] == 0
    code, out, _ = cli("verify", keyed, "--seal-key-env", "OTHER_KEY", "--json", env=env)
    document = json.loads(out)
    assert code == 1 and all(a["status"] == "invalid" for a in document["attempts"])
    assert all("sealed with another key" in a["detail"] for a in document["attempts"])
    assert cli("verify", keyed)[0] == 0  # without a key: the SHA-256 manifest only


def test_a_recomputed_manifest_passes_unkeyed_and_fails_keyed(
    sealed_runs: dict[str, Path], tmp_path: Path
) -> None:
    shutil.copytree(sealed_runs["keyed"], tmp_path / "runs")
    run_dir = tmp_path / "runs" / EXPERIMENT
    attempt = mismatch_attempt(run_dir)
    comparison = json.loads((attempt / "comparison.json").read_text())
    comparison["reason"] = "rewritten"
    os.chmod(attempt / "comparison.json", 0o644)
    (attempt / "comparison.json").write_bytes(json_bytes(comparison))
    files = json.loads((attempt / COMPLETE).read_text())["files"]
    files["comparison.json"] = digest(attempt / "comparison.json")
    reseal(attempt, files)  # without the key
    assert invalid(run_dir) == []  # what an unkeyed seal cannot see
    with sealing_with(SealKey(KEY.encode(), "test")):
        assert invalid(run_dir) == [
            (
                COMPLETE,
                f"not sealed with a key; test (key id "
                f"{SealKey(KEY.encode(), 'test').key_id}) is required",
            )
        ]
    reseal(attempt, files, key=SealKey(b"x" * 32, "forger"))  # with another key
    with sealing_with(SealKey(KEY.encode(), "test")):
        assert "sealed with another key" in invalid(run_dir)[0][1]


def test_a_keyed_resume_reexecutes_attempts_it_cannot_verify(
    sealed_runs: dict[str, Path], tmp_path: Path
) -> None:
    shutil.copytree(sealed_runs["plain"], tmp_path / "runs")
    env = {"DRIFT_KEY": KEY}
    code, out, err = run_s0(tmp_path / "runs", "--seal-key-env", "DRIFT_KEY", env=env)
    assert code == 0, err
    assert not any(r["reused"] for r in json.loads(out)["results"])
    code, out, err = run_s0(tmp_path / "runs", "--seal-key-env", "DRIFT_KEY", env=env)
    assert code == 0 and all(r["reused"] for r in json.loads(out)["results"]), err


def test_a_keyed_resume_of_an_unkeyed_run_verifies_under_the_key(
    sealed_runs: dict[str, Path], tmp_path: Path
) -> None:
    """After a keyed resume, keyed verify accepts the run: the run's files carry a seal made
    with the key, and what was sealed without it is reported ``superseded``, not invalid; an
    unkeyed forgery of one of those old attempts is still invalid."""
    shutil.copytree(sealed_runs["plain"], tmp_path / "runs")
    run_dir = tmp_path / "runs" / EXPERIMENT
    old_attempts = {a.name for a in attempts(run_dir)}
    env = {"DRIFT_KEY": KEY}
    assert run_s0(tmp_path / "runs", "--seal-key-env", "DRIFT_KEY", env=env)[0] == 0
    key = SealKey(KEY.encode(), "test")
    keyed_seals = [p for _, p in run_seals(run_dir) if "mac" in json.loads(p.read_text())]
    assert [p.name for p in keyed_seals] == [f"{keyed_seals[0].name[:16]}-{key.key_id}.json"]
    code, out, _ = cli("verify", run_dir, "--seal-key-env", "DRIFT_KEY", "--json", env=env)
    report = json.loads(out)
    assert code == 0 and report["invalid"] == 0, out
    by_status = {
        status: {a["attempt_id"] for a in report["attempts"] if a["status"] == status}
        for status in ("ok", "superseded")
    }
    assert by_status["superseded"] == old_attempts and by_status["ok"].isdisjoint(old_attempts)
    assert [f["status"] for f in report["run_files"]] == ["superseded", "ok", "ok"]
    statuses = [a["status"] for a in report["attributions"]]
    assert sorted(statuses) == ["ok", "superseded"], report["attributions"]
    attributions = sorted((run_dir / "attributions").iterdir())
    assert sum("mac" in json.loads((d / COMPLETE).read_text()) for d in attributions) == 1
    assert cli("verify", run_dir)[0] == 0  # without a key every intact attempt is ok
    forged = next(a for a in attempts(run_dir) if a.name in old_attempts)
    comparison = json.loads((forged / "comparison.json").read_text())
    comparison["reason"] = "rewritten"
    os.chmod(forged / "comparison.json", 0o644)
    (forged / "comparison.json").write_bytes(json_bytes(comparison))
    code, out, _ = cli("verify", run_dir, "--seal-key-env", "DRIFT_KEY", "--json", env=env)
    bad = [a for a in json.loads(out)["attempts"] if a["status"] == "invalid"]
    assert code == 1 and [(a["attempt_id"], a["file"]) for a in bad] == [
        (forged.name, "comparison.json")
    ]


def test_a_keyed_attribution_seal_refuses_an_unkeyed_rewrite(
    sealed_runs: dict[str, Path], tmp_path: Path
) -> None:
    shutil.copytree(sealed_runs["keyed"], tmp_path / "runs")
    run_dir = tmp_path / "runs" / EXPERIMENT
    (attribution,) = (run_dir / "attributions").iterdir()
    seal = json.loads((attribution / COMPLETE).read_text())
    assert seal["mac"]["algorithm"] == "hmac-sha256"
    env = {"DRIFT_KEY": KEY}
    code, out, _ = cli("verify", run_dir, "--seal-key-env", "DRIFT_KEY", "--json", env=env)
    assert code == 0 and json.loads(out)["attributions"][0]["status"] == "ok"
    document = json.loads((attribution / "attribution.json").read_text())
    document["experiment_id"] = "rewritten"
    os.chmod(attribution / "attribution.json", 0o644)
    (attribution / "attribution.json").write_bytes(json_bytes(document))
    seal.pop("mac")
    seal["files"]["attribution.json"] = digest(attribution / "attribution.json")
    os.chmod(attribution / COMPLETE, 0o644)
    (attribution / COMPLETE).write_bytes(json_bytes(seal))
    code, out, _ = cli("verify", run_dir, "--seal-key-env", "DRIFT_KEY", "--json", env=env)
    (checked,) = json.loads(out)["attributions"]
    assert code == 1 and checked["status"] == "invalid"
    assert checked["problems"][0].startswith("COMPLETE: not sealed with a key")


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--seal-key-env", "NO_SUCH_VARIABLE"], {}, "is not set"),
        (["--seal-key-env", "SHORT"], {"SHORT": "abc"}, "at least 16 bytes"),
        (["--seal-key-file", "/nonexistent/key"], {}, "cannot read the seal key"),
    ],
)
def test_a_seal_key_that_cannot_be_used_is_a_usage_error(
    tmp_path: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    code, _, err = run_s0(tmp_path / "runs", *args, env=env)
    assert code == ExitCode.USAGE_ERROR and err.count("\n") == 1 and message in err
    assert not (tmp_path / "runs").exists()


def test_a_key_file_is_read_and_stripped(tmp_path: Path) -> None:
    (tmp_path / "key").write_text(KEY + "\n")
    key = load_seal_key(file=str(tmp_path / "key"), flags=("--f", "--e"))
    assert key is not None and key.secret == KEY.encode() and KEY not in repr(key)


# ----------------------------------------------------------------------------- run seals


def run_file_problems(run_dir: Path) -> dict[str, str]:
    return {f.file: f.detail for f in verify_run_files(run_dir) if f.status != "ok"}


def test_experiment_and_plan_are_sealed(run_dir: Path) -> None:
    assert run_file_problems(run_dir) == {}
    (run_dir / "experiment.json").chmod(0o644)
    document = json.loads((run_dir / "experiment.json").read_text())
    document["strategy"] = "pairwise"
    (run_dir / "experiment.json").write_bytes(json_bytes(document))
    problems = run_file_problems(run_dir)
    assert any("experiment.json does not match" in p for p in problems.values())


def test_a_rewritten_or_truncated_plan_is_invalid_and_an_appended_row_incomplete(
    run_dir: Path,
) -> None:
    plan = run_dir / PLAN_FILE
    data = plan.read_bytes()
    plan.write_bytes(data + b'plan_row("appended")\n')
    assert "after the last run seal are not sealed" in run_file_problems(run_dir)[PLAN_FILE]
    assert not [f for f in verify_run_files(run_dir) if f.status == "invalid"]
    plan.write_bytes(data.replace(b"baseline", b"BASELINE"))
    assert any("do not match the seal" in p for p in run_file_problems(run_dir).values())
    plan.write_bytes(data[:-10])
    assert any("truncated" in p for p in run_file_problems(run_dir).values())
    code, _, _ = cli("verify", run_dir)
    assert code == ExitCode.UNEXPECTED_OUTCOME


def test_plan_appends_add_a_seal_and_keep_every_older_one(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path, "exp")
    store.initialize(experiment_document("exp"), [plan_row("a")])
    store.initialize(experiment_document("exp"), [plan_row("a"), plan_row("b")])
    store.initialize(experiment_document("exp"), [plan_row("b")])  # nothing new: no seal
    seals = run_seals(store.directory)
    assert len(seals) == 2 and seals[-1][0] == len((store.directory / PLAN_FILE).read_bytes())
    (store.directory / "cases").mkdir(exist_ok=True)
    assert run_file_problems(store.directory) == {}


# ----------------------------------------------------------------------------- plan.jsonl


def test_a_torn_plan_tail_is_reported_then_cut_back_never_glued_to(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path, "exp")
    store.initialize(experiment_document("exp"), [plan_row("a")])
    plan = store.directory / PLAN_FILE
    sealed = plan.read_bytes()
    with plan.open("ab") as handle:
        handle.write(b'{"case_id": "tor')  # what a crash in the middle of an append leaves
    log = read_plan_log(store.directory)
    assert log.torn == len(b'{"case_id": "tor') and log.bad_lines == ()
    notes = store.initialize(experiment_document("exp"), [plan_row("a"), plan_row("b")])
    assert any("torn last line" in n for n in notes)
    data = plan.read_bytes()
    assert data.startswith(sealed) and b'"tor' not in data  # cut back to the sealed bytes
    assert json.loads(data[len(sealed) :]) == plan_row("b")
    log = read_plan_log(store.directory)
    assert [r.case_id for r in log.rows] == ["a", "b"]
    assert log.bad_lines == () and log.torn == 0
    assert run_file_problems(store.directory) == {}


def test_an_unsealed_line_that_is_no_row_is_cut_back_before_the_next_append(
    tmp_path: Path,
) -> None:
    store = ArtifactStore(tmp_path, "exp")
    store.initialize(experiment_document("exp"), [plan_row("a")])
    plan = store.directory / PLAN_FILE
    sealed = plan.read_bytes()
    with plan.open("ab") as handle:  # a torn line an older version terminated, never sealed
        handle.write(b'{"case_id": "tor\n')
    assert [line for line, _, _ in read_plan_log(store.directory).bad_lines] == [2]
    store.initialize(experiment_document("exp"), [plan_row("b")])
    data = plan.read_bytes()
    assert data.startswith(sealed) and json.loads(data[len(sealed) :]) == plan_row("b")
    assert run_file_problems(store.directory) == {}


def test_a_sealed_line_that_is_no_row_makes_the_run_invalid_for_every_reader(
    tmp_path: Path,
) -> None:
    store = ArtifactStore(tmp_path, "exp")
    store.initialize(experiment_document("exp"), [plan_row("a")])
    plan = store.directory / PLAN_FILE
    with plan.open("ab") as handle:  # what an older version terminated and then sealed
        handle.write(b'{"case_id": "tor\n')
    data = plan.read_bytes()
    experiment = (store.directory / "experiment.json").read_bytes()
    # the store itself never seals such a line: seal it as an older version did
    write_manifest(
        store.directory / "seals", run_seal_name(len(data)), run_seal_manifest(experiment, data)
    )
    problems = run_file_problems(store.directory)
    assert problems[PLAN_FILE].startswith("sealed line 2 is not a plan row (invalid JSON at byte")
    code, out, err = cli("verify", store.directory)
    assert code == ExitCode.UNEXPECTED_OUTCOME, (out, err)
    assert "sealed line 2 is not a plan row" in out + err
    with pytest.raises(InvalidRunError) as refused:
        store.initialize(experiment_document("exp"), [plan_row("a"), plan_row("b")])
    assert refused.value.exit_code == ExitCode.UNEXPECTED_OUTCOME
    assert "sealed line 2 is not a plan row" in str(refused.value)
    assert plan.read_bytes() == data  # nothing cut, nothing appended


def test_a_short_plan_append_on_a_full_disk_is_rolled_back(tiny_tmpfs: Path) -> None:
    store = ArtifactStore(tiny_tmpfs, "exp")
    store.initialize(experiment_document("exp"), [plan_row("a")])
    before = (store.directory / PLAN_FILE).read_bytes()
    filler = fill(tiny_tmpfs, 8192)
    rows = [plan_row(f"row-{i}") for i in range(160)]  # ~43 KiB
    with pytest.raises(StorageError, match="No space left") as caught:
        store.initialize(experiment_document("exp"), rows)
    assert caught.value.exit_code == ExitCode.RUNTIME_FAILURE
    assert (store.directory / PLAN_FILE).read_bytes() == before  # no torn tail left behind
    filler.unlink()
    store.initialize(experiment_document("exp"), rows)
    log = read_plan_log(store.directory)
    assert len(log.rows) == 161 and log.torn == 0 and log.bad_lines == ()


def test_a_publish_that_fails_leaves_no_temporary(tiny_tmpfs: Path) -> None:
    from pytest_logprob_drift.store.files import publish_bytes

    fill(tiny_tmpfs, 4096)
    with pytest.raises(StorageError) as caught:
        publish_bytes(tiny_tmpfs, "big.bin", b"x" * 65536)
    assert caught.value.exit_code == ExitCode.RUNTIME_FAILURE
    assert sorted(p.name for p in tiny_tmpfs.iterdir()) == ["filler"]
