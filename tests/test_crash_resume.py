"""Crash and concurrency faults with real processes: kill -9 during artifact writing, then resume.

A driver (``python -c DRIVER``) imports the package and torch once, runs an uninterrupted
reference, then forks one ``run`` process per kill point: each runs the real CLI ``main`` with
``publish_bytes``, ``os.link``, ``os.mkdir`` and (in the main thread) ``os.fsync`` instrumented
to SIGKILL the process at its Nth file-system event. Each published file has three events
(temporary written; linked into place with the temporary still present; fully published); every
directory created (run, cases, seals, case, attempt, attribution directories) and every fsync
of the main thread (the plan.jsonl append, experiment.json, run seals, each COMPLETE, directory
entries) is one more. The kill points are every event of a full S0 run (experiment.json, the
plan rows and their run seal, nine files per case with COMPLETE last, the sealed attribution):
more than a hundred distinct points. After each kill the driver snapshots every file (digest,
size, mtime, inode), resumes with a normal ``run`` in a fresh forked process and snapshots
again; the tests then check that the killed process died of SIGKILL, that no partial attempt
was reused, that nothing that existed was modified or removed, that every sealed attempt and
the run's own files verify, and that the verdicts equal the uninterrupted run. Forking keeps a
kill point at ~0.3 s instead of a 3 s interpreter start; the driver itself never runs a torch
operation. The same driver also releases two ``run`` processes at once through one pipe onto
one experiment directory on a real disk, three times.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from drift_testing import S0

from pytest_logprob_drift.check.resume import check_attempt
from pytest_logprob_drift.check.verify import verify_run_files
from pytest_logprob_drift.store.layout import COMPLETE
from pytest_logprob_drift.store.run import iter_attempt_dirs
from pytest_logprob_drift.store.seal import SealError

EXPECT = "logp.backend=smoke_only.logp_offset=MISMATCH"
RUN_ARGS = [
    "run",
    str(S0),
    "--runtime",
    "cpu-smoke",
    "--allow-smoke-operators",
    "--expect",
    EXPECT,
    "--json",
]
FILES_PER_ATTEMPT = 9
MIN_KILL_POINTS = 100

DRIVER = r"""
import hashlib, json, os, re, signal, sys, threading
from pathlib import Path

import pytest_logprob_drift.store.files as files
import pytest_logprob_drift.cli.run_cmd  # noqa: F401  (torch and the execution modules, once)
import pytest_logprob_drift.runtimes.smoke.runtime  # noqa: F401
import pytest_logprob_drift.runtimes.smoke.kernels  # noqa: F401
from pytest_logprob_drift.store.layout import COMPLETE
from pytest_logprob_drift.cli import main

work = Path(sys.argv[1])
run_args = json.loads(sys.argv[2])
params = json.loads(sys.argv[3])  # {"part", "parts", "concurrent_dirs"}


RANDOM_PARTS = [
    (re.compile(r"[0-9a-f]{16}-[0-9]{8}T[0-9]{12}Z-[0-9a-f]{8}"), "<attribution>"),
    (re.compile(r"[0-9]{8}T[0-9]{12}Z-[0-9a-f]{8}"), "<attempt>"),
    (re.compile(r"\.[0-9a-f]{8}\.tmp"), ".<tmp>"),
]


