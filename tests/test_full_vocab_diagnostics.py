"""Full-vocabulary diagnostics wired through the runner, the store and verify (cpu-smoke).

Opt-in per experiment (``$.diagnostics.full_vocabulary``): case ids do not change, the
execution key does; each attempt seals ``divergence.pt`` (per-position reductions and top
tokens only) and comparison.json summarizes it; ``verify`` recomputes the summary; verdicts
are exactly those of the same experiment without diagnostics.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import ATTEMPT_FILES, OFFSET_LABEL, S0, run_by_label

from pytest_logprob_drift import ConfigError, plan_file
from pytest_logprob_drift.check.resume import check_attempt, load_sealed_tensors
from pytest_logprob_drift.check.verify import verify_run
from pytest_logprob_drift.diagnostics.full_vocabulary.check import check_divergence
from pytest_logprob_drift.execute.runner import CaseResult
from pytest_logprob_drift.numerics.comparison import Diagnostics, from_builtins
from pytest_logprob_drift.numerics.divergence_file import SEALED_KEYS
from pytest_logprob_drift.numerics.full_vocabulary import DIVERGENCE_FIELDS
from pytest_logprob_drift.runtimes.smoke.runtime import (
    HIDDEN,
    CpuSmokeAdapter,
    SyntheticCausalModel,
)
from pytest_logprob_drift.store.seal import SealError


def config(work: Path, diagnostics: Any | None, name: str = "config.json") -> str:
    document: dict[str, Any] = copy.deepcopy(json.loads(S0.read_text()))
    if diagnostics is not None:
        document["diagnostics"] = diagnostics
    document["interventions"].append({"path": "rollout.dtype", "values": ["bfloat16"]})
    path = work / name
    path.write_text(json.dumps(document))
    return str(path)


def run_all(work: Path, path: str, artifacts: Path) -> dict[str, CaseResult]:
    return run_by_label(
        plan_file(path),
        runtime="cpu-smoke",
        artifacts=artifacts,
        allow_smoke=True,
        adapter=CpuSmokeAdapter(),
    )


def test_case_ids_do_not_depend_on_the_diagnostics(work: Path) -> None:
    without = plan_file(config(work, None, "a.json"))
    with_ = plan_file(config(work, {"full_vocabulary": {"top_k": 3}}, "b.json"))
    assert [c.case.case_id for c in without.cases] == [c.case.case_id for c in with_.cases]
    assert with_.plan.full_vocabulary is not None and with_.plan.full_vocabulary.top_k == 3
    assert without.plan.full_vocabulary is None
    off = plan_file(config(work, {"full_vocabulary": False}, "c.json"))
    assert off.plan.full_vocabulary is None


@pytest.mark.parametrize(
    ("diagnostics", "where"),
    [
        ({"full_vocabulary": {"top_k": 0}}, "$.diagnostics.full_vocabulary.top_k"),
        ({"full_vocabulary": {"worst": 1}}, "$.diagnostics.full_vocabulary.worst"),
        ({"kl": True}, "$.diagnostics.kl"),
        ({"full_vocabulary": "yes"}, "$.diagnostics.full_vocabulary"),
    ],
)
def test_bad_diagnostics_name_their_path(work: Path, diagnostics: Any, where: str) -> None:
    with pytest.raises(ConfigError) as info:
        plan_file(config(work, diagnostics))
    assert where in str(info.value)


def test_sealed_reductions_summary_and_verify(work: Path) -> None:
    plain = run_all(work, config(work, None, "a.json"), work / "plain")
    diag = run_all(
        work,
        config(work, {"full_vocabulary": {"top_k": 3, "worst_positions": 2}}, "b.json"),
        work / "diag",
    )
    assert (
        set(plain)
        == set(diag)
        == {"baseline", "batch.size=1", OFFSET_LABEL, "rollout.dtype=bfloat16"}
    )
    for label, result in diag.items():
        # Never changes a verdict.
        before = plain[label].comparison.to_json()
        after = result.comparison.to_json()
        for key in ("outcome", "mismatches", "active_tokens", "reason", "numerical"):
            assert after[key] == before[key], (label, key)
        assert result.attempt_dir is not None
        assert {p.name for p in result.attempt_dir.iterdir()} == ATTEMPT_FILES | {"divergence.pt"}
        summary = after["diagnostics"]["full_vocabulary"]
        assert summary["positions"] == after["active_tokens"]
        assert len(summary["worst_positions"]) == 2
        assert all(len(w["top_tokens"]) == 3 for w in summary["worst_positions"])
        assert after["diagnostics"]["semantic_offset"]["fires"] is False
        seal = check_attempt(result.attempt_dir, expected_key=None).seal
        sealed = load_sealed_tensors(result.attempt_dir, "divergence.pt", seal)
        assert set(sealed) == SEALED_KEYS
        # Only reductions: nothing of vocabulary width is sealed.
        assert all(t.shape[-1] != 64 for t in sealed.values())
    # Same model and dtype on both sides: the distributions agree; bf16 rollout: they do not.
    assert diag["baseline"].comparison.diagnostics.full_summary.total_variation.max < 1e-5
    bf16 = diag["rollout.dtype=bfloat16"].comparison.diagnostics.full_summary
    assert bf16.total_variation.max > 1e-4
    assert bf16.kl_rollout_training.infinite == 0
    statuses = verify_run(work / "diag" / "s0-cpu-smoke")
    assert {s.status for s in statuses} == {"ok"}


@torch.no_grad()
def decode_logits(model: SyntheticCausalModel, ids: torch.Tensor, length: int) -> torch.Tensor:
    """The rollout's own incremental path, teacher-forced on the sealed tokens: row t is the
    distribution after token t."""
    running = torch.zeros(HIDDEN, dtype=model.embed.dtype)
    rows = []
    for position in range(length):
        logits, running = model.step(ids[position], running, torch.tensor(float(position + 1)))
        rows.append(logits)
    return torch.stack(rows)


@torch.no_grad()
def test_reductions_reproduce_from_the_model(work: Path) -> None:
    """An independent recompute: the synthetic model run again on the sealed token ids (the
    rollout's decode path in bf16, the trainer's teacher-forced forward in fp32) reproduces the
    sealed KL and TV."""
    results = run_all(work, config(work, {"full_vocabulary": True}, "b.json"), work / "runs")
    result = results["rollout.dtype=bfloat16"]
    assert result.attempt_dir is not None
    seal = check_attempt(result.attempt_dir, expected_key=None).seal
    scored = load_sealed_tensors(result.attempt_dir, "score_rollout.pt", seal)
    sealed = load_sealed_tensors(result.attempt_dir, "divergence.pt", seal)
    ids, attention, active = scored["token_ids"], scored["attention_mask"], scored["active_mask"]
    trainer = SyntheticCausalModel().eval()
    training = trainer(ids, attention)[:, :-1][active[:, 1:]]
    sampler = SyntheticCausalModel().to(torch.bfloat16).eval()
    rollout = torch.cat(
        [
            decode_logits(sampler, ids[i], int(attention[i].sum()) - 1)[active[i, 1 : n + 1]]
            for i in range(ids.shape[0])
            for n in [int(attention[i].sum()) - 1]
        ]
    )
    lp = torch.log_softmax(rollout.double(), -1)
    lq = torch.log_softmax(training.double(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    tv = 0.5 * (lp.exp() - lq.exp()).abs().sum(-1)
    assert float(tv.max()) > 1e-4  # a real difference, reproduced
    assert torch.allclose(sealed["kl_rollout_training"][active], kl, atol=1e-6, rtol=0)
    assert torch.allclose(sealed["total_variation"][active], tv, atol=1e-6, rtol=0)


def test_verify_refuses_a_summary_that_disagrees(work: Path) -> None:
    results = run_all(work, config(work, {"full_vocabulary": True}, "b.json"), work / "runs")
    attempt = results["rollout.dtype=bfloat16"].attempt_dir
    assert attempt is not None
    checked = check_attempt(attempt, expected_key=None)
    sealed = load_sealed_tensors(attempt, "divergence.pt", checked.seal)
    diffs = load_sealed_tensors(attempt, "token_diffs.pt", checked.seal)
    recorded = checked.comparison.diagnostics
    check_divergence(recorded, sealed, diffs)
    forged = copy.deepcopy(recorded.to_json())
    forged["full_vocabulary"]["total_variation"]["max"] = 0.0
    with pytest.raises(SealError, match="full_vocabulary summary"):
        check_divergence(from_builtins(forged, Diagnostics), sealed, diffs)
    moved = dict(sealed)
    moved["total_variation"] = sealed["total_variation"] * 0.5
    with pytest.raises(SealError, match=r"divergence\.pt"):
        check_divergence(recorded, moved, diffs)
    with pytest.raises(SealError, match="not sealed"):
        check_divergence(recorded, None, diffs)
    bad = dict(sealed)
    bad["top_rows"] = torch.tensor([10_000])
    with pytest.raises(SealError, match="not active"):
        check_divergence(recorded, bad, diffs)


def test_unavailable_is_recorded_not_fatal(work: Path) -> None:
    """A side that hands back no distributions: the case still gets its verdict."""

    class NoFull(CpuSmokeAdapter):
        def build_training(self, binding: Any, identity: Any) -> Any:
            scorer = super().build_training(binding, identity)
            scorer.full_vocabulary = False
            return scorer

    results = run_by_label(
        plan_file(config(work, {"full_vocabulary": True})),
        runtime="cpu-smoke",
        artifacts=work / "runs",
        allow_smoke=True,
        adapter=NoFull(),
    )
    entry = results["baseline"].comparison.diagnostics.unavailable
    assert "training side did not hand back" in entry
    assert results["baseline"].outcome.value == "PASS"
    assert {s.status for s in verify_run(work / "runs" / "s0-cpu-smoke")} == {"ok"}
    assert math.isfinite(results["baseline"].comparison.diagnostics.max_abs_diff)
    assert DIVERGENCE_FIELDS


def test_cli_table_and_json_show_the_diagnostics(work: Path) -> None:
    import io

    from pytest_logprob_drift.cli import main

    path = config(work, {"full_vocabulary": {"top_k": 2, "worst_positions": 1}})
    args = ["run", path, "--runtime", "cpu-smoke", "--allow-smoke-operators"]
    args += ["--artifacts", str(work / "runs"), "--expect", f"{OFFSET_LABEL}=MISMATCH"]
    args += ["--expect", "rollout.dtype=bfloat16=MISMATCH"]
    out, err = io.StringIO(), io.StringIO()
    code = main(args, out=out, err=err)
    assert code == 0, err.getvalue()
    text = out.getvalue()
    assert "KL(r||t) mean" in text and "TV max" in text
    assert "rollout.dtype=bfloat16: full vocabulary over" in text
    out = io.StringIO()
    assert main([*args, "--json"], out=out, err=io.StringIO()) == 0
    results = {r["label"]: r for r in json.loads(out.getvalue())["results"]}
    assert results["baseline"]["semantic_offset"]["fires"] is False
    assert results["baseline"]["full_vocabulary"]["positions"] > 0
