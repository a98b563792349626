"""Work a test only waits for, started on a spare core as soon as the session's tests are collected.

Owns ``starts_early(work)`` (the mark ``pytest.mark.early`` with ``work`` as its argument),
the session's ``EarlyWork`` (``SESSION``), what the ``early`` fixture reads (``value_for``;
``early_value`` for a module fixture) and the lower priority of background processes
(``yield_to_the_tests``). ``work`` is a callable without
arguments that spends its time waiting for another process (a fresh interpreter, a chat
template renderer that must run into its time bound); the test asks for the ``early`` fixture
and gets ``work()``'s return value (or its exception, raised there). ``tests/conftest.py``
hands the marked work of the selected tests (after ``-k`` and ``-m``) to one background thread
once collection ends, in collection order, so that while the test process runs other tests,
those processes run on the machine's other core; a test whose work has not started yet runs it
at once. The background thread, and every process it starts, runs ``BACKGROUND_NICENESS``
levels lower than the tests, so it takes a core only where the tests leave one idle. Under
pytest-xdist nothing starts early (every worker collects every test, and both
cores are busy anyway): the work runs when its test asks for it, as it would without this.

Use it only for work whose inputs are fixed when the module is imported (its scratch space made
by the work itself, as ``tempfile.mkdtemp``), that reads nothing a fixture or ``monkeypatch``
sets up, and whose figures do not depend on the machine being otherwise idle.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

Work = Callable[[], Any]


class EarlyWork:
    """The session's early work: one future per distinct callable, run by one thread."""

    def __init__(self) -> None:
        self._futures: dict[Work, Future[Any]] = {}
        self._queue: list[Work] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self, works: Iterable[Work]) -> None:
        """Queue ``works`` (in order, each once) and start the background thread, unless this
        process is a pytest-xdist worker."""
        if in_an_xdist_worker():
            return
        with self._lock:
            for work in works:
                if work not in self._futures:
                    self._futures[work] = Future()
                    self._queue.append(work)
            if self._queue and self._thread is None:
                self._thread = threading.Thread(target=self._drain, name="early-work", daemon=True)
                self._thread.start()

    def _next(self) -> tuple[Work, Future[Any]] | None:
        with self._lock:
            while self._queue:
                work = self._queue.pop(0)
                future = self._futures[work]
                if future.set_running_or_notify_cancel():
                    return work, future
            self._thread = None
            return None

    def _drain(self) -> None:
        yield_to_the_tests()  # this thread and the processes it starts
        while (item := self._next()) is not None:
            _run(*item)

    def result(self, work: Work) -> Any:
        """``work()``'s value: waited for when it was started early, run here otherwise."""
        with self._lock:
            future = self._futures.setdefault(work, Future())
            runs_here = not (future.running() or future.done())  # not started: start it here
            if runs_here:
                future.set_running_or_notify_cancel()
                if work in self._queue:
                    self._queue.remove(work)
        if runs_here:
            _run(work, future)
        return future.result()

    def finish(self) -> None:
        """Drop what has not started and wait for what has (the session is ending)."""
        with self._lock:
            for work in self._queue:
                self._futures[work].cancel()
            self._queue.clear()
            thread = self._thread
        if thread is not None:
            thread.join()


def in_an_xdist_worker() -> bool:
    """Whether this process is a pytest-xdist worker (its peer keeps the other core busy: no
    work starts early and nothing is given a lower priority)."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


BACKGROUND_NICENESS = 10
"""How much lower than the tests' the priority of background work is: the scheduler gives a
busy test process about ten times a background process's share of a core, so background work
no longer takes the core a test runs on (three busy processes on two cores made the first
tests twice as slow) and still uses whatever core the tests leave idle."""


def yield_to_the_tests(pid: int | None = None) -> None:
    """Lower the priority of process ``pid`` (None: the calling thread; on Linux the nice
    value is a thread's, and a process it starts inherits it) by ``BACKGROUND_NICENESS``."""
    who = threading.get_native_id() if pid is None else pid
    os.setpriority(os.PRIO_PROCESS, who, os.getpriority(os.PRIO_PROCESS, who) + BACKGROUND_NICENESS)


def _run(work: Work, future: Future[Any]) -> None:
    try:
        future.set_result(work())
    except BaseException as exc:  # raised again in the test that asks
        future.set_exception(exc)


@contextmanager
def scratch() -> Iterator[Path]:
    """A directory of the work's own (it runs before its test's ``tmp_path`` exists), removed
    when the block ends: whatever the test asserts about it is measured inside the block."""
    directory = Path(tempfile.mkdtemp(prefix="logprob-drift-early-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def python_process(
    code: str, *, cwd: Path | None = None, timeout: float = 120
) -> Callable[[], subprocess.CompletedProcess[str]]:
    """Work: ``python -c code`` in a fresh interpreter (its streams captured as text, no
    exception for a non-zero exit), the ``subprocess.CompletedProcess`` its value."""
    return functools.partial(
        subprocess.run,
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


SESSION = EarlyWork()
"""This test process's early work (``tests/conftest.py`` starts it and ends it)."""


def early_value(work: Work) -> Any:
    """``work()``'s value for a fixture wider than a test (a module's pair of processes): the
    one started once collection ended when a selected test carries ``starts_early(work)``, or
    computed here. The ``early`` fixture is this for a test's own mark."""
    return SESSION.result(work)


def value_for(request: pytest.FixtureRequest) -> Any:
    """The ``early`` fixture's value: the work of the test's ``early`` mark, its value (a
    ``pytest.UsageError`` naming the test when it has no such mark)."""
    work = marked_work(request.node)
    if work is None:
        raise pytest.UsageError(f"{request.node.nodeid} asks for 'early' without an early mark")
    return early_value(work)


def starts_early(work: Work) -> pytest.MarkDecorator:
    """The ``early`` mark carrying ``work`` (``pytest.mark.early(f)`` alone would decorate
    ``f`` itself)."""
    return pytest.mark.early.with_args(work)


def marked_work(item: pytest.Item) -> Work | None:
    """The work of an item's ``early`` mark (None: it has none)."""
    mark = item.get_closest_marker("early")
    if mark is None:
        return None
    (work,) = mark.args
    return work  # type: ignore[no-any-return]