def child(artifacts_dir, kill_at, out_name, barrier=None):
    # Body of a forked run process; never returns.
    count = [0]
    log = []

    def where(path):
        # The path inside the artifacts directory, without its random parts (attempt ids,
        # temporary suffixes), so that runs log the same events.
        text = os.path.relpath(path, artifacts_dir)
        for pattern, placeholder in RANDOM_PARTS:
            text = pattern.sub(placeholder, text)
        return text

    def event(what):
        count[0] += 1
        log.append(what)
        if count[0] == kill_at:
            with open(work / f"{out_name}.event", "w") as handle:
                handle.write(what)
            os.kill(os.getpid(), signal.SIGKILL)

    real_publish, real_link = files.publish_bytes, os.link
    real_mkdir, real_fsync = os.mkdir, os.fsync
    main_thread = threading.main_thread()

    def publish(directory, name, data, **kwargs):
        digest = real_publish(directory, name, data, **kwargs)
        event(f"published {name}")
        return digest

    def link(src, dst, *args, **kwargs):
        event(f"temporary written for {Path(dst).name}")
        real_link(src, dst, *args, **kwargs)
        event(f"linked {Path(dst).name} (temporary not yet removed)")

    def mkdir(path, *args, **kwargs):
        real_mkdir(path, *args, **kwargs)
        event(f"created directory {where(path)}")

    def fsync(fd):
        real_fsync(fd)
        if threading.current_thread() is main_thread:  # background syncs have no fixed order
            event(f"fsynced {where(os.readlink(f'/proc/self/fd/{fd}'))}")

    for module in list(sys.modules.values()):  # every binding, and files' own for later imports
        if getattr(module, "publish_bytes", None) is real_publish:
            module.publish_bytes = publish
    os.link = link
    os.mkdir = mkdir
    os.fsync = fsync
    rc = 99
    try:
        if barrier is not None:
            os.read(barrier, 1)  # start together with the sibling process
        with open(work / f"{out_name}.json", "w") as out, \
                open(work / f"{out_name}.err", "w") as err:
            rc = main(run_args + ["--artifacts", str(artifacts_dir)], out=out, err=err)
        with open(work / f"{out_name}.events", "w") as handle:
            json.dump(log, handle)
    finally:
        os._exit(rc)


def fork_child(*args):
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        child(*args)
    return pid


def wait(pid):
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status), "exit": None}
    return {"signal": None, "exit": os.WEXITSTATUS(status)}


def snapshot(directory):
    files = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            st = path.stat()
            files[str(path.relative_to(directory))] = [
                hashlib.sha256(path.read_bytes()).hexdigest(), st.st_size, st.st_mtime_ns,
                st.st_ino]
    return files


def read(name):
    path = work / name
    return path.read_text() if path.exists() else None


def kill_points(events):
    # Every file-system event of a full run.
    return list(range(1, len(events) + 1))


report = {}
if params["parts"]:
    status = wait(fork_child(work / "reference", 0, "reference"))
    events = json.loads(read("reference.events"))
    report["reference"] = {**status, "out": read("reference.json"), "events": events}
    points = []
    for n in kill_points(events)[params["part"]::params["parts"]]:
        artifacts_dir = work / f"point-{n}"
        killed = wait(fork_child(artifacts_dir, n, f"kill-{n}"))
        before = snapshot(artifacts_dir)
        resumed = wait(fork_child(artifacts_dir, 0, f"resume-{n}"))
        after = snapshot(artifacts_dir)
        points.append({"n": n, "killed": killed, "event": read(f"kill-{n}.event"),
                       "before": before, "resumed": resumed, "after": after,
                       "out": read(f"resume-{n}.json"), "err": read(f"resume-{n}.err"),
                       "dir": str(artifacts_dir)})
    report["points"] = points
if params["concurrent_dirs"]:
    rounds = []
    for r, artifacts_dir in enumerate(params["concurrent_dirs"]):
        read_end, write_end = os.pipe()
        pids = [fork_child(Path(artifacts_dir), 0, f"round-{r}-{i}", read_end)
                for i in range(2)]
        os.write(write_end, b"go")  # one byte each: both start at once
        statuses = [wait(pid) for pid in pids]
        os.close(read_end)
        os.close(write_end)
        rounds.append([{**statuses[i], "out": read(f"round-{r}-{i}.json"),
                        "err": read(f"round-{r}-{i}.err")} for i in range(2)])
    report["rounds"] = rounds
    report["concurrent_dirs"] = params["concurrent_dirs"]
