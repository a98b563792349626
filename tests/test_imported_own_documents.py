"""An imported step seals its own document set (issue 50): ``imported.json`` v3, with the
importing environment, beside ``comparison.json`` and the three tensors, and no requested,
materialized, actual or identity document. The example dumps imported now give the cases,
outcomes and counts the release before gave for the same dumps (``tests/data/wave4``, the
earlier form); the execution key is re-derived here from the two documents with ``hashlib``;
a tampered v3 document, or an earlier-form document sealed beside it, is named by verify; an
earlier-form step still needs its records."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from drift_testing import cli
from resealing import reseal

ROOT = Path(__file__).resolve().parent.parent
WAVE4 = ROOT / "tests" / "data" / "wave4"
EXPECTED: dict[str, Any] = json.loads((WAVE4 / "EXPECTED.json").read_text())
EXAMPLES = {
    "nemo-rl": ROOT / "experiments" / "production" / "nemo-rl",
    "slime": ROOT / "experiments" / "production" / "slime",
    "jsonl": ROOT / "experiments" / "production" / "jsonl" / "drift.jsonl",
}
OWN_SET = [
    "COMPLETE",
    "comparison.json",
    "imported.json",
    "score_rollout.pt",
    "score_training.pt",
    "token_diffs.pt",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each example dump imported once by the code under test."""
    root = tmp_path_factory.mktemp("own-documents")
    out = {}
    for fmt, source in EXAMPLES.items():
        code, stdout, err = cli(
            "import", "--format", fmt, source, "--artifacts", root / "runs", "--json"
        )
        assert code in (0, 1), stdout + err
        out[fmt] = Path(json.loads(stdout)["run_dir"])
    return out


def _attempts(run_dir: Path) -> list[Path]:
    return sorted(c.parent for c in run_dir.glob("cases/*/*/COMPLETE"))


def _verify(run_dir: Path) -> tuple[int, str]:
    code, out, err = cli("verify", run_dir)
    return code, out + err


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / run_dir.name
    shutil.copytree(run_dir, target)
    return target


@pytest.mark.parametrize("fmt", sorted(EXAMPLES))
@pytest.mark.slow
def test_the_example_dumps_seal_the_own_set_and_report_as_the_earlier_form(
    runs: dict[str, Path], fmt: str, tmp_path: Path
) -> None:
    run_dir = runs[fmt]
    for attempt in _attempts(run_dir):
        assert sorted(p.name for p in attempt.iterdir()) == OWN_SET, attempt
        imported = json.loads((attempt / "imported.json").read_text())
        assert imported["schema_version"] == "cross_config.imported_step.v3"
        assert imported["environment"]["python"] and imported["environment"]["torch"]
        complete = json.loads((attempt / "COMPLETE").read_text())
        assert sorted(complete["files"]) == [n for n in OWN_SET if n != "COMPLETE"]
    earlier = EXPECTED[f"wave4-{fmt}"]
    code, out = _verify(run_dir)
    assert code == earlier["verify_exit"] and earlier["verify_summary"] in out, out
    code, out, err = cli("report", run_dir, "--json", "--html", tmp_path / "page.html")
    assert (code, err) == (earlier["report_exit"], ""), out
    report = json.loads(out)
    cases = {
        c["case_id"]: {k: c[k] for k in ("label", "outcome", "active_tokens", "mismatches")}
        for c in report["cases"]
    }
    assert cases == earlier["cases"]  # same case ids, outcomes and counts as the earlier form
    assert report["invalid"] == 0
    page = (tmp_path / "page.html").read_text()
    assert f"import:{fmt}" in page  # the runtime the key names, shown in the header


