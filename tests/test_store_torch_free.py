"""The store is persistence only: reading a sealed attempt through it loads no torch; the tensor
checks of what it holds (``check``) are where torch comes in."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ATTEMPT = next(
    (REPO / "tests/data/wave4/runs/wave4-cpu-smoke/cases").glob("*/*/comparison.json")
).parent

_CODE = """
import pkgutil, sys, importlib
from pathlib import Path
import pytest_logprob_drift.store as store
names = sorted(m.name for m in pkgutil.iter_modules(store.__path__))
for name in names:
    importlib.import_module(f"pytest_logprob_drift.store.{name}")
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.attempt import read_seal
from pytest_logprob_drift.store.comparison import parse_comparison
attempt = Path(sys.argv[1])
seal = read_seal(attempt, keep=(layout.COMPARISON,))
comparison = parse_comparison(seal.read(layout.COMPARISON))
print(names)
print(comparison.case_id, comparison.outcome.value, sorted(seal.files))
print([m for m in ("torch", "numpy", "pytest_logprob_drift.tensorio") if m in sys.modules])
import pytest_logprob_drift.check.resume
print("torch" in sys.modules)
"""


@pytest.mark.process  # sys.modules of a fresh interpreter
def test_reading_a_sealed_attempt_through_the_store_loads_no_torch() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _CODE, str(ATTEMPT)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    names, read, heavy, checked = proc.stdout.splitlines()
    # every module of the store was imported, the moved checks are no longer among them
    assert {"attempt", "comparison", "documents", "run", "seal"} <= set(ast.literal_eval(names))
    assert not {"resume", "verify", "rejudge", "sealed_tensors"} & set(ast.literal_eval(names))
    # the attempt was read and decoded, independently of the store: its file as json has them
    recorded = json.loads((ATTEMPT / "comparison.json").read_text())
    files = sorted(json.loads((ATTEMPT / "COMPLETE").read_text())["files"])
    assert read == f"{recorded['case_id']} {recorded['outcome']} {files}"
    assert heavy == "[]", proc.stdout
    # the tensor checks, one layer up, do load torch: the check above can fail
    assert checked == "True"