json.dump(report, sys.stdout)
"""


def start_driver(work: Path, params: dict[str, Any]) -> subprocess.Popen[str]:
    work.mkdir(parents=True, exist_ok=True)
    # one intra-op thread: the tensors are tiny and idle OpenMP workers spinning on a shared
    # two-core machine cost more than they give
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(work), json.dumps(RUN_ARGS), json.dumps(params)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=work,
        env=env,
    )


def finish_driver(proc: subprocess.Popen[str]) -> dict[str, Any]:
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-4000:]
    report: dict[str, Any] = json.loads(stdout)
    return report


@pytest.fixture(scope="module")
def drivers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[dict[str, Any]]]:
    """Two driver processes, started together (the machine has two cores): each runs the
    reference and half of the kill points; the second also runs the concurrency rounds, on a
    real disk. Crash work lives on tmpfs when available (fsync is free there; kill -9
    semantics are the same, a killed process loses nothing the kernel already has)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        scratch = Path(tempfile.mkdtemp(prefix="logprob-drift-crash-", dir=shm))
    else:
        scratch = tmp_path_factory.mktemp("crash")
    disk = tmp_path_factory.mktemp("concurrent")
    rounds = [str(disk / f"runs-{r}") for r in range(3)]
    try:
        procs = [
            start_driver(
                scratch / name,
                {"part": i, "parts": 2, "concurrent_dirs": rounds if i else []},
            )
            for i, name in enumerate("ab")
        ]
        yield [finish_driver(proc) for proc in procs]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def verdicts(out: str) -> dict[str, tuple[Any, ...]]:
    document = json.loads(out)
    return {
        r["case_id"]: (
            r["label"],
            r["outcome"],
            r["active_tokens"],
            r["mismatches"],
            r["max_abs_diff"],
        )
        for r in document["results"]
    }


@pytest.mark.slow
def test_kill_nine_at_every_file_system_event_then_resume(
    drivers: list[dict[str, Any]],
) -> None:
    """Every file-system event of a full run is a kill point: more than a hundred."""
    reports = drivers
    reference = reports[0]["reference"]
    assert reference["exit"] == 0, reference
    expected = verdicts(reference["out"])
    assert sorted(v[1] for v in expected.values()) == ["MISMATCH", "PASS", "PASS"]
    events = reference["events"]
    assert reports[1]["reference"]["events"] == events  # the event sequence is deterministic
    published = [e.removeprefix("published ") for e in events if e.startswith("published ")]
    # experiment.json and the run seal of the plan rows, then 9 files per case, COMPLETE last
    assert published[0] == "experiment.json" and published[1].startswith("run-")
    assert published[2 : 2 + FILES_PER_ATTEMPT * len(expected)].count(COMPLETE) == len(expected)
    # three events per file the store publishes (temporary written, linked, published)
    linked = [e.split(" ")[1] for e in events if e.startswith("linked ")]
    assert [e.split(" ")[3] for e in events if e.startswith("temporary written")] == linked
    assert len(linked) >= len(published)  # (the attribution publishes without the wrapper)
    assert any(e.endswith("/plan.jsonl") and e.startswith("fsynced ") for e in events)
    assert sum(e.startswith("created directory ") for e in events) >= 2 * len(expected)

    points = [p for r in reports for p in r["points"]]
    covered = {p["n"] for p in points}
    assert len(covered) == len(points)
    assert len(covered) == len(events) >= MIN_KILL_POINTS  # every event is a kill point
    for point in sorted(points, key=lambda p: p["n"]):
        _check_point(point, expected, events)


