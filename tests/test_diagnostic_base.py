"""The diagnostics' shared base (``diagnostics.base``): a diagnostic built on it writes only
what it has; every other member is empty, its run-table columns are shown when some case
carries its part, and ``TextViewsDiagnostic`` forwards the run views to its views module.
The built-in diagnostics keep the views they had (compared with their views modules here)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from drift_testing import REPO

from pytest_logprob_drift.diagnostics import base, registry
from pytest_logprob_drift.diagnostics.layers import text as layer_text
from pytest_logprob_drift.diagnostics.path_split import views as path_split_views
from pytest_logprob_drift.numerics import text
from pytest_logprob_drift.numerics.comparison import Diagnostics, from_builtins


@dataclass(frozen=True, slots=True)
class _Minimal(base.DiagnosticBase):
    name: str = "full_vocabulary"


_VIEWS = SimpleNamespace(
    HEADERS=("a", "b"),
    cells=lambda d: ["cell", str(d is None)],
    lines=lambda d: ["line"],
    properties=lambda d: [("p", "v")],
)


@dataclass(frozen=True, slots=True)
class _Viewed(base.TextViewsDiagnostic):
    name: str = "viewed"
    views: ClassVar[Any] = _VIEWS


def _with_full_vocabulary() -> Diagnostics:
    return from_builtins({"full_vocabulary": {"unavailable": "not asked"}}, Diagnostics)


def test_a_diagnostic_on_the_base_has_every_optional_member_empty(tmp_path: Path) -> None:
    d = _Minimal()
    some = _with_full_vocabulary()
    assert d.sealed_files == () and d.always_in_table is False
    assert d.capture(SimpleNamespace()) is None  # type: ignore[arg-type]
    assert d.files("PASS", None, None) == {}  # type: ignore[arg-type]
    assert d.table_headers() == () and d.table_cells(some) == []
    assert d.run_lines(some) == [] and d.failure_lines(some) == [] and d.report_lines(some) == []
    assert d.properties(some) == [] and d.json_parts(some) == {}
    assert d.report_headers() == () and d.report_cells(some) == []
    assert d.report_section(some) is None
    assert d.report_plot(tmp_path, SimpleNamespace(), some) is None  # type: ignore[arg-type]
    assert d.report_figures(object()) == ()


def test_its_columns_are_shown_when_some_case_carries_its_part() -> None:
    d = _Minimal()
    assert d.shown([None, _with_full_vocabulary()]) is True
    assert d.shown([None, Diagnostics()]) is False
    assert d.shown([]) is False
    assert _Viewed().shown([_with_full_vocabulary()]) is False  # no member of that name


def test_text_views_are_forwarded_to_the_views_module() -> None:
    d = _Viewed()
    assert d.table_headers() == ("a", "b")
    assert d.table_cells(None) == ["cell", "True"]
    assert d.run_lines(None) == ["line"] == d.failure_lines(None)
    assert d.properties(None) == [("p", "v")]
    assert d.report_lines(None) == []  # not a run view: the base's empty default


def test_the_built_in_diagnostics_show_what_their_views_modules_give() -> None:
    some = _with_full_vocabulary()
    modules = {"full_vocabulary": text, "path_split": path_split_views, "layers": layer_text}
    for name, module in modules.items():
        d = registry.by_name(name)
        assert isinstance(d, base.TextViewsDiagnostic)
        assert d.table_headers() == module.HEADERS
        assert d.table_cells(some) == module.cells(some)
        assert d.run_lines(some) == module.lines(some) == d.failure_lines(some)
        assert d.properties(some) == module.properties(some)
    full = registry.by_name("full_vocabulary")
    assert full is not None and full.shown([some]) is text.has_full_vocabulary([some]) is True
    importance = registry.by_name("importance_sampling")
    assert isinstance(importance, base.DiagnosticBase)
    assert importance.shown([]) is True and importance.always_in_table is True
    assert importance.run_lines(some) == [] and importance.report_figures(None) == ()


@pytest.mark.process  # sys.modules of a fresh interpreter
def test_the_base_imports_no_torch_and_no_typing() -> None:
    code = (
        "import sys; import pytest_logprob_drift.diagnostics.base; "
        "print([m for m in ('torch', 'typing') if m in sys.modules])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert proc.stdout.strip() == "[]", proc.stdout
