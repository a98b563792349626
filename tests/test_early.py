"""The suite's early work (``tests/early.py``): values and exceptions reach the test that asks,
work not started when its test asks runs there, what has not started when the session ends is
dropped, nothing starts early in a pytest-xdist worker, background processes yield to the
tests' (a lower priority, inherited by what they start), and the ``early`` fixture without a
mark is a usage error naming the test (a real pytest session, in process).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import CancelledError

import pytest
from early import BACKGROUND_NICENESS, EarlyWork, yield_to_the_tests

pytest_plugins = ["pytester"]


@pytest.fixture
def not_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a test process of its own, where work starts early (also under pytest-xdist)."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)


@pytest.mark.usefixtures("not_a_worker")
def test_values_and_exceptions_reach_the_test_that_asks() -> None:
    started = threading.Event()
    release = threading.Event()

    def slow() -> str:
        started.set()
        release.wait(30)
        return threading.current_thread().name

    def failing() -> None:
        raise KeyError("planted")

    work = EarlyWork()
    work.start([slow, failing, slow])  # queued once each
    assert started.wait(30)
    release.set()
    assert work.result(slow) == "early-work"  # ran on the background thread
    with pytest.raises(KeyError, match="planted"):
        work.result(failing)
    work.finish()


@pytest.mark.usefixtures("not_a_worker")
def test_work_not_started_runs_where_its_test_asks_and_the_rest_is_dropped_at_the_end() -> None:
    started = threading.Event()
    release = threading.Event()

    def blocker() -> str:
        started.set()
        release.wait(30)
        return "blocker"

    def queued() -> str:
        return threading.current_thread().name

    ran: list[str] = []

    def never() -> str:
        ran.append("never")
        return "never"

    work = EarlyWork()
    work.start([blocker, queued, never])
    assert started.wait(30)
    assert work.result(queued) == threading.current_thread().name  # not started: run here
    # the session ends while 'blocker' runs and 'never' waits: 'never' is dropped, 'blocker'
    # is waited for
    finisher = threading.Thread(target=work.finish)
    finisher.start()
    deadline = time.monotonic() + 30
    while not work._futures[never].cancelled():  # finish has dropped what waits
        assert time.monotonic() < deadline, "finish did not drop the waiting work"
        time.sleep(0.01)
    assert finisher.is_alive()  # still waiting for 'blocker'
    release.set()
    finisher.join(30)
    assert not finisher.is_alive()
    assert work.result(blocker) == "blocker"
    with pytest.raises(CancelledError):
        work.result(never)
    assert ran == []


def test_nothing_starts_early_in_an_xdist_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    calls: list[str] = []

    def work() -> str:
        calls.append(threading.current_thread().name)
        return "done"

    early = EarlyWork()
    early.start([work])
    assert calls == []
    assert early.result(work) == "done" and calls == [threading.current_thread().name]
    early.finish()


def test_background_work_and_what_it_starts_yield_to_the_tests() -> None:
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    if ours + BACKGROUND_NICENESS > 19:
        pytest.skip(f"this process already runs at nice {ours}")

    def niceness() -> tuple[int, int]:
        yield_to_the_tests()
        thread = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(os.nice(0))"],
            capture_output=True,
            text=True,
            check=True,
        )
        return thread, int(child.stdout)

    result: list[tuple[int, int]] = []
    thread = threading.Thread(target=lambda: result.append(niceness()))
    thread.start()
    thread.join(60)
    assert result == [(ours + BACKGROUND_NICENESS, ours + BACKGROUND_NICENESS)]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == ours  # not this one


def test_the_early_fixture_without_a_mark_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import pytest
        from early import value_for

        @pytest.fixture
        def early(request):
            return value_for(request)
        """
    )
    pytester.makepyfile(
        test_early_use="""
        import pytest
        from early import starts_early

        def answer():
            return 42

        @starts_early(answer)
        def test_marked(early):
            assert early == 42

        def test_unmarked(early):
            pass
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["*UsageError: test_early_use.py::test_unmarked asks for 'early' without an early mark*"]
    )
