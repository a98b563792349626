"""The importance-sampling figures sealed in every judged case, checked by verify, and
computed at read time for attempts sealed before they existed.

Real runs of the cpu-smoke runtime through the CLI; the figures are recomputed here by hand in
float64 from the sealed token_diffs.pt, independently of ``numerics.importance_sampling``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import cli, copy_of_s0

from pytest_logprob_drift.check.resume import check_attempt
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.store.comparison import parse_comparison
from pytest_logprob_drift.store.files import json_bytes
from pytest_logprob_drift.store.layout import COMPARISON, COMPLETE, TOKEN_DIFFS
from pytest_logprob_drift.store.run import iter_attempt_dirs
from pytest_logprob_drift.tensorio import tensors_from_bytes

EXPERIMENT = "s0-cpu-smoke"
FIXTURE = Path(__file__).parent / "data" / "pre_issue20" / "runs" / "fixture-pre20-cpu-smoke"


@pytest.fixture(scope="module")
def sealed_run(sealed_s0: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_of_s0(sealed_s0, tmp_path_factory.mktemp("importance-sampling"))


def _comparisons(run_dir: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    return {
        json.loads((a / COMPARISON).read_bytes())["label"]: (
            a,
            json.loads((a / COMPARISON).read_bytes()),
        )
        for a in iter_attempt_dirs(run_dir)
    }


def _assert_same_figures(read: Any, sealed: Any, where: str) -> None:
    """``read`` and ``sealed`` with the same structure, names, counts and flags; each float
    within 1e-6 (absolute or relative) of the other."""
    if isinstance(sealed, dict):
        assert isinstance(read, dict) and sorted(read) == sorted(sealed), where
        for key in sealed:
            _assert_same_figures(read[key], sealed[key], f"{where}.{key}")
    elif isinstance(sealed, list):
        assert isinstance(read, list) and len(read) == len(sealed), where
        for i, (a, b) in enumerate(zip(read, sealed, strict=True)):
            _assert_same_figures(a, b, f"{where}[{i}]")
    elif isinstance(sealed, float) and not isinstance(sealed, bool):
        assert isinstance(read, float), where
        assert read == pytest.approx(sealed, rel=1e-6, abs=1e-6), where
    else:
        assert read == sealed and type(read) is type(sealed), where


def _by_hand(attempt: Path) -> tuple[float, float]:
    """(ESS, fraction of active tokens with exp(r) > 2) in float64 from token_diffs.pt."""
    diffs = tensors_from_bytes((attempt / TOKEN_DIFFS).read_bytes())
    active = diffs["active_mask"]
    r = (
        diffs["training_logprobs"].to(torch.float64) - diffs["rollout_logprobs"].to(torch.float64)
    )[active].tolist()
    w = [math.exp(x) for x in r]
    mean = sum(w) / len(w)
    ess = 1.0 / (sum((x / mean) ** 2 for x in w) / len(w))
    return ess, sum(1 for x in w if x > 2.0) / len(w)


def test_every_judged_case_seals_figures_equal_to_a_float64_recomputation(
    sealed_run: Path,
) -> None:
    cases = _comparisons(sealed_run / EXPERIMENT)
    assert len(cases) == 3
    for label, (attempt, document) in cases.items():
        part = document["diagnostics"]["importance_sampling"]
        ess, clipped = _by_hand(attempt)
        assert part["ess"] == pytest.approx(ess, rel=1e-12, abs=1e-12), label
        assert part["corrections"]["tis_clipped_token_fraction_cap_2"] == clipped, label
        assert part["active_tokens"] == document["active_tokens"]
        # the typed record gives the document back value for value
        assert parse_comparison(json_bytes(document)).to_json() == document


def test_the_offset_case_masks_every_sequence_at_nemo_rl_band(sealed_run: Path) -> None:
    """The smoke offset shifts training logprobs by 0.008 on every token: the geometric ratio
    exp(-0.008) is below 0.999 on every sequence, no weight is above 2."""
    _, document = _comparisons(sealed_run / EXPERIMENT)["logp.backend=smoke_only.logp_offset"]
    part = document["diagnostics"]["importance_sampling"]
    assert document["outcome"] == Outcome.MISMATCH.value
    assert part["corrections"]["seq_mask_tis_masked_sequence_fraction_0999_1002"] == 1.0
    assert part["corrections"]["tis_clipped_token_fraction_cap_2"] == 0.0
    assert part["log_geometric_ratio"]["max"] == pytest.approx(-0.008, abs=1e-6)


def _reseal(attempt: Path, document: dict[str, Any]) -> None:
    path = attempt / COMPARISON
    os.chmod(path, 0o644)
    path.write_bytes(json_bytes(document))
    seal = json.loads((attempt / COMPLETE).read_text())
    seal["files"][COMPARISON] = hashlib.sha256(path.read_bytes()).hexdigest()
    os.chmod(attempt / COMPLETE, 0o644)
    (attempt / COMPLETE).write_bytes(json_bytes(seal))


def test_verify_catches_a_resealed_tampered_figure(sealed_run: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(sealed_run, runs)
    run_dir = runs / EXPERIMENT
    attempt, document = _comparisons(run_dir)["baseline"]
    document["diagnostics"]["importance_sampling"]["ess"] = 0.5
    _reseal(attempt, document)

    code, out, err = cli("verify", run_dir)
    assert (code, err) == (1, ""), out
    lines = [line for line in out.splitlines() if line.startswith(attempt.parent.name)]
    assert len(lines) == 1 and "invalid" in lines[0], out
    assert "diagnostics.importance_sampling.ess differs" in lines[0], lines[0]
    assert "Traceback" not in out


def test_a_resealed_wrong_type_figure_is_refused(sealed_run: Path, tmp_path: Path) -> None:
    """The part is read strictly: a figure of the wrong type names its JSON path."""
    runs = tmp_path / "runs"
    shutil.copytree(sealed_run, runs)
    attempt, document = _comparisons(runs / EXPERIMENT)["batch.size=1"]
    part = document["diagnostics"]["importance_sampling"]
    document["diagnostics"]["importance_sampling"] = {**part, "ess": "high"}
    _reseal(attempt, document)
    code, out, _ = cli("verify", runs / EXPERIMENT)
    assert code == 1
    detail = "$.diagnostics.importance_sampling.ess: Expected `int | float`, got `str`"
    (line,) = [line for line in out.splitlines() if detail in line]
    assert "invalid  comparison.json  " + detail in line, line


def test_old_attempts_get_figures_at_read_time_and_keep_their_bytes(
    sealed_run: Path, tmp_path: Path
) -> None:
    store = tmp_path / "runs"
    shutil.copytree(FIXTURE.parent, store)
    old = _comparisons(store / FIXTURE.name)
    new = _comparisons(sealed_run / EXPERIMENT)
    assert sorted(old) == sorted(new)
    for label, (attempt, document) in old.items():
        assert "importance_sampling" not in document["diagnostics"]
        raw = (attempt / COMPARISON).read_bytes()
        assert json_bytes(parse_comparison(raw).to_json()) == raw
        checked = check_attempt(attempt, expected_key=None)
        part = checked.comparison.diagnostics.importance_sampling
        assert part is not None, label
        ess, clipped = _by_hand(attempt)
        assert part.ess == pytest.approx(ess, rel=1e-12, abs=1e-12)
        assert part.correction("tis_clipped_token_fraction_cap_2") == clipped
        assert (attempt / COMPARISON).read_bytes() == raw  # computed, never written
        # verdicts, mismatch counts and case ids as the same config gives on this code
        _, fresh = new[label]
        for key in ("case_id", "outcome", "mismatches", "active_tokens"):
            assert document[key] == fresh[key], (label, key)
        # the same figures, by name, as a fresh seal of the same config on this code: exact
        # for every count and name; the floats within 1e-6, since the fresh run's scores come
        # from this CPU and the fixture's from the one that sealed it (their last bits differ)
        _assert_same_figures(part.to_json(), fresh["diagnostics"]["importance_sampling"], label)
