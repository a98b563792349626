"""Hostile sealed files, one example per kind (issue 21, class 4), and an attempt of a case the
plan never had (class 1).

Each test copies one run sealed by the ``cpu-smoke`` runtime (built once per module), rewrites
one file, re-seals it as anyone who can write an unkeyed run can (``tests/resealing.py``), and
runs the CLI: ``verify`` must judge the attempt (or attribution) invalid naming the file and
what is wrong, ``report`` must render the rest, and ``run`` must execute the case again instead
of reusing or crashing on it. Every one of these gave a Python traceback (exit 1) before the
strict readers; ``test_hardening_sealed_fuzz`` is the property test over many such files.
"""

from __future__ import annotations

import io
import json
import resource
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.drift_testing import ROOT, cli
from tests.resealing import reseal

pytestmark = pytest.mark.slow  # each test renders a report page (seconds) and resumes the run

DATA = ROOT / "tests" / "data" / "pre_issue20"
CONFIG = DATA / "smoke.json"
EXPERIMENT = "fixture-pre20-cpu-smoke"
EXPECT = "logp.backend=smoke_only.logp_offset=MISMATCH"
RUN = ("--runtime", "cpu-smoke", "--allow-smoke-operators", "--expect", EXPECT)


def _run(artifacts: Path) -> tuple[int, str, str]:
    return cli("run", CONFIG, *RUN, "--artifacts", artifacts, "--baseline-repeats", "2", "--json")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    artifacts = tmp_path_factory.mktemp("pristine") / "runs"
    code, _, err = _run(artifacts)
    assert code == 0, err
    return artifacts


@pytest.fixture
def run_dir(pristine: Path, tmp_path: Path) -> Path:
    shutil.copytree(pristine, tmp_path / "runs")
    return tmp_path / "runs" / EXPERIMENT


def _attempt(run_dir: Path, label: str) -> Path:
    """The (newest) attempt of the case labelled ``label``."""
    found = [
        p.parent
        for p in sorted(run_dir.glob("cases/*/*/comparison.json"))
        if json.loads(p.read_text())["label"] == label
    ]
    return found[-1]


def _attribution(run_dir: Path) -> Path:
    [directory] = (run_dir / "attributions").iterdir()
    return directory / "attribution.json"


def _save(path: Path, tensors: Any) -> None:
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    path.write_bytes(buffer.getvalue())


def _verify(run_dir: Path) -> dict[str, Any]:
    code, out, err = cli("verify", run_dir, "--json")
    assert (code, err) == (1, ""), (code, out, err)
    document: dict[str, Any] = json.loads(out)
    return document


def _invalid_attempt(run_dir: Path, attempt: Path) -> dict[str, Any]:
    """verify's entry for ``attempt`` (it must be invalid); report and a resume survive it."""
    [entry] = [a for a in _verify(run_dir)["attempts"] if a["attempt_id"] == attempt.name]
    assert entry["status"] == "invalid", entry
    code, out, err = cli("report", run_dir, "--no-html")
    assert (code, err) == (0, ""), err
    assert f"invalid attempt (not shown): {attempt.parent.name}/{attempt.name}" in out
    code, out, err = _run(run_dir.parent)
    assert code == 0, err
    results = json.loads(out)["results"]
    assert all(r["attempt_dir"] != str(attempt) for r in results)
    [again] = [r for r in results if r["case_id"] == attempt.parent.name and not r["reused"]]
    assert again["attempt_dir"] is not None
    return entry


def _edit_json(path: Path, edit: Any) -> None:
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document, allow_nan=True))


# --------------------------------------------------------------------------- JSON


def test_a_nan_literal_in_identity_json_is_an_invalid_attempt(run_dir: Path) -> None:
    attempt = _attempt(run_dir, "batch.size=1")
    path = attempt / "identity.json"
    _edit_json(
        path, lambda d: d["execution_key_payload"]["contract"].update(threshold=float("nan"))
    )
    reseal(run_dir, path)
    entry = _invalid_attempt(run_dir, attempt)
    assert entry["file"] == "identity.json"
    assert "NaN is not valid JSON" in entry["detail"]


@pytest.mark.parametrize("depth", [500, 100_000])
def test_deeply_nested_json_is_an_invalid_attempt(run_dir: Path, depth: int) -> None:
    attempt = _attempt(run_dir, "batch.size=1")
    path = attempt / "requested.json"
    text = path.read_text()
    nested = f'"binding": {{"deep": {"[" * depth}{"]" * depth}, '
    path.write_text(text.replace('"binding": {', nested, 1))  # an engine's record, kept whole
    reseal(run_dir, path)
    entry = _invalid_attempt(run_dir, attempt)
    assert entry["file"] == "requested.json"
    assert "nested deeper than 64 levels" in entry["detail"]


