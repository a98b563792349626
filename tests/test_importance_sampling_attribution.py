"""Each knob's importance-sampling ESS beside its effect in the attribution: sealed (an
optional per-case field), shown in run's attribution table, recomputed by verify, never read
by the ranking; attributions sealed before the field existed still verify.

Real cpu-smoke runs through the CLI; the ESS is recomputed here in float64 from each case's
sealed token_diffs.pt.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import OFFSET_EXPECT, S0, cli

from pytest_logprob_drift.attribution.ranking import rank_key
from pytest_logprob_drift.attribution.sealed import (
    attribution_dirs,
    read_attribution,
    verify_attribution,
    verify_attributions,
)
from pytest_logprob_drift.attribution.text import HEADERS, rows
from pytest_logprob_drift.store.layout import TOKEN_DIFFS
from pytest_logprob_drift.tensorio import tensors_from_bytes

EXPERIMENT = "s0-cpu-smoke"
FIXTURE = Path(__file__).parent / "data" / "pre_issue20" / "runs" / "fixture-pre20-cpu-smoke"


def ess_by_hand(attempt: Path) -> float:
    diffs = tensors_from_bytes((attempt / TOKEN_DIFFS).read_bytes())
    r = (
        diffs["training_logprobs"].to(torch.float64) - diffs["rollout_logprobs"].to(torch.float64)
    )[diffs["active_mask"]].tolist()
    w = [math.exp(x) for x in r]
    mean = sum(w) / len(w)
    return 1.0 / (sum((x / mean) ** 2 for x in w) / len(w))


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("is-attribution")
    code, out, err = cli(
        "run",
        S0,
        "--runtime",
        "cpu-smoke",
        "--allow-smoke-operators",
        "--expect",
        OFFSET_EXPECT,
        "--artifacts",
        root,
    )
    assert code == 0, (out, err)
    return root / EXPERIMENT, out


def copy_run(sealed: tuple[Path, str], tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    run_dir = tmp_path / EXPERIMENT
    shutil.copytree(sealed[0], run_dir)
    directory = attribution_dirs(run_dir)[0]
    return run_dir, directory, json.loads((directory / "attribution.json").read_text())


def reseal(directory: Path, document: dict[str, Any]) -> None:
    path = directory / "attribution.json"
    path.chmod(0o644)
    forged = json.dumps(document, indent=2, sort_keys=True) + "\n"
    path.write_text(forged)
    seal = json.loads((directory / "COMPLETE").read_text())
    seal["files"]["attribution.json"] = hashlib.sha256(forged.encode()).hexdigest()
    (directory / "COMPLETE").chmod(0o644)
    (directory / "COMPLETE").write_text(json.dumps(seal))


def test_each_case_seals_its_ess_beside_its_effect(sealed: tuple[Path, str]) -> None:
    run_dir, out = sealed
    document = json.loads((attribution_dirs(run_dir)[0] / "attribution.json").read_text())
    assert len(document["cases"]) == 2
    for entry in document["cases"]:
        attempt = run_dir / "cases" / entry["case_id"] / entry["attempt_id"]
        assert entry["ess"] == pytest.approx(ess_by_hand(attempt), rel=1e-12, abs=1e-12)
    # the run's attribution table: ESS beside the effect ratio, in ranking order
    at = HEADERS.index("ESS")
    assert HEADERS[at + 1] == "mean|diff| ratio"
    table = rows(read_attribution(attribution_dirs(run_dir)[0]).ranked())
    by_label = {e["label"]: e for e in document["cases"]}
    assert [row[0] for row in table] == document["ranking"]
    for row in table:
        assert row[at] == f"{by_label[row[0]]['ess']:.4g}"
    lines = out.splitlines()
    head = next(i for i, x in enumerate(lines) if x.startswith("case ") and " ESS " in x)
    start = lines[head].index(" ESS ") + 1
    for row, line in zip(table, lines[head + 2 : head + 2 + len(table)], strict=True):
        assert line.startswith(row[0]) and line[start:].split()[0] == row[at], line


def test_the_ranking_never_reads_the_ess(sealed: tuple[Path, str]) -> None:
    run_dir, _ = sealed
    document = json.loads((attribution_dirs(run_dir)[0] / "attribution.json").read_text())
    entries = document["cases"]
    assert document["ranking"] == [e["label"] for e in sorted(entries, key=rank_key)]
    for entry in entries:
        without = {k: v for k, v in entry.items() if k != "ess"}
        assert rank_key(entry) == rank_key(without) == rank_key({**entry, "ess": -entry["ess"]})


def test_verify_recomputes_the_ess(sealed: tuple[Path, str], tmp_path: Path) -> None:
    run_dir, directory, document = copy_run(sealed, tmp_path)
    assert verify_attribution(run_dir, directory) == []
    document["cases"][1]["ess"] = 0.5
    reseal(directory, document)
    problems = verify_attribution(run_dir, directory)
    assert len(problems) == 1 and problems[0].startswith("$.cases[1].ess: recorded 0.5"), problems
    code, out, _ = cli("verify", run_dir)
    assert code == 1 and "$.cases[1].ess: recorded 0.5" in out


def test_a_document_without_the_field_still_verifies(
    sealed: tuple[Path, str], tmp_path: Path
) -> None:
    """The form sealed before the field: no case records it."""
    run_dir, directory, document = copy_run(sealed, tmp_path)
    for entry in document["cases"]:
        del entry["ess"]
    reseal(directory, document)
    assert verify_attribution(run_dir, directory) == []
    ranked = read_attribution(directory).ranked()
    assert [row[HEADERS.index("ESS")] for row in rows(ranked)] == ["-", "-"]


def test_a_document_missing_the_field_on_one_case_is_refused(
    sealed: tuple[Path, str], tmp_path: Path
) -> None:
    run_dir, directory, document = copy_run(sealed, tmp_path)
    del document["cases"][0]["ess"]
    reseal(directory, document)
    problems = verify_attribution(run_dir, directory)
    assert len(problems) == 1 and problems[0].startswith("$.cases[0].ess: recorded None")


def test_the_pre_issue20_attribution_still_verifies(tmp_path: Path) -> None:
    store = tmp_path / "runs"
    shutil.copytree(FIXTURE.parent, store)
    run_dir = store / FIXTURE.name
    checked = verify_attributions(run_dir)
    assert [c["status"] for c in checked] == ["ok"], checked
    document = json.loads((attribution_dirs(run_dir)[0] / "attribution.json").read_text())
    assert all("ess" not in e for e in document["cases"])


@pytest.mark.slow
def test_a_resealed_non_number_ess_is_refused_and_not_shown(
    sealed: tuple[Path, str], tmp_path: Path
) -> None:
    """A wrong type is refused where the document is decoded, with its JSON path: the
    attribution is invalid and the report shows the run without it."""
    run_dir, directory, document = copy_run(sealed, tmp_path)
    document["cases"][0]["ess"] = "high"
    reseal(directory, document)
    problems = verify_attribution(run_dir, directory)
    assert problems == ["attribution.json: $.cases[0].ess: Expected `float`, got `str`"]
    code, out, err = cli("report", run_dir, "--html", tmp_path / "page.html")
    assert code == 0 and "Traceback" not in out + err, err
    assert "drift attribution" not in out


def test_the_findings_carry_each_movers_ess(sealed: tuple[Path, str], tmp_path: Path) -> None:
    """``report``'s findings (text and --json) name each mover's ESS as its sealed attribution
    entry records it, and that figure is the float64 ESS of its sealed token_diffs.pt."""
    run_dir, _ = sealed
    document = json.loads((attribution_dirs(run_dir)[0] / "attribution.json").read_text())
    code, text, err = cli("report", run_dir, "--no-html")
    assert code == 0, err
    code, out, err = cli("report", run_dir, "--json", "--no-html")
    assert code == 0, err
    found = json.loads(out)["findings"]["moved"]
    assert found, "the offset case moves the training side: the findings name it"
    by_case = {e["case_id"]: e for e in document["cases"]}
    for finding in found:
        entry = by_case[finding["case_id"]]
        attempt = run_dir / "cases" / entry["case_id"] / entry["attempt_id"]
        assert entry["ess"] == pytest.approx(ess_by_hand(attempt), rel=1e-12, abs=1e-12)
        assert finding["facts"]["ESS"] == f"{entry['ess']:.4g}"
        assert finding["words"].endswith(f"; ESS {entry['ess']:.4g}")
    first = next(f for f in found if f["rank"] == min(g["rank"] for g in found))
    assert first["words"] in text
