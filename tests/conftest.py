"""Shared fixtures and markers of the suite.

``slow`` marks every test that starts a real engine (a transformers model, FSDP rank
processes, a vLLM engine), a browser, a pytest-xdist sub-session or the kill -9 loop;
``pytest -m "not slow"`` is the fast loop. Repository paths and the
runner wiring live in ``drift_testing`` (importable because this directory is on sys.path);
``cli_process`` runs ``logprob-drift`` commands as processes forked from one server per test
process (``cli_processes``).
"""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_processes import ForkServer
from early import SESSION, in_an_xdist_worker, marked_work, value_for, yield_to_the_tests
from tmpfs import small_tmpfs

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
    """A 64 KiB tmpfs (root only): a disk that fills up (``tmpfs.small_tmpfs``)."""
    with small_tmpfs(tmp_path / "small") as mount:
        if isinstance(mount, str):
            pytest.skip(mount)
        yield mount


_EARLY_SERVER: list[ForkServer] = []
"""The fork server started once the session's tests are collected, if one of them uses it."""


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
        server = ForkServer(scratch)
        if not in_an_xdist_worker():  # its imports, in the background
            yield_to_the_tests(server.process.pid)
        _EARLY_SERVER.append(server)
    SESSION.start(work for item in items if (work := marked_work(item)) is not None)


@pytest.fixture
def early(request: pytest.FixtureRequest) -> Any:
    """What the test's ``pytest.mark.early(work)`` gave: ``work()``'s value, computed in the
    background since collection ended (``tests/early.py``), or here if it had not started."""
    return value_for(request)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Take everything collection imported (torch, transformers, vLLM: over a million objects)
    out of the cyclic garbage collector's full passes, and make those passes rarer (one per
    100 younger ones instead of 10): each full pass over that heap took about 0.4 s, and the
    fast loop made 18 of them (6.9 s of 89 s). Objects the tests create are still collected;
    the session's end gives the frozen ones back (``pytest_unconfigure``)."""
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 100)


_FINISHED: list[pytest.Session] = []
"""The session, once it has finished (its exit status is the process's)."""


def _exit_without_teardown() -> None:
    """Run every other ``atexit`` handler, then end the process with the session's status,
    skipping Python's finalization of its heap: what torch, transformers and vLLM leave (over
    a million objects, native destructors) took 2-4 s of wall time after the last test, and
    checks nothing. Registered last (at unconfigure), so it runs first and no handler runs
    twice."""
    atexit.unregister(_exit_without_teardown)
    atexit._run_exitfuncs()  # the others, last registered first, as at any exit
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(_FINISHED[-1].exitstatus))


def _pytest_is_the_program() -> bool:
    """Whether this process is ``pytest`` or ``python -m pytest`` (whose exit status is the
    session's), not a program that called ``pytest.main`` and goes on."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return getattr(spec, "name", None) == "pytest.__main__" or Path(sys.argv[0]).name in {
        "pytest",
        "py.test",
    }


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Close an early server no test ended up using (``-x``, a deselecting ``-k``), and end the
    early work (what has not started is dropped)."""
    _FINISHED.append(session)
    SESSION.finish()
    while _EARLY_SERVER:
        server = _EARLY_SERVER.pop()
        server.close()
        shutil.rmtree(server.scratch, ignore_errors=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Give the frozen heap back (a native extension such as triton's reports what was never
    finalized as leaks when the heap is torn down). A test process of its own (``pytest``,
    no pytest-xdist workers and not one of them) whose session finished then exits without
    that teardown (``_exit_without_teardown``)."""
    gc.unfreeze()
    alone = getattr(config.option, "dist", "no") == "no" and not in_an_xdist_worker()
    if alone and _FINISHED and _pytest_is_the_program():
        atexit.register(_exit_without_teardown)


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
