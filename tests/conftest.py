"""Shared fixtures, markers and hypothesis profiles of the suite.

Markers by cost (pyproject's ``markers``): ``slow`` for a test that starts a real engine (a
transformers model, a vLLM engine), torch.distributed rank processes (FSDP, gloo), a browser, a
pytest-xdist sub-session or the kill -9 loop; ``process`` for one that needs a fresh
interpreter, ``sys.modules`` at exit, an ``RLIMIT_AS`` or timer bound, or non-UTF-8 argv. The
fast loop is ``pytest -n 2 -m "not slow and not process"``; CI runs everything. Hypothesis draws
``HYPOTHESIS_PROFILE`` examples: ``dev`` (the default, small budgets) or ``ci`` (set by
``.ci/run``). Modules run heavy first (``module_order``). Repository paths and the runner
wiring live in ``drift_testing`` (importable because this directory is on sys.path);
``cli_process``, for ``process`` tests only, runs
``logprob-drift`` commands as processes forked from one server per test process
(``cli_processes``).
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cost_marks import pytest_runtest_setup, pytest_runtest_teardown  # noqa: F401
from hypothesis import settings
from module_order import heavy_modules_first, keep_collection_order
from tmpfs import small_tmpfs

if TYPE_CHECKING:  # the fork server's helpers import torch: only the fixture that starts one
    from cli_processes import ForkServer

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

# vLLM's engine core runs in the process that builds the engine
# (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, inherited by every process a test starts), and at TP 1
# its worker too (the ``uni`` executor):
# on the CPU build each engine otherwise starts two fresh interpreters that import vLLM (a
# one-engine CLI run took 37.3 s instead of 16.1 s here; a second engine in the same process
# 1.5 s). The scores are bitwise the same either way, and the runtime gives the process back
# what vLLM changes in it at close (``engine.restore_caller_process``). A module about vLLM's own
# processes (their count, titles, shared memory, log files) is marked ``vllm_processes`` and
# builds its engines as vLLM does by default (``vllm_engine_placement``); set the variable to
# 1 to run the whole suite that way.
ENGINE_CORE_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
os.environ.setdefault(ENGINE_CORE_ENV, "0")

# Example budgets (a test states its own ``max_examples`` only where it needs fewer, e.g. each
# example starts processes). ``ci``: hypothesis' default budget, what CI has always run; ``dev``:
# a tenth of it, for the fast loop. No deadline in either: a shared machine's timing is no
# property of the code.
settings.register_profile("ci", max_examples=100, deadline=None)
settings.register_profile("dev", max_examples=10, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


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


@pytest.fixture(autouse=True, scope="module")
def vllm_engine_placement(request: pytest.FixtureRequest) -> Iterator[None]:
    """Where a module's vLLM engines run, and the test process given back after them.

    In a module marked ``vllm_processes``: vLLM's engine core and workers in processes of
    their own, vLLM's default, for the module's engines (module fixtures included) and the
    processes its tests start (vLLM reads the variable through a cache an earlier engine core
    in this process may have turned on; its own ``disable_envs_cache`` turns it off). After
    every module: what a plain ``vllm.LLM`` built here by a test (an independent check,
    outside the project's engine, which gives it back itself at close) left in this process
    is undone, so that no later module sees it: vLLM's CPU worker replaces
    ``torch.set_num_threads`` with a no-op, and the engine core freezes vLLM's environment."""
    with pytest.MonkeyPatch.context() as patch:
        if request.node.get_closest_marker("vllm_processes") is not None:
            patch.setenv(ENGINE_CORE_ENV, "1")
            _give_back_the_process()
        yield
    _give_back_the_process()


def _give_back_the_process() -> None:
    """The runtime's own undo (``engine.restore_caller_process``), to torch's own
    ``set_num_threads``; nothing to do, and nothing imported, before torch or vLLM is."""
    torch: Any = sys.modules.get("torch")
    if torch is None and "vllm.envs" not in sys.modules:
        return
    from pytest_logprob_drift.runtimes.vllm.engine import restore_caller_process

    restore_caller_process(None if torch is None else torch._C.set_num_threads)


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


def pytest_configure(config: pytest.Config) -> None:
    """``--dist loadfile`` hands out modules in collection's order (``module_order``)."""
    keep_collection_order(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Heavy modules first (``module_order``). A test that uses ``cli_process`` without
    the ``process`` mark is a usage error: the fork server's imports (seconds) stay out of the
    fast loop."""
    heavy_modules_first(items)
    unmarked = [
        item.nodeid
        for item in items
        if "cli_process" in getattr(item, "fixturenames", ())
        and item.get_closest_marker("process") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            f"uses cli_process without @pytest.mark.process: {', '.join(unmarked)}"
        )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Take everything collection imported (torch, transformers, vLLM: over a million objects)
    out of the cyclic garbage collector's full passes, and make those passes rarer (one per
    100 younger ones instead of 10): each full pass over that heap took about 0.4 s, and the
    fast loop made 18 of them (6.9 s of 89 s). Objects the tests create are still collected;
    the session's end gives the frozen ones back (``pytest_unconfigure``)."""
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 100)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Give the frozen heap back (a native extension such as triton's reports what was never
    finalized as leaks when the heap is torn down)."""
    gc.unfreeze()


@pytest.fixture(scope="session")
def cli_process() -> Iterator[ForkServer]:
    """``cli_process(*argv, env=, cwd=, seconds=, memory_bytes=)``: ``logprob-drift ARGV`` as a
    child forked from one server per test process (per xdist worker) that imported torch,
    matplotlib, transformers' ``AutoTokenizer`` and the CLI once: a ``Finished`` (exit code,
    stdout, stderr, wall time, peak resident growth). Started at the first ``process`` test
    that asks for it, closed at the end of the session. See ``cli_processes``."""
    from cli_processes import ForkServer

    server = ForkServer(Path(tempfile.mkdtemp(prefix="logprob-drift-cli-process-")))
    try:
        yield server
    finally:
        server.close()
        shutil.rmtree(server.scratch, ignore_errors=True)


@pytest.fixture(scope="session")
def sealed_s0(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The S0 smoke experiment run once per test process (``drift_testing.run_s0``): the
    artifacts root that holds ``s0-cpu-smoke/``. Shared read-only: a test or module fixture
    takes its own copy (``drift_testing.copy_of_s0``) before it reads, reports or tampers."""
    from drift_testing import run_s0

    artifacts = tmp_path_factory.mktemp("sealed-s0") / "runs"
    code, out, err = run_s0(artifacts)
    assert code == 0, out + err
    return artifacts