def _check_point(
    point: dict[str, Any], expected: dict[str, tuple[Any, ...]], events: list[str]
) -> None:
    n = point["n"]
    where = f"kill point {n} ({events[n - 1]})"
    assert point["killed"] == {"signal": 9, "exit": None}, where
    assert point["event"] == events[n - 1], where
    assert point["resumed"] == {"signal": None, "exit": 0}, (where, point["err"])

    # nothing that existed before the resume was modified, replaced or removed
    before, after = point["before"], point["after"]
    for path, stat in before.items():
        assert after.get(path) == stat, f"{where}: {path} changed by the resume"

    # the verdicts equal an uninterrupted run
    assert verdicts(point["out"]) == expected, where

    root = Path(point["dir"])
    results = json.loads(point["out"])["results"]
    for result in results:
        attempt = Path(result["attempt_dir"])
        rel = str(attempt.relative_to(root))
        complete_before = f"{rel}/{COMPLETE}" in before
        if result["reused"]:
            # only an attempt that was already sealed before the resume may be reused
            assert complete_before, f"{where}: reused {rel}, which was not sealed"
        else:
            assert not any(p.startswith(rel + "/") for p in before), (
                f"{where}: a new attempt reused the directory {rel}"
            )

    # the run's own files verify against their seals (nothing sealed was rewritten)
    run_files = verify_run_files(root / "s0-cpu-smoke")
    assert [f for f in run_files if f.status == "invalid"] == [], where
    assert run_files[-1].file == "plan.jsonl" and "torn" not in run_files[-1].detail, where

    # every attempt that carries a seal verifies; unsealed ones were all left by the kill
    for attempt in iter_attempt_dirs(root / "s0-cpu-smoke"):
        rel = str(attempt.relative_to(root))
        if (attempt / COMPLETE).exists():
            try:
                check_attempt(attempt, expected_key=None)
            except SealError as exc:  # pragma: no cover - reported with context
                pytest.fail(f"{where}: sealed attempt {rel} does not verify: {exc}")
        else:
            assert any(p.startswith(rel + "/") for p in before) or not any(
                True for _ in attempt.iterdir()
            ), f"{where}: the resume left an unsealed attempt {rel}"
    # the attempts the kill left unsealed are still unsealed, and none of them was reused
    unsealed = {p.rsplit("/", 1)[0] for p in before if p.count("/") == 4} - {
        p.rsplit("/", 1)[0] for p in before if p.endswith(f"/{COMPLETE}")
    }
    for rel in unsealed:
        assert not (root / rel / COMPLETE).exists(), f"{where}: {rel} was completed later"


@pytest.mark.slow
def test_two_concurrent_runs_of_one_experiment_directory(drivers: list[dict[str, Any]]) -> None:
    """Two run processes released together by one pipe, on a real disk, three times."""
    report = drivers[1]
    dirs = [Path(d) for d in report["concurrent_dirs"]]
    raced = 0
    for artifacts, pair in zip(dirs, report["rounds"], strict=True):
        for process in pair:
            assert process == {**process, "signal": None, "exit": 0}, process["err"]
            assert "Traceback" not in process["err"]
        results = [{r["case_id"]: r for r in json.loads(p["out"])["results"]} for p in pair]
        run_dir = artifacts / "s0-cpu-smoke"

        # every attempt on disk is sealed and verifies; no temporaries are left behind
        attempts = list(iter_attempt_dirs(run_dir))
        assert 3 <= len(attempts) <= 6
        for attempt in attempts:
            check_attempt(attempt, expected_key=None)
            assert not [p.name for p in attempt.iterdir() if p.name.startswith(".")]
        # each process's attempt exists, verifies and agrees with the other process's
        assert results[0].keys() == results[1].keys() and len(results[0]) == 3
        for case_id, first in results[0].items():
            second = results[1][case_id]
            assert (
                first["outcome"],
                first["mismatches"],
                first["active_tokens"],
                first["max_abs_diff"],
            ) == (
                second["outcome"],
                second["mismatches"],
                second["active_tokens"],
                second["max_abs_diff"],
            )
            if first["attempt_dir"] != second["attempt_dir"]:
                raced += 1
                assert not (first["reused"] and second["reused"])
            for r in (first, second):
                checked = check_attempt(Path(r["attempt_dir"]), expected_key=None)
                assert checked.outcome.value == r["outcome"]
        # the shared files were written once: one experiment.json, one plan row per case
        plan_rows = (run_dir / "plan.jsonl").read_text().splitlines()
        assert sorted(json.loads(row)["case_id"] for row in plan_rows) == sorted(results[0])
        assert (
            json.loads((run_dir / "experiment.json").read_text())["experiment_id"] == "s0-cpu-smoke"
        )
        assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]
    assert raced > 0  # the two processes really did execute the same cases at the same time