def test_a_wrong_json_type_in_requested_json_is_an_invalid_attempt(run_dir: Path) -> None:
    attempt = _attempt(run_dir, "batch.size=1")
    path = attempt / "requested.json"
    _edit_json(path, lambda d: d.update(changed=7))
    reseal(run_dir, path)
    entry = _invalid_attempt(run_dir, attempt)
    assert (entry["file"], entry["detail"]) == (
        "requested.json",
        "$.changed: Expected `array`, got `int`",
    )


def test_non_utf8_bytes_in_actual_json_are_an_invalid_attempt(run_dir: Path) -> None:
    attempt = _attempt(run_dir, "batch.size=1")
    path = attempt / "actual.json"
    path.write_bytes(path.read_bytes().replace(b'"knobs"', b'"kn\xff\xfeobs"', 1))
    reseal(run_dir, path)
    entry = _invalid_attempt(run_dir, attempt)
    assert entry["file"] == "actual.json" and "not UTF-8" in entry["detail"]


@pytest.mark.parametrize(
    ("value", "fault"),
    [("fast", "Expected `float`, got `str`"), ([1], "Expected `float`, got `array`")],
)
def test_a_non_numeric_noise_floor_is_an_invalid_attribution(
    run_dir: Path, value: Any, fault: str
) -> None:
    path = _attribution(run_dir)
    _edit_json(path, lambda d: d["noise_floor"].update(rollout_max_abs_delta=value))
    reseal(run_dir, path)
    [attribution] = _verify(run_dir)["attributions"]
    assert attribution["problems"] == [
        f"attribution.json: $.noise_floor.rollout_max_abs_delta: {fault}"
    ]
    code, out, err = cli("report", run_dir, "--no-html")
    assert (code, err) == (0, ""), err
    assert "drift attribution" not in out  # an attribution that does not read is not shown
    code, _, err = _run(run_dir.parent)
    assert code == 0, err
    assert len(list((run_dir / "attributions").iterdir())) == 2  # sealed anew beside it


def test_a_ranking_that_names_no_case_is_an_invalid_attribution(run_dir: Path) -> None:
    path = _attribution(run_dir)
    _edit_json(path, lambda d: d["ranking"].append("no-such-case"))
    reseal(run_dir, path)
    [attribution] = _verify(run_dir)["attributions"]
    assert attribution["problems"] == [
        "attribution.json: $.ranking[2]: names no case of the document"
    ]
    code, _, err = cli("report", run_dir, "--no-html")
    assert (code, err) == (0, ""), err


def test_an_attribution_naming_no_input_is_invalid(run_dir: Path) -> None:
    """An empty ``inputs`` (in the document and its seal alike, with no baseline repeat) is
    refused naming the file and the JSON path: it ended in ``internal error (a bug; please
    report it): IndexError``."""
    path = _attribution(run_dir)

    def empty(document: dict[str, Any]) -> None:
        document["inputs"] = []
        document["noise_floor"]["repeats"] = 0

    _edit_json(path, empty)
    _edit_json(path.parent / "COMPLETE", lambda d: d.update(inputs=[]))
    reseal(run_dir, path)
    [attribution] = _verify(run_dir)["attributions"]
    problem = "attribution.json: $.inputs: names no attempt (the baseline's comes first)"
    assert (attribution["status"], attribution["problems"]) == ("invalid", [problem])
    code, out, err = cli("verify", run_dir)
    assert (code, err) == (1, ""), (code, out, err)
    assert f"attribution {path.parent.name}: invalid: {problem}" in out.splitlines()
    code, out, err = cli("report", run_dir, "--no-html")
    assert (code, err) == (0, ""), err
    assert "drift attribution" not in out


def test_an_attribution_naming_an_attempt_outside_cases_is_invalid(run_dir: Path) -> None:
    path = _attribution(run_dir)
    outside = {"case_id": "..", "attempt_id": "..", "complete_sha256": "0" * 64}
    _edit_json(path, lambda d: d["inputs"].append(outside))
    complete = path.parent / "COMPLETE"
    _edit_json(complete, lambda d: d["inputs"].append(outside))
    reseal(run_dir, path)
    [attribution] = _verify(run_dir)["attributions"]
    assert attribution["problems"] == [
        "attribution.json: names an attempt outside the run's cases/; refused"
    ]


# --------------------------------------------------------------------------- tensors


