"""The test tree's diagnostic (``tests/log_ratio_peak``) on the ``hf`` runtime: installed with
no change to any hub, it captures the rollout engine's sampled tokens of a real tiny
transformers case, seals its part and file, is checked by ``verify`` and shows its column.

One module-scoped run (the tiny bf16 model, one case); the part is recomputed here in float64
with plain Python from the sealed token_diffs.pt and score_rollout.pt.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import EXPERIMENTS, cli, experiment_config
from log_ratio_peak import DIAGNOSTIC
from log_ratio_peak.diagnostic import FILE, HEADER, NAME

from pytest_logprob_drift.diagnostics import registry
from pytest_logprob_drift.store.layout import COMPLETE, SCORE_ROLLOUT, TOKEN_DIFFS
from pytest_logprob_drift.tensorio import tensors_from_bytes

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """The run directory, the one attempt and the run table of a one-case hf run made with
    the test diagnostic installed."""
    directory = tmp_path_factory.mktemp("diagnostic-plugin-hf")
    source = "cross_config_s0_hf_tiny_bf16.json"
    prompts = json.loads((EXPERIMENTS / source).read_text())["identity"]["prompts"]["token_ids"]
    config = experiment_config(
        directory,
        source,
        {
            "experiment_id": "hf-diagnostic-plugin",
            "identity.prompts.token_ids": prompts[:2],
            "identity.sampling.max_new_tokens": 6,
            "baseline.batch.size": 2,
            "interventions": [],
        },
    )
    artifacts = directory / "runs"
    registry.install(DIAGNOSTIC)
    try:
        code, out, err = cli("run", config, "--runtime", "hf", "--artifacts", artifacts)
    finally:
        registry.uninstall(NAME)
    assert code in (0, 1), err[-3000:]  # PASS or MISMATCH: both judged, both carry the part
    run_dir = artifacts / "hf-diagnostic-plugin"
    (attempt,) = (p.parent for p in (run_dir / "cases").glob("*/*/comparison.json"))
    return run_dir, attempt, out


@pytest.fixture
def plugin_installed() -> Iterator[None]:
    registry.install(DIAGNOSTIC)
    try:
        yield
    finally:
        registry.uninstall(NAME)


def _tensors(path: Path) -> dict[str, Any]:
    return tensors_from_bytes(path.read_bytes())


def test_the_part_is_the_captured_token_at_the_recomputed_peak(
    hf_run: tuple[Path, Path, str],
) -> None:
    _, attempt, out = hf_run
    diffs = _tensors(attempt / TOKEN_DIFFS)
    training = diffs["training_logprobs"].to(torch.float64).tolist()
    rollout = diffs["rollout_logprobs"].to(torch.float64).tolist()
    best: tuple[float, int, int] | None = None
    for i, row in enumerate(diffs["active_mask"].tolist()):
        for j, on in enumerate(row):
            r = training[i][j] - rollout[i][j]
            if on and (best is None or r > best[0]):
                best = (r, i, j)
    assert best is not None
    r, sample, position = best
    sampled = _tensors(attempt / SCORE_ROLLOUT)["token_ids"]
    part = json.loads((attempt / "comparison.json").read_text())["diagnostics"][NAME]
    assert part == {
        "log_ratio": r,
        "sample": sample,
        "position": position,
        "token_id": int(sampled[sample, position]),
    }
    sealed = _tensors(attempt / FILE)["log_ratio"].tolist()
    for i, row in enumerate(diffs["active_mask"].tolist()):
        for j, on in enumerate(row):
            assert sealed[i][j] == (training[i][j] - rollout[i][j] if on else -math.inf)
    assert FILE in json.loads((attempt / COMPLETE).read_text())["files"]
    header = next(line for line in out.splitlines() if line.startswith("case_id"))
    assert header.rstrip().endswith(HEADER), header
    assert f"baseline: log-ratio peak at {sample}:{position}" in out


def test_verify_checks_the_part_with_the_diagnostic_installed(
    hf_run: tuple[Path, Path, str], plugin_installed: None
) -> None:
    run_dir, _, _ = hf_run
    code, out, err = cli("verify", run_dir)
    assert (code, err) == (0, ""), out


def test_verify_without_it_names_the_diagnostic_not_installed(
    hf_run: tuple[Path, Path, str],
) -> None:
    run_dir, attempt, _ = hf_run
    case_id = json.loads((attempt / "comparison.json").read_text())["case_id"]
    code, out, _ = cli("verify", run_dir)
    assert code == 1
    (line,) = [line for line in out.splitlines() if line.startswith(case_id)]
    assert f"sealed by diagnostic {NAME}, not installed here" in line, line
