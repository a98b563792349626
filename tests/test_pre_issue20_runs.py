"""Sealed runs written before the read-model change (issue 20) still verify, report and resume.

``tests/data/pre_issue20/`` holds two small runs sealed by the code at commit 5b0a116, before
the typed read model, the one seal mechanism and the numerics package landed: the S0 smoke
experiment with full-vocabulary diagnostics (unkeyed) and a two-prompt transformers experiment
sealed under a key (``key``, a test-only key). The readers of today must accept them exactly:
every attempt and attribution verifies, the report renders every case, and a resume over a copy
keeps every old file byte for byte (the framework digest changed, so the cases execute again
beside the old attempts, and the old attempts stay valid).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from tests.drift_testing import cli

DATA = Path(__file__).parent / "data" / "pre_issue20"
SMOKE = "fixture-pre20-cpu-smoke"
HF = "fixture-pre20-hf"
KEY = DATA / "key"


def _tree_digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A writable copy of the fixture store (the committed one is never touched)."""
    target = tmp_path / "runs"
    shutil.copytree(DATA / "runs", target)
    return target


def _attempts(run: Path) -> dict[str, list[str]]:
    return {
        case.name: sorted(a.name for a in case.iterdir())
        for case in sorted((run / "cases").iterdir())
    }


@pytest.mark.parametrize(("experiment", "key"), [(SMOKE, ()), (HF, ("--seal-key-file", KEY))])
def test_pre_change_run_verifies(store: Path, experiment: str, key: tuple[str | Path, ...]) -> None:
    code, out, err = cli("verify", store / experiment, *key)
    assert (code, err) == (0, ""), out
    assert "3 attempt(s), 1 attribution(s), 0 invalid" in out
    assert "ok (recomputed, identical)" in out
    assert out.count(" ok ") >= 3


def test_pre_change_keyed_run_needs_its_key(store: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-key"
    other.write_bytes(b"another-test-key-0123456789abcdef")
    code, out, _ = cli("verify", store / HF, "--seal-key-file", other)
    assert code == 1
    assert "0 invalid" not in out


@pytest.mark.parametrize("experiment", [SMOKE, HF])
@pytest.mark.slow
def test_pre_change_run_reports(store: Path, tmp_path: Path, experiment: str) -> None:
    page = tmp_path / "page.html"
    code, out, err = cli("report", store / experiment, "--html", page, "--json")
    assert code == 0, err
    document = json.loads(out)
    labels = sorted(c["label"] for c in document["cases"])
    assert len(labels) == 3 and "baseline" in labels
    assert [c["outcome"] for c in document["cases"] if c["label"] == "baseline"] == ["PASS"]
    html = page.read_text(encoding="utf-8")
    for label in labels:
        assert label in html


def test_pre_change_smoke_run_resumes_beside_its_old_attempts(store: Path) -> None:
    before = _tree_digests(store / SMOKE)
    old = _attempts(store / SMOKE)
    code, out, err = cli(
        "run",
        DATA / "smoke.json",
        "--runtime",
        "cpu-smoke",
        "--allow-smoke-operators",
        "--artifacts",
        store,
        "--expect",
        "logp.backend=smoke_only.logp_offset=MISMATCH",
    )
    assert code == 0, err
    after = _tree_digests(store / SMOKE)
    assert {name: after[name] for name in before} == before  # nothing old rewritten
    new = _attempts(store / SMOKE)
    assert set(new) == set(old)
    for case, attempts in old.items():
        assert set(attempts) <= set(new[case])
    code, out, err = cli("verify", store / SMOKE)
    assert code == 0, out
    assert " 0 invalid" in out


@pytest.mark.slow
def test_pre_change_keyed_hf_run_resumes(store: Path) -> None:
    before = _tree_digests(store / HF)
    code, _, err = cli(
        "run",
        DATA / "hf.json",
        "--runtime",
        "hf",
        "--artifacts",
        store,
        "--seal-key-file",
        KEY,
        "--expect",
        "rollout.dtype=bfloat16=MISMATCH",
    )
    assert code == 0, err
    after = _tree_digests(store / HF)
    assert {name: after[name] for name in before} == before
    code, out, _ = cli("verify", store / HF, "--seal-key-file", KEY)
    assert code == 0, out