def test_a_stride0_tensor_declaring_80_gb_is_refused_unread(run_dir: Path) -> None:
    attempt = _attempt(run_dir, "batch.size=1")
    path = attempt / "token_diffs.pt"
    tensors = torch.load(path, weights_only=True)
    tensors["training_logprobs"] = torch.zeros(1, dtype=torch.float64).expand(100_000, 100_000)
    _save(path, tensors)
    assert path.stat().st_size < 1 << 16
    reseal(run_dir, path)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    entry = _invalid_attempt(run_dir, attempt)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 1 << 20  # KiB: < 1 GiB
    assert entry["file"] == "token_diffs.pt"
    assert "'training_logprobs' is a non-contiguous view (strides [0, 0])" in entry["detail"]


@pytest.mark.parametrize(
    ("change", "fault"),
    [
        (lambda t: t.to(torch.complex64), "has dtype torch.complex64; refused"),
        (lambda t: t.reshape(-1), "has 1 dimensions, not 2"),
        (lambda t: t.unsqueeze(0), "has 3 dimensions, not 2"),
        (lambda t: t[:, :-1].contiguous(), "its T dimension is 16, not 17"),
        (lambda t: t > 0, "is torch.bool, not a numeric tensor"),
    ],
)
def test_a_tensor_of_another_dtype_rank_or_shape_is_an_invalid_attempt(
    run_dir: Path, change: Any, fault: str
) -> None:
    attempt = _attempt(run_dir, "batch.size=1")
    path = attempt / "score_rollout.pt"
    tensors = torch.load(path, weights_only=True)
    grid = list(tensors["token_ids"].shape)
    tensors = {"logprobs": change(tensors.pop("logprobs")), **tensors}  # checked first
    _save(path, tensors)
    reseal(run_dir, path)
    entry = _invalid_attempt(run_dir, attempt)
    assert entry["file"] == "score_rollout.pt", entry
    assert fault.replace("17", str(grid[1])).replace("16", str(grid[1] - 1)) in entry["detail"]


def test_a_missing_identity_tensor_is_an_invalid_attempt_not_a_crash(run_dir: Path) -> None:
    """Resume used to reuse this attempt (nothing it checks needs attention_mask), and the
    attribution then failed the run with a traceback on every resume."""
    attempt = _attempt(run_dir, "batch.size=1")
    path = attempt / "score_rollout.pt"
    tensors = torch.load(path, weights_only=True)
    del tensors["attention_mask"]
    _save(path, tensors)
    reseal(run_dir, path)
    entry = _invalid_attempt(run_dir, attempt)
    assert (entry["file"], entry["detail"]) == (
        "score_rollout.pt",
        "has no 'attention_mask' tensor",
    )


def test_a_pickle_that_is_no_mapping_of_tensors_is_an_invalid_attempt(run_dir: Path) -> None:
    attempt = _attempt(run_dir, "batch.size=1")
    path = attempt / "divergence.pt"
    _save(path, {"top_rows": [1, 2, 3]})
    reseal(run_dir, path)
    entry = _invalid_attempt(run_dir, attempt)
    assert (entry["file"], entry["detail"]) == (
        "divergence.pt",
        "expected a mapping of names to tensors",
    )


def test_divergence_rows_beyond_the_active_positions_are_an_invalid_attempt(
    run_dir: Path,
) -> None:
    attempt = _attempt(run_dir, "batch.size=1")
    path = attempt / "divergence.pt"
    tensors = torch.load(path, weights_only=True)
    tensors["top_rows"] = tensors["top_rows"] + 10_000
    _save(path, tensors)
    reseal(run_dir, path)
    entry = _invalid_attempt(run_dir, attempt)
    assert entry["file"] == "divergence.pt"
    assert "top_rows names a position that is not active" in entry["detail"]


# --------------------------------------------------------------------------- the plan


def test_an_attempt_of_a_case_the_plan_never_had_is_invalid(run_dir: Path) -> None:
    attempt = _attempt(run_dir, "batch.size=1")
    stranger = run_dir / "cases" / "00000000deadbeef"
    shutil.copytree(attempt.parent, stranger)
    copied = stranger / attempt.name
    _edit_json(copied / "comparison.json", lambda d: d.update(case_id=stranger.name))
    _edit_json(copied / "COMPLETE", lambda d: d.update(case_id=stranger.name))
    reseal(run_dir, copied / "comparison.json")
    statuses = _verify(run_dir)["attempts"]
    [entry] = [a for a in statuses if a["case_id"] == stranger.name]
    assert entry == {
        "case_id": stranger.name,
        "attempt_id": attempt.name,
        "status": "invalid",
        "file": "plan.jsonl",
        "detail": "case 00000000deadbeef is not in the run's plan (plan.jsonl has no such case)",
    }
    assert [a["status"] for a in statuses if a["case_id"] != stranger.name] == ["ok"] * 4
    code, out, err = cli("verify", run_dir)
    assert (code, err) == (1, "")
    assert "00000000deadbeef" in out and "not in the run's plan" in out
