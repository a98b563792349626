"""verify re-judges every attempt by the installed contract (issue 47, class 1).

Anyone who can write an unkeyed run can re-seal it (``resealing``). What a re-seal cannot buy
is a verdict the contract does not give: the threshold comes from the contract source and
version comparison.json records, resolved through the installed package, and every figure
recomputable from the sealed tensors is recomputed. The repro of the issue (step 3 of the
shipped NeMo-RL example, MISMATCH 12/48 at max |diff| 0.135, re-sealed as a PASS under a
threshold of 1.0) is checked here, and so is a property: a random edit of any recomputable
field of comparison.json or imported.json, re-sealed, leaves the attempt invalid. The weight
documents' fields are checked in ``test_weights_cross_checks``. Resume (``run``) uses the
same ``check_attempt``, so what verify lists invalid is never reused.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from drift_testing import REPO, cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from resealing import reseal

from pytest_logprob_drift.check.resume import check_attempt
from pytest_logprob_drift.check.verify import verify_run, verify_run_files
from pytest_logprob_drift.store.seal import SealError
from pytest_logprob_drift.tensorio import tensor_bytes, tensors_from_bytes

NEMO_RL = REPO / "experiments" / "production" / "nemo-rl"
THRESHOLD = 1e-3
"""ws1's current threshold, written here independently of the package."""


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped NeMo-RL example imported once (never edited: tests edit copies)."""
    artifacts = tmp_path_factory.mktemp("rejudge")
    code, out, err = cli(
        "import", "--format", "nemo-rl", NEMO_RL, "--artifacts", artifacts, "--json"
    )
    assert code == 1, err  # steps 3-6 drift
    return Path(json.loads(out)["run_dir"])


def _copy(run: Path, tmp_path: Path) -> Path:
    target = tmp_path / run.name
    shutil.copytree(run, target)
    return target


def _attempt(run: Path, label: str) -> Path:
    for attempt in sorted(run.glob("cases/*/*")):
        if json.loads((attempt / "comparison.json").read_text())["label"] == label:
            return attempt
    raise AssertionError(f"no attempt labelled {label}")


def _edit_json(run: Path, path: Path, edit: Callable[[Any], None]) -> None:
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    reseal(run, path)


def _status(run: Path, attempt: Path) -> dict[str, Any]:
    (status,) = [s for s in verify_run(run) if s.attempt_id == attempt.name]
    return status.to_json()


def _token_diffs_threshold(run: Path, attempt: Path, threshold: float) -> None:
    path = attempt / "token_diffs.pt"
    tensors = tensors_from_bytes(path.read_bytes())
    tensors["threshold"] = torch.tensor(threshold, dtype=torch.float64)
    path.write_bytes(tensor_bytes(tensors))
    reseal(run, path)


def _resealed_as_pass(c: dict[str, Any]) -> None:
    """A MISMATCH comparison rewritten as a PASS under threshold 1.0 (the issue's repro)."""
    for holder in (c, c["contract"], c["numerical"]):
        holder["threshold"] = 1.0
    for holder in (c, c["numerical"]):
        holder["outcome"], holder["mismatches"] = "PASS", 0
    c["diagnostics"]["mismatch_ratio"] = 0.0


def test_step_3_resealed_as_a_pass_under_threshold_1_is_invalid(
    imported: Path, tmp_path: Path
) -> None:
    run = _copy(imported, tmp_path)
    attempt = _attempt(run, "step=3")
    diffs = tensors_from_bytes((attempt / "token_diffs.pt").read_bytes())
    active = diffs["active_mask"].numpy()
    diff = np.abs(
        diffs["training_logprobs"].numpy().astype(np.float64)
        - diffs["rollout_logprobs"].numpy().astype(np.float64)
    )[active]
    assert int((diff > THRESHOLD).sum()) == 12 and diff.size == 48  # the repro
    assert 0.13 < diff.max() < 0.14

    def as_pass(c: dict[str, Any]) -> None:
        _resealed_as_pass(c)
        c["reason"] = "all 48 active tokens within 1 (max |diff| 1.351e-01)"

    _token_diffs_threshold(run, attempt, 1.0)
    _edit_json(run, attempt / "comparison.json", as_pass)
    status = _status(run, attempt)
    assert status["status"] == "invalid"
    assert status["file"] == "comparison.json"
    assert "contract.threshold is 1.0" in status["detail"]
    assert "says 0.001" in status["detail"]
    with pytest.raises(SealError, match="contract"):
        check_attempt(attempt, expected_key=None)  # what run's resume calls: never reused
    code, out, _ = cli("verify", run)
    assert code == 1 and "1 invalid" in out.splitlines()[-1]


def test_the_threshold_of_token_diffs_alone_is_refused(imported: Path, tmp_path: Path) -> None:
    run = _copy(imported, tmp_path)
    attempt = _attempt(run, "step=1")
    _token_diffs_threshold(run, attempt, 0.5)
    status = _status(run, attempt)
    assert status["status"] == "invalid" and status["file"] == "token_diffs.pt"
    assert "threshold is 0.5" in status["detail"]


def test_a_contract_version_this_release_does_not_ship(imported: Path, tmp_path: Path) -> None:
    run = _copy(imported, tmp_path)
    attempt = _attempt(run, "step=2")

    def retired(c: dict[str, Any]) -> None:
        c["contract"]["version"] = "ws1.2025-01.v0"

    _edit_json(run, attempt / "comparison.json", retired)
    status = _status(run, attempt)
    assert status["status"] == "invalid"
    assert "'ws1.2025-01.v0', which this release does not ship" in status["detail"]
    code, out, _ = cli("verify", run)
    line = next(line for line in out.splitlines() if attempt.name in line)
    assert "ws1.2025-01.v0" in line and code == 1


def test_a_changed_plan_label_and_experiment_counts_are_invalid(
    imported: Path, tmp_path: Path
) -> None:
    run = _copy(imported, tmp_path)
    rows = [json.loads(line) for line in (run / "plan.jsonl").read_text().splitlines()]
    rows[0]["label"] = "step=99"
    (run / "plan.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    reseal(run, run / "plan.jsonl")
    bad = [s for s in verify_run(run) if s.status != "ok"]
    assert [(s.case_id, s.file) for s in bad] == [(rows[0]["case_id"], "plan.jsonl")]
    assert "'step=99'" in bad[0].detail

    for member, value in (("steps", 7), ("samples", 23)):
        run = _copy(imported, tmp_path / member)

        def counted(e: dict[str, Any], member: str = member, value: int = value) -> None:
            e["imported"][member] = value

        _edit_json(run, run / "experiment.json", counted)
        problems = [f for f in verify_run_files(run) if f.status == "invalid"]
        assert [f.file for f in problems] == ["experiment.json"]
        assert f"$.imported.{member} is {value}" in problems[0].detail


@pytest.mark.slow
def test_an_experiment_json_the_read_model_refuses_is_invalid(
    imported: Path, tmp_path: Path
) -> None:
    """Class 7: verify decodes experiment.json as the report does."""
    run = _copy(imported, tmp_path)

    def unknown(e: dict[str, Any]) -> None:
        e["imported"]["unexpected"] = 1

    _edit_json(run, run / "experiment.json", unknown)
    problems = [f for f in verify_run_files(run) if f.status == "invalid"]
    assert [f.file for f in problems] == ["experiment.json"]
    assert "unexpected" in problems[0].detail
    code, _, _ = cli("verify", run)
    assert code == 1
    code, out, err = cli("report", run, "--html", tmp_path / "page.html")
    assert code == 0, err  # the report says what it goes without, instead of dropping it
    assert any(
        line.startswith("experiment.json is not read (")
        and "the steps view of an import are not shown" in line
        for line in out.splitlines()
    ), out
    code, out, _ = cli("report", run, "--json", "--no-html")
    report = json.loads(out)
    assert report["steps"] is None and report["unread"][0].startswith("experiment.json")


# --------------------------------------------------------------------------- the property


COMPARISON_EDITS: dict[str, Callable[[dict[str, Any], Any], None]] = {
    "threshold": lambda c, x: c.__setitem__("threshold", x),
    "contract.threshold": lambda c, x: c["contract"].__setitem__("threshold", x),
    "active_tokens": lambda c, x: c.__setitem__("active_tokens", int(abs(x) * 1e6) + 49),
    "mismatches": lambda c, x: c.__setitem__("mismatches", c["mismatches"] + 1),
    "top-level active_tokens 2**64-1": lambda c, x: c.__setitem__("active_tokens", 2**64 - 1),
    "outcome": lambda c, x: c.__setitem__(
        "outcome", "PASS" if c["outcome"] == "MISMATCH" else "MISMATCH"
    ),
    "numerical.threshold": lambda c, x: c["numerical"].__setitem__("threshold", x),
    "worst_tokens[0].sample": lambda c, x: c["worst_tokens"][0].__setitem__(
        "sample", 3 - c["worst_tokens"][0]["sample"]
    ),
    "worst_tokens[0].position": lambda c, x: c["worst_tokens"][0].__setitem__("position", 40),
    "worst_tokens[0].rollout_logprob": lambda c, x: c["worst_tokens"][0].__setitem__(
        "rollout_logprob", c["worst_tokens"][0]["rollout_logprob"] + abs(x) + 1e-3
    ),
    "worst_tokens[0].abs_diff": lambda c, x: c["worst_tokens"][0].__setitem__(
        "abs_diff", c["worst_tokens"][0]["abs_diff"] + abs(x) + 1e-3
    ),
    "worst_tokens invented": lambda c, x: c["worst_tokens"].append(dict(c["worst_tokens"][0])),
    "worst_tokens dropped": lambda c, x: c["worst_tokens"].pop(),
}
STATISTICS = (
    "mean_abs_diff",
    "p50_abs_diff",
    "p90_abs_diff",
    "p99_abs_diff",
    "max_abs_diff",
    "mismatch_ratio",
    "approx_kl_k1",
    "approx_kl_k3",
    "slime_mean_abs_logprob_diff",
    "nemo_rl_token_mult_prob_error",
    "verl_rollout_probs_diff_max",
)
for _key in STATISTICS:
    COMPARISON_EDITS[f"diagnostics.{_key}"] = lambda c, x, k=_key: c["diagnostics"].__setitem__(
        k, c["diagnostics"][k] * (1 + 1e-6) + abs(x) + 1e-9
    )
    COMPARISON_EDITS[f"diagnostics.{_key} zeroed"] = lambda c, x, k=_key: c[
        "diagnostics"
    ].__setitem__(k, 0.0 if c["diagnostics"][k] != 0 else 1.0)

IMPORTED_EDITS: dict[str, Callable[[dict[str, Any], Any], None]] = {
    "step": lambda d, x: d.__setitem__("step", d["step"] + 1 + int(abs(x))),
    "format": lambda d, x: d.__setitem__("format", "jsonl"),
    "rows_sha256": lambda d, x: d.__setitem__("rows_sha256", "0" * 64),
    "logprob_dtype": lambda d, x: d.__setitem__("logprob_dtype", "float64"),
    "samples and rows": lambda d, x: (
        d["rows"].append(dict(d["rows"][0])),
        d.__setitem__("samples", d["samples"] + 1),
    ),
}
EDITS = [("comparison.json", k) for k in COMPARISON_EDITS] + [
    ("imported.json", k) for k in IMPORTED_EDITS
]


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    edit=st.sampled_from(EDITS),
    label=st.sampled_from(["step=1", "step=3", "step=6"]),
    x=st.floats(min_value=1e-6, max_value=10.0, allow_nan=False),
)
def test_every_recomputable_field_edited_and_resealed_is_invalid(
    imported: Path,
    tmp_path_factory: pytest.TempPathFactory,
    edit: tuple[str, str],
    label: str,
    x: float,
) -> None:
    run = _copy(imported, tmp_path_factory.mktemp("edit"))
    attempt = _attempt(run, label)
    name, key = edit
    edits = COMPARISON_EDITS if name == "comparison.json" else IMPORTED_EDITS
    before = (attempt / name).read_text()
    _edit_json(run, attempt / name, lambda d: edits[key](d, x))
    assert (attempt / name).read_text() != before
    status = _status(run, attempt)
    assert status["status"] == "invalid", (key, label, status)


def test_an_executed_runs_baseline_resealed_as_a_pass_is_not_reusable(tmp_path: Path) -> None:
    """The same edit on an executed transformers run (sealed by an earlier release): the
    check resume runs before reusing an attempt refuses it, so ``run`` executes it again."""
    run = tmp_path / "hf"
    shutil.copytree(REPO / "tests" / "data" / "pre_issue20" / "runs" / "fixture-pre20-hf", run)
    for path in run.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    attempt = next(
        a
        for a in sorted(run.glob("cases/*/*"))
        if json.loads((a / "comparison.json").read_text())["outcome"] == "MISMATCH"
    )
    check_attempt(attempt, expected_key=None)  # as sealed: reusable

    _token_diffs_threshold(run, attempt, 1.0)
    _edit_json(run, attempt / "comparison.json", _resealed_as_pass)
    with pytest.raises(SealError, match=r"contract.threshold is 1.0; contract 'ws1'"):
        check_attempt(attempt, expected_key=None)
    assert _status(run, attempt)["status"] == "invalid"
