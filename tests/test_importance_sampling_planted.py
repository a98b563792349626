"""The planted case of issue 24: an operator shifting every training logprob by a known c.

A test-only ``selected_logprob`` backend (declared here like the smoke offset backend, the
smoke reference kernel plus ``C`` on the training side) runs on the cpu-smoke runtime. The
sealed log-ratios r are then c on every active token up to float32 rounding, the weights the
figures report are exp of the sealed r, and TIS clips every token at a cap below exp(c) and
none at a cap above it. The expected figures are computed here in float64 from the sealed
token_diffs.pt, never taken from ``numerics.importance_sampling``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import S0, cli, run_by_label

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.policy import assemble
from pytest_logprob_drift.runtimes.smoke.kernels import reference_selected_logprob
from pytest_logprob_drift.runtimes.smoke.operators import SMOKE_DESCRIPTORS, SMOKE_OFFSET
from pytest_logprob_drift.store.layout import COMPARISON, TOKEN_DIFFS
from pytest_logprob_drift.tensorio import tensors_from_bytes

C = 1.0
"""The planted shift: log 2 < C < log 3, so verl's cap 2 clips every token and TRL's cap 3 and
OpenRLHF's cap 5 none."""
PLANTED = "smoke_only.logp_planted_shift"
LABEL = f"logp.backend={PLANTED}"


def build_planted_shift(
    *, target: str, options: Mapping[str, Any]
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Reference on the rollout side; reference plus ``C`` on the training side."""
    if options:
        raise ValueError(f"{PLANTED} takes no options, got {sorted(options)}")
    shift = C if target == "training" else 0.0

    def planted(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        return reference_selected_logprob(logits, token_ids) + shift

    return planted


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    offset = next(d for d in SMOKE_DESCRIPTORS if d.backend_id == SMOKE_OFFSET)
    descriptor = dataclasses.replace(
        offset,
        backend_id=PLANTED,
        factory=f"{__name__}:build_planted_shift",
        version="planted-1",
        build_fingerprint="planted-1",
    )
    catalog = assemble().operators.with_descriptors([descriptor])
    work = tmp_path_factory.mktemp("planted")
    document = json.loads(S0.read_text())
    document["interventions"] = [{"path": "logp.backend", "values": [PLANTED]}]
    config = work / "planted.json"
    config.write_text(json.dumps(document))
    results = run_by_label(
        plan_file(str(config), catalog=catalog),
        runtime="cpu-smoke",
        artifacts=work / "runs",
        allow_smoke=True,
        catalog=catalog,
    )
    assert results[LABEL].outcome is Outcome.MISMATCH, results[LABEL].reason
    assert results["baseline"].outcome is Outcome.PASS
    attempt = results[LABEL].attempt_dir
    assert attempt is not None
    return attempt


def test_weights_are_exp_of_the_sealed_r_and_tis_clips_above_log_cap(planted_run: Path) -> None:
    document = json.loads((planted_run / COMPARISON).read_bytes())
    part = document["diagnostics"]["importance_sampling"]
    diffs = tensors_from_bytes((planted_run / TOKEN_DIFFS).read_bytes())
    active = diffs["active_mask"]
    r = (
        diffs["training_logprobs"].to(torch.float64) - diffs["rollout_logprobs"].to(torch.float64)
    )[active].tolist()
    # the operator is what was planted: c on every token (float32 rounding of logprobs near 1)
    assert all(x == pytest.approx(C, abs=1e-5) for x in r)
    assert part["active_tokens"] == len(r) > 0
    assert part["weight"]["min"] == pytest.approx(math.exp(min(r)), rel=1e-12)
    assert part["weight"]["max"] == pytest.approx(math.exp(max(r)), rel=1e-12)
    assert part["weight"]["mean"] == pytest.approx(sum(math.exp(x) for x in r) / len(r), rel=1e-12)
    assert part["log_weight"]["min"] == min(r) and part["log_weight"]["max"] == max(r)
    corrections = part["corrections"]
    for cap in (2, 3, 5):
        expected = 1.0 if C > math.log(cap) else 0.0
        assert corrections[f"tis_clipped_token_fraction_cap_{cap}"] == expected, cap
    assert math.log(2) < C < math.log(3)  # both branches above are exercised
    # a constant shift leaves the weights (nearly) equal: ESS 1 up to the rounding spread
    mean = sum(math.exp(x) for x in r) / len(r)
    ess = 1.0 / (sum((math.exp(x) / mean) ** 2 for x in r) / len(r))
    assert part["ess"] == pytest.approx(ess, rel=1e-12)
    assert ess == pytest.approx(1.0, abs=1e-9)
    # every sequence's geometric ratio is exp(c) ~ 2.72: masked by each seq-mask-tis band
    for band in ("0999_1001", "0999_1002", "05_2"):
        assert corrections[f"seq_mask_tis_masked_sequence_fraction_{band}"] == 1.0, band


def test_verify_accepts_the_planted_case(planted_run: Path) -> None:
    code, out, err = cli("verify", planted_run.parent.parent.parent)
    assert (code, err) == (0, ""), out
