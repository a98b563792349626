"""The generated documentation pages (docs/KNOBS.md, docs/CLI.md) are what
``scripts/gen_docs.py`` writes from the code: the knob catalog, the runtimes' records, the
argparse parsers and the plugin's option table. Fast: no engine, no subprocess."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_docs", module)
    spec.loader.exec_module(module)
    return module


GEN_DOCS = _gen_docs()


@pytest.mark.parametrize("name", sorted(GEN_DOCS.PAGES))
def test_generated_page_matches_the_code(name: str) -> None:
    committed = (ROOT / "docs" / name).read_text(encoding="utf-8")
    generated = GEN_DOCS.PAGES[name]()
    assert committed == generated, (
        f"docs/{name} differs from what the code generates: run "
        f"`python scripts/gen_docs.py` and commit docs/{name}"
    )


def test_every_knob_and_runtime_is_on_the_knob_page() -> None:
    from pytest_logprob_drift.plan.knobs import KNOB_CATALOG
    from pytest_logprob_drift.policy import runtime_catalog

    page = GEN_DOCS.knobs_page()
    for spec in KNOB_CATALOG:
        assert f"| `{spec.knob.path}` |" in page
    for name in runtime_catalog().names:
        assert f"| `{name}` |" in page


def test_every_command_and_plugin_option_is_on_the_cli_page() -> None:
    from pytest_logprob_drift.plugin.options import OPTIONS

    page = GEN_DOCS.cli_page()
    for command in ("plan", "run", "verify", "report", "prompts", "init", "import"):
        assert f"## logprob-drift {command}\n" in page
    for option in OPTIONS:
        assert f"`{option.flag}" in page


def test_check_mode_names_the_stale_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in GEN_DOCS.PAGES:
        (tmp_path / name).write_text("stale\n", encoding="utf-8")
    monkeypatch.setattr(GEN_DOCS, "DOCS", tmp_path)
    assert GEN_DOCS.main(["--check"]) == 1
    assert "run `python scripts/gen_docs.py`" in capsys.readouterr().err
