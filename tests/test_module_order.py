"""The suite's module order (``module_order``): heavy modules first, each module's tests kept
together in their own order, pytest-xdist's re-sort by test count off in this session, and
``-n N`` alone handing out whole modules."""

from __future__ import annotations

import pytest
from module_order import heavy_modules_first, keep_collection_order

pytest_plugins = ["pytester"]


def test_modules_run_by_cost_class_each_kept_together(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmarkers =\n    slow: s\n    process: p\n")
    pytester.makepyfile(
        test_a_fast="def test_1(): pass\ndef test_2(): pass\n",
        test_b_fast="def test_1(): pass\ndef test_2(): pass\ndef test_3(): pass\n",
        test_c_process=(
            "import pytest\ndef test_1(): pass\n@pytest.mark.process\ndef test_2(): pass\n"
        ),
        test_d_slow=(
            "import pytest\npytestmark = pytest.mark.slow\ndef test_z(): pass\ndef test_a(): pass\n"
        ),
        test_e_mixed=(
            "import pytest\n"
            "def test_1(): pass\n"
            "@pytest.mark.slow\ndef test_2(): pass\n"
            "@pytest.mark.process\ndef test_3(): pass\n"
        ),
    )
    items, _ = pytester.inline_genitems()
    heavy_modules_first(items)
    assert [item.nodeid for item in items] == [
        # slow: collection order, a module's tests in their own order
        "test_d_slow.py::test_z",
        "test_d_slow.py::test_a",
        "test_e_mixed.py::test_1",
        "test_e_mixed.py::test_2",
        "test_e_mixed.py::test_3",
        # a process test, no slow one
        "test_c_process.py::test_1",
        "test_c_process.py::test_2",
        # the rest: most tests first
        "test_b_fast.py::test_1",
        "test_b_fast.py::test_2",
        "test_b_fast.py::test_3",
        "test_a_fast.py::test_1",
        "test_a_fast.py::test_2",
    ]


def test_xdist_keeps_the_collection_order(pytestconfig: pytest.Config) -> None:
    pytest.importorskip("xdist")
    assert pytestconfig.option.loadscopereorder is False


@pytest.mark.parametrize(
    ("args", "dist"),
    [
        (["-n", "2"], "loadfile"),  # xdist's default for -n alone is load
        (["-n", "2", "--dist", "load"], "load"),
        (["-n", "2", "--dist=load"], "load"),
        (["-n", "2", "-d"], "load"),
        (["-n", "2", "--dist", "loadgroup"], "loadgroup"),
        ([], "no"),
    ],
)
def test_n_alone_hands_out_whole_modules_and_an_explicit_dist_is_kept(
    pytester: pytest.Pytester, args: list[str], dist: str
) -> None:
    xdist = pytest.importorskip("xdist.plugin")
    config = pytester.parseconfig(*args)
    xdist.pytest_cmdline_main(config)  # what -n does to --dist before any conftest runs
    keep_collection_order(config)
    assert config.option.dist == dist
    assert config.option.loadscopereorder is False
