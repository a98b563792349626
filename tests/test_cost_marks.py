"""The fast loop's cost guard (``cost_marks``): a test not marked ``slow`` that draws figures
fails in teardown naming the mark; a ``slow`` or ``process`` one passes, and once a process has
loaded the import nothing later is checked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = Path(__file__).parent


@pytest.mark.process  # a fresh interpreter: matplotlib's figure module not loaded yet
def test_an_unmarked_test_that_draws_fails_and_a_marked_one_passes(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    )
    pytester.makeini("[pytest]\nmarkers =\n    slow: s\n    process: p\n")
    pytester.makeconftest(
        "from cost_marks import pytest_runtest_setup, pytest_runtest_teardown  # noqa: F401\n"
    )
    draws = "def test_draws():\n    import matplotlib.figure\n"
    pytester.makepyfile(
        test_a_cheap="def test_cheap():\n    import json\n",
        test_b_unmarked=draws,
    )
    pytester.makepyfile(
        test_c_marked="import pytest\n\n@pytest.mark.slow\n" + draws,
        test_d_process="import pytest\n\n@pytest.mark.process\n" + draws,
    )
    unmarked = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "test_a_cheap.py", "test_b_unmarked.py"
    )
    unmarked.assert_outcomes(passed=2, errors=1)
    unmarked.stdout.fnmatch_lines(
        [
            "*test_b_unmarked.py::test_draws draws report figures (matplotlib: about 1 s a page) "
            "but is not marked @pytest.mark.slow: the fast loop imports no vLLM and draws no "
            "figure"
        ]
    )
    marked = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "test_c_marked.py", "test_b_unmarked.py"
    )
    marked.assert_outcomes(passed=2)  # loaded by the slow test first: nothing more to check
    process = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_d_process.py")
    process.assert_outcomes(passed=1)
