"""Shared fixtures and markers of the suite.

``slow`` marks every test that starts a real engine (a transformers model, FSDP rank
processes, a vLLM engine), a browser, a pytest-xdist sub-session or the kill -9 loop;
``pytest -m "not slow"`` is the fast loop. Repository paths and the
runner wiring live in ``drift_testing`` (importable because this directory is on sys.path);
``cli_process`` runs ``logprob-drift`` commands as processes forked from one server per test
process (``cli_processes``).
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_processes import ForkServer
from early import EarlyWork, marked_work

# The suite keeps Python's compiled-module cache on (``__pycache__``, git-ignored) even where the
# environment turns it off (``PYTHONDONTWRITEBYTECODE``): without it every test process, and
# every CLI or pytest subprocess a test starts, compiles the package and pytest rewrites each
# test module again (collect-only measured 23.4 s of CPU without the cache, 7.7 s with it).
# Nothing a test asserts depends on it.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# The suite runs torch on one intra-op thread (set before any test module imports torch, and
# inherited by every process a test starts; vLLM's CPU workers pick their own): its tensors are
# tiny, so a second thread costs more in synchronization than it saves, and the more so with
# two xdist workers on two cores (a set of six files took 29.8 s instead of 46.6 s). A run in
# this process and the same run in a subprocess agree bitwise only at the same thread count,
# which this also keeps. Set ``OMP_NUM_THREADS`` to choose otherwise.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def torch_threads_kept() -> Iterator[None]:
    """A test that changes torch's intra-op thread count (``torch.set_num_threads``) does not
    leak it into the later tests of the same worker process: a run in this process and the
    same run in a subprocess agree bitwise only at the same thread count
    (``test_ray_launcher`` compares the two). Never imports torch itself."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    if torch is not None and before is not None and torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    """A scratch directory on tmpfs when there is one (fsync is free there; behaviour is the
    same), else pytest's ``tmp_path``. The CLI tests exercise a real disk."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    directory = Path(tempfile.mkdtemp(prefix="logprob-drift-test-", dir=shm))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (root only): a disk that fills up."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


_EARLY_SERVER: list[ForkServer] = []
"""The fork server started once the session's tests are collected, if one of them uses it."""


_EARLY_WORK = EarlyWork()


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Start the ``cli_process`` server now when a collected test uses it: its imports (about
    5 s of torch and transformers) then overlap the tests before its first use. Then start the
    selected tests' ``early`` work (``tests/early.py``) on one background thread."""
    if not _EARLY_SERVER and any(
        "cli_process" in getattr(item, "fixturenames", ()) for item in items
    ):
        scratch = Path(tempfile.mkdtemp(prefix="logprob-drift-cli-process-"))
        _EARLY_SERVER.append(ForkServer(scratch))
    _EARLY_WORK.start(work for item in items if (work := marked_work(item)) is not None)


@pytest.fixture
def early(request: pytest.FixtureRequest) -> Any:
    """What the test's ``pytest.mark.early(work)`` gave: ``work()``'s value, computed in the
    background since collection ended (``tests/early.py``), or here if it had not started."""
    work = marked_work(request.node)
    if work is None:
        raise pytest.UsageError(f"{request.node.nodeid} asks for 'early' without an early mark")
    return _EARLY_WORK.result(work)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Take everything collection imported (torch, transformers, vLLM: over a million objects)
    out of the cyclic garbage collector's full passes, and make those passes rarer (one per
    100 younger ones instead of 10): each full pass over that heap took about 0.4 s, and the
    fast loop made 18 of them (6.9 s of 89 s). Objects the tests create are still collected;
    the session's end gives the frozen ones back (``pytest_unconfigure``)."""
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 100)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Close an early server no test ended up using (``-x``, a deselecting ``-k``), and end the
    early work (what has not started is dropped)."""
    _EARLY_WORK.finish()
    while _EARLY_SERVER:
        server = _EARLY_SERVER.pop()
        server.close()
        shutil.rmtree(server.scratch, ignore_errors=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The heap is torn down as usual at exit (a native extension such as triton's reports
    what was never finalized as leaks otherwise)."""
    gc.unfreeze()


@pytest.fixture(scope="session")
def cli_process() -> Iterator[ForkServer]:
    """``cli_process(*argv, env=, cwd=, seconds=, memory_bytes=)``: ``logprob-drift ARGV`` as a
    child forked from one server per test process (per xdist worker) that imported torch,
    matplotlib, transformers' ``AutoTokenizer`` and the CLI once: a ``Finished`` (exit code,
    stdout, stderr, wall time, peak resident growth). Started once the tests are collected
    (or at the first test that asks for it), closed at the end of the session. See
    ``cli_processes``."""
    server = (
        _EARLY_SERVER.pop()
        if _EARLY_SERVER
        else ForkServer(Path(tempfile.mkdtemp(prefix="logprob-drift-cli-process-")))
    )
    try:
        yield server
    finally:
        server.close()
        shutil.rmtree(server.scratch, ignore_errors=True)
