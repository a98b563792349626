"""What keeps ``plan`` fast (issue 14, performance): no torch, no ``importlib.metadata``, no
``shutil``, no ``typing``, a package root that loads nothing until a name is used, one scan of
the installed entry points that finds what ``importlib.metadata`` finds, and a process entry
point that leaves the heap to the OS at exit.

``benchmarks/bench_plan.py`` measures the time; this guards the causes it found.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest
from drift_testing import S3

from pytest_logprob_drift.registry import entry_points

NOT_FOR_PLAN = (
    "torch",
    "transformers",
    "vllm",
    "importlib.metadata",
    "email",
    "shutil",
    "zipfile",
    "typing",
    "pytest_logprob_drift.outcomes",
    "pytest_logprob_drift.registry.session",
)
"""Modules ``plan`` has no use for: engines, the metadata and e-mail parsers, ``typing`` (only
type checkers read the annotations), outcomes and per-case operator sessions."""


def test_plan_imports_nothing_it_does_not_use() -> None:
    code = (
        "import sys\n"
        "from pytest_logprob_drift.cli import main\n"
        f"assert main(['plan', {str(S3)!r}]) == 0\n"
        f"print([m for m in {NOT_FOR_PLAN!r} if m in sys.modules])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1].replace("'", '"')) == []


def test_entry_points_are_those_importlib_metadata_finds() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        groups = set(importlib.metadata.entry_points().keys())
    assert "pytest_logprob_drift.smoke" in groups
    for group in groups:
        expected = sorted((e.name, e.value) for e in importlib.metadata.entry_points(group=group))
        assert sorted((e.name, e.value) for e in entry_points.select(group)) == expected, group


def test_a_zip_on_sys_path_falls_back_to_importlib_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "plugins.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr(
            "zipped_plugin-1.0.dist-info/METADATA", "Name: zipped-plugin\nVersion: 1.0\n"
        )
        zipped.writestr(
            "zipped_plugin-1.0.dist-info/entry_points.txt",
            "[drift.test.zipped]\nbackend = zipped_plugin.ops:descriptors\n",
        )
    monkeypatch.syspath_prepend(str(archive))
    found = [(e.name, e.value, e.group) for e in entry_points.select("drift.test.zipped")]
    assert found == [("backend", "zipped_plugin.ops:descriptors", "drift.test.zipped")]
    assert entry_points.select("drift.test.no-such-group") == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        expected = importlib.metadata.entry_points(group="pytest_logprob_drift.smoke")
    smoke = entry_points.select("pytest_logprob_drift.smoke")
    assert sorted((e.name, e.value) for e in smoke) == sorted((e.name, e.value) for e in expected)


def test_a_group_no_distribution_declares_is_empty() -> None:
    assert entry_points.select("drift.test.no-such-group") == []


def test_an_entry_point_loads_its_object() -> None:
    (runtimes,) = [
        e for e in entry_points.select("pytest_logprob_drift.smoke") if e.name == "runtimes"
    ]
    assert callable(runtimes.load())


def test_the_package_root_loads_its_names_on_first_use() -> None:
    code = (
        "import sys\n"
        "import pytest_logprob_drift as facade\n"
        "print(sorted(m for m in sys.modules if m.startswith('pytest_logprob_drift.')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"

    import pytest_logprob_drift as facade

    for name in facade.__all__:
        value = getattr(facade, name)
        owner = sys.modules[value.__module__]
        assert getattr(owner, name) is value, name
        assert name in dir(facade)
    with pytest.raises(AttributeError, match="'pytest_logprob_drift' has no attribute 'nope'"):
        facade.nope  # noqa: B018


PRELOADS = [("", True), ("import torch\n", False)]
if importlib.util.find_spec("triton") is not None:  # its nanobind reports leaks at exit
    PRELOADS.append(("import triton\n", False))


def _entry_point_interpreters() -> list[subprocess.CompletedProcess[str]]:
    """``plan`` of S3 through the process entry point after each of ``PRELOADS``, then through
    ``python -m`` (with and without a config there), one interpreter after the other."""
    entries = [
        [
            sys.executable,
            "-c",
            "import gc, sys\n"
            f"{preload}"
            "from pytest_logprob_drift.cli import entry\n"
            f"sys.argv = ['logprob-drift', 'plan', {str(S3)!r}]\n"
            "code = entry()\n"
            "print('exit', code, 'frozen', gc.get_freeze_count() > 0)\n",
        ]
        for preload, _ in PRELOADS
    ]
    module = [sys.executable, "-m", "pytest_logprob_drift", "plan"]
    return [
        subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        for argv in [*entries, [*module, str(S3), "--json"], [*module, "no-such-config.json"]]
    ]


@pytest.mark.process  # the process entry point of fresh interpreters
def test_the_process_entry_point_leaves_the_heap_to_the_os_only_without_engine_code() -> None:
    scripts = importlib.metadata.entry_points(group="console_scripts", name="logprob-drift")
    assert [e.value for e in scripts] == ["pytest_logprob_drift.cli:entry"]
    *results, planned, missing = _entry_point_interpreters()
    for result, (preload, frozen) in zip(results, PRELOADS, strict=True):
        assert result.returncode == 0, result.stderr
        # with a native extension loaded the heap is torn down as usual: no leak report
        assert result.stdout.splitlines()[-1] == f"exit 0 frozen {frozen}", preload
        assert result.stderr == "", preload
    # ``python -m``: the whole table reaches a pipe, and exit codes are main's
    assert planned.returncode == 0, planned.stderr
    cases = json.loads(planned.stdout)["cases"]
    assert cases and all(len(c["case_id"]) == 16 for c in cases)
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1 and "no-such-config.json" in missing.stderr
