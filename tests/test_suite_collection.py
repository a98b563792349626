"""The suite's collection stays cheap: the fast loop's collection imports no vLLM (every module
is collected, the slow ones it deselects included), the suite's conftest imports no torch (an
xdist controller loads it and collects nothing: it took 2 s of a 2-core machine while the
workers started), and ``skip_unless_installed`` skips a module without importing what it looks
for."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from drift_testing import ROOT

pytest_plugins = ["pytester"]

COLLECT = """
import json, sys
import pytest
code = pytest.main(
    ["--collect-only", "-q", "-p", "no:cacheprovider", "-m", "not slow and not process", "tests"]
)
vllm = sorted(m for m in sys.modules if m == "vllm" or m.startswith("vllm."))
print("COLLECTED " + json.dumps({"code": int(code), "vllm": vllm[:20]}))
"""


@pytest.mark.process
def test_the_fast_loops_collection_imports_no_vllm() -> None:
    done = subprocess.run(
        [sys.executable, "-c", COLLECT], cwd=ROOT, capture_output=True, text=True, check=False
    )
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("COLLECTED ")]
    result = json.loads(line.removeprefix("COLLECTED "))
    assert result["code"] == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert result["vllm"] == [], result["vllm"]
    assert " deselected" in done.stdout  # the slow modules were collected, then deselected


CONFTEST = """
import json, sys
sys.path.insert(0, "tests")
import conftest
heavy = sorted(m for m in ("torch", "transformers", "vllm", "matplotlib") if m in sys.modules)
print("LOADED " + json.dumps(heavy))
"""


@pytest.mark.process
def test_the_suites_conftest_imports_no_engine_library() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CONFTEST], cwd=ROOT, capture_output=True, text=True, check=False
    )
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("LOADED ")]
    assert json.loads(line.removeprefix("LOADED ")) == [], done.stderr[-3000:]


def test_a_missing_distribution_skips_the_module_and_a_present_one_is_not_imported(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_missing=(
            "from drift_testing import skip_unless_installed\n"
            "skip_unless_installed('no_such_distribution_for_drift_tests')\n"
            "def test_never(): raise AssertionError('ran')\n"
        ),
        test_present=(
            "import sys\n"
            "from drift_testing import skip_unless_installed\n"
            "assert 'this' not in sys.modules\n"
            "skip_unless_installed('this')\n"  # the standard library's, printed on import
            "def test_found_not_imported(): assert 'this' not in sys.modules\n"
        ),
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*no_such_distribution_for_drift_tests is not installed*"])
