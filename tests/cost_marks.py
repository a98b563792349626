"""The fast loop's two costly imports, refused in a test not marked for them.

The fast loop (``-m "not slow and not process"``) imports no vLLM and draws no figure: vLLM's
import took about 10 s of CPU in each test process (and 1 s more at its exit), a report page's
matplotlib figures about 1 s each, together over a third of the loop. A test that does either
is ``slow`` (or ``process``). These hooks hold the suite to it: a test, its fixtures included,
that brings one of them into a process where it was not loaded yet fails in teardown, naming
the mark it lacks. Once a slow test of the same process has loaded it, nothing is checked;
the fast loop loads neither, so there every unmarked test is checked.
"""

from __future__ import annotations

import sys

import pytest

COSTLY = {
    "vllm": "imports vLLM (about 10 s of CPU in each test process)",
    "matplotlib.figure": "draws report figures (matplotlib: about 1 s a page)",
}
_LOADED = pytest.StashKey[frozenset[str]]()


def _loaded() -> frozenset[str]:
    return frozenset(name for name in COSTLY if name in sys.modules)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_LOADED] = _loaded()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    if any(item.get_closest_marker(mark) is not None for mark in ("slow", "process")):
        return
    brought = sorted(_loaded() - item.stash.get(_LOADED, frozenset()))
    if brought:
        pytest.fail(
            f"{item.nodeid} {COSTLY[brought[0]]} but is not marked @pytest.mark.slow: "
            "the fast loop imports no vLLM and draws no figure",
            pytrace=False,
        )