def test_the_execution_key_is_what_the_two_documents_make(runs: dict[str, Path]) -> None:
    for attempt in _attempts(runs["nemo-rl"]):
        imported = json.loads((attempt / "imported.json").read_text())
        comparison = json.loads((attempt / "comparison.json").read_text())
        contract = comparison["contract"]
        payload = {
            "version": "cross_config.import_key.v2",
            "case_id": comparison["case_id"],
            "imported": {k: imported[k] for k in ("format", "step", "rows_sha256")},
            "runtime": "import:nemo-rl",
            "contract": {k: contract[k] for k in ("source", "version", "threshold")},
            "environment": imported["environment"],
        }
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        key = hashlib.sha256(text.encode()).hexdigest()
        assert json.loads((attempt / "COMPLETE").read_text())["execution_key"] == key


def _edit_imported(run_dir: Path, edit: Any) -> None:
    attempt = _attempts(run_dir)[0]
    path = attempt / "imported.json"
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    reseal(run_dir, path)


@pytest.mark.parametrize(
    ("edit", "needles"),
    [
        (
            lambda d: d["environment"].update(torch="0.0.1"),
            ("COMPLETE", "execution key does not match what imported.json and comparison.json"),
        ),
        (
            lambda d: d.pop("environment"),
            ("imported.json", "cross_config.imported_step.v3 requires environment"),
        ),
        (
            lambda d: d.update(environment={"python": 3}),
            ("imported.json", "$.environment[...]: Expected `str | null`"),
        ),
        (
            lambda d: d.update(schema_version="cross_config.imported_step.v2"),
            ("imported.json", "a cross_config.imported_step.v2 document has no environment"),
        ),
    ],
)
def test_a_tampered_v3_document_is_named(
    runs: dict[str, Path], tmp_path: Path, edit: Any, needles: tuple[str, ...]
) -> None:
    run_dir = _copy(runs["nemo-rl"], tmp_path)
    _edit_imported(run_dir, edit)
    code, out = _verify(run_dir)
    assert code != 0
    assert all(needle in out for needle in needles), out


@pytest.mark.parametrize(
    ("source_run", "name"),
    [("wave4-nemo-rl", "requested.json"), ("wave4-hf-deep-layers", "weights_rollout.json")],
)
def test_an_executed_attempt_document_sealed_beside_v3_is_named(
    runs: dict[str, Path], tmp_path: Path, source_run: str, name: str
) -> None:
    """Nothing was requested, materialized, read back or loaded for an imported step: a run-side
    document (an earlier form's record or a side's weight digests) sealed beside a v3
    ``imported.json`` is refused, naming it."""
    run_dir = _copy(runs["nemo-rl"], tmp_path)
    attempt = _attempts(run_dir)[0]
    earlier = next((WAVE4 / "runs" / source_run / "cases").glob(f"*/*/{name}"))
    shutil.copy(earlier, attempt / name)
    reseal(run_dir, attempt / name)
    code, out = _verify(run_dir)
    assert code != 0
    assert name in out and "sealed beside a cross_config.imported_step.v3" in out, out


def test_an_earlier_form_step_still_needs_its_records(tmp_path: Path) -> None:
    """Only the v3 form goes without them: a v1 step whose identity.json is dropped from the
    seal is refused, as before."""
    run_dir = _copy(WAVE4 / "runs" / "wave4-nemo-rl", tmp_path)
    attempt = _attempts(run_dir)[0]
    (attempt / "identity.json").unlink()
    manifest = json.loads((attempt / "COMPLETE").read_text())
    del manifest["files"]["identity.json"]
    (attempt / "COMPLETE").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    code, out = _verify(run_dir)
    assert code != 0
    assert "identity.json" in out and "required file is not sealed" in out, out


def test_attribution_reads_a_v3_step_as_nothing_requested(runs: dict[str, Path]) -> None:
    from pytest_logprob_drift.attribution.analysis import SealedExecution

    for attempt in _attempts(runs["nemo-rl"]):
        execution = SealedExecution(attempt)
        step = json.loads((attempt / "imported.json").read_text())["step"]
        assert (execution.label, execution.changed, dict(execution.requested)) == (
            f"step={step}",
            (),
            {},
        )
        assert execution.case_id == attempt.parent.name
