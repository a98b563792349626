"""The FSDP trainer does what the in-process trainer does: processed semantics, a float32 LM
head, full-vocabulary rows at the active positions (real tiny Qwen3, real gloo ranks).

Tolerances are derived, not tuned: with the rollout's distribution ``p`` fixed and two training
distributions whose logprobs differ by at most ``delta`` (sup norm over the finite entries, same
support), ``|KL(p||q') - KL(p||q)| <= delta``, ``|TV' - TV| <= (e^delta - 1) / 2`` and
``|KL(q'||p) - KL(q||p)| <= delta * e^delta + (e^delta - 1) * sum q |log q - log p|``.
The engine-level tests measure ``delta`` between the two trainers' rows; the end-to-end test
takes the contract threshold as ``delta`` (both trainers agree within it on every token: the
verdict every FSDP case must reach). Each bound gets float64 accumulation slack of a few units
of float32 rounding of the compared value (the reductions tile in float32).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from drift_testing import S0_HF, run_by_label  # noqa: E402

from pytest_logprob_drift import plan_file  # noqa: E402
from pytest_logprob_drift.check.resume import check_attempt, load_sealed_tensors  # noqa: E402
from pytest_logprob_drift.check.verify import verify_run  # noqa: E402
from pytest_logprob_drift.config.contract import resolve_contract  # noqa: E402
from pytest_logprob_drift.numerics.full_vocabulary import Divergence, full_vocab_divergence  # noqa: E402
from pytest_logprob_drift.numerics.sampling import Truncation  # noqa: E402
from pytest_logprob_drift.outcomes import Outcome  # noqa: E402
from pytest_logprob_drift.runtimes.batch import active_rows  # noqa: E402
from pytest_logprob_drift.runtimes.tiny_model import ResolvedCheckpoint, resolve_checkpoint  # noqa: E402
from pytest_logprob_drift.runtimes.transformers import engine as hf_engine  # noqa: E402
from pytest_logprob_drift.runtimes.transformers import fsdp as fsdp_scoring  # noqa: E402

pytestmark = pytest.mark.slow

TINY = "tiny://qwen3-h64-v1"
PROMPTS = [[2, 75, 366, 111], [2, 300, 301], [2, 5, 6, 7, 8, 9, 10], [2, 400, 17, 93, 250]]
EOS, PAD = 1, 0
TRUNCATION = Truncation(temperature=0.8, top_p=0.9, top_k=50)
THRESHOLD = resolve_contract("ws1", "current").threshold
F32_EPS = torch.finfo(torch.float32).eps


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> ResolvedCheckpoint:
    return resolve_checkpoint(TINY, expected_digest=None, cache_root=tmp_path_factory.mktemp("c"))


@pytest.fixture(scope="module")
def processed_rollout(tiny: ResolvedCheckpoint) -> tuple[dict[str, Any], Any]:
    """fp32 KV-cache rollout reporting processed logprobs, and its ``[A, V]`` rows."""
    model = hf_engine.load_model(tiny.path, dtype="float32", attn_implementation="sdpa")
    steps: list[list[Any]] = []
    batch = hf_engine.hf_rollout(
        model,
        PROMPTS,
        seed=7,
        max_new_tokens=12,
        temperature=TRUNCATION.temperature,
        eos_token_id=EOS,
        pad_token_id=PAD,
        batch_size=4,
        logp_fn=hf_engine.native_selected_logprob,
        truncation=TRUNCATION,
        logprobs_mode="processed_logprobs",
        steps=steps,
    )
    return batch, active_rows(steps, batch["active_mask"])


def sup_delta(a: Any, b: Any) -> float:
    """Sup norm of the logprob difference of two ``[A, V]`` row sets over the finite entries;
    asserts first that they have the same support."""
    la, lb = torch.log_softmax(a.double(), -1), torch.log_softmax(b.double(), -1)
    assert torch.equal(torch.isfinite(la), torch.isfinite(lb)), "supports differ"
    finite = torch.isfinite(la)
    return float((la - lb).abs()[finite].max()) if bool(finite.any()) else 0.0


def assert_within_derived_bounds(
    rollout: Any, here: Divergence, other: Divergence, training_rows: Any, delta: float
) -> None:
    """``other`` (FSDP) agrees with ``here`` (in process) within the bounds ``delta`` implies."""
    grow = math.expm1(delta)
    lp = torch.log_softmax(rollout.double(), -1)
    lq = torch.log_softmax(training_rows.double(), -1)
    both = torch.isfinite(lp) & torch.isfinite(lq)
    spread = torch.where(both, lq.exp() * (lq - lp).abs(), 0.0).sum(-1)
    bounds = {
        "kl_rollout_training": torch.full_like(spread, delta),
        "total_variation": torch.full_like(spread, grow / 2),
        "kl_training_rollout": delta * math.exp(delta) + grow * spread,
        "log_mass_training_on_rollout_support": torch.full_like(spread, delta),
        "log_mass_rollout_on_training_support": torch.full_like(spread, delta),
    }
    for name, bound in bounds.items():
        a, b = getattr(here, name), getattr(other, name)
        assert torch.equal(torch.isinf(a), torch.isinf(b)), name
        finite = torch.isfinite(a)
        slack = 8 * F32_EPS * (1 + a.abs())
        gap = (a - b).abs()
        assert bool((gap[finite] <= (bound + slack)[finite]).all()), (
            name,
            float(gap[finite].max()),
            float(bound.max()),
        )


def test_fsdp_processed_semantics_and_full_vocab_match_the_in_process_trainer(
    tiny: ResolvedCheckpoint, processed_rollout: tuple[dict[str, Any], Any]
) -> None:
    batch, rollout_rows = processed_rollout
    active = batch["active_mask"]
    model = hf_engine.load_model(tiny.path, dtype="float32", attn_implementation="sdpa")
    here_rows: list[Any] = []
    here = hf_engine.hf_teacher_forced_score(
        model,
        batch,
        batch_size=4,
        logp_fn=hf_engine.native_selected_logprob,
        processed=TRUNCATION,
        full_vocab=here_rows,
    )
    fsdp_rows: list[Any] = []
    with fsdp_scoring.FsdpScorerGroup(
        tiny.path, dtype="float32", attn_implementation="sdpa", world_size=2
    ) as group:
        sharded, evidence = group.score(
            batch,
            batch_size=4,
            logp_backend=fsdp_scoring.NATIVE_LOGP,
            processed=TRUNCATION,
            full_vocab=fsdp_rows,
        )
        raw, raw_evidence = group.score(batch, batch_size=4, logp_backend=fsdp_scoring.NATIVE_LOGP)
    (got,) = fsdp_rows
    expected = torch.cat(here_rows)
    count = int(active.sum())
    assert got.dtype == torch.float32 and got.shape == expected.shape == rollout_rows.shape
    assert got.shape[0] == count == evidence["full_vocab_rows"]
    assert evidence["logprob_semantics"] == "processed" and evidence["ranks_agree"] is True
    assert evidence["lm_head_dtype"] == "float32" and evidence["readonly_violations"] == []
    assert raw_evidence["logprob_semantics"] == "raw" and raw_evidence["full_vocab_rows"] == 0
    # Processed rows are truncated (-inf outside top-k/top-p), like the rollout's.
    assert bool(torch.isinf(got).any())
    delta = sup_delta(expected, got)
    assert delta <= THRESHOLD
    # The sampled-token scores are those rows' logprobs: within the same delta.
    assert float((sharded - here).abs()[active].max()) <= delta + 8 * F32_EPS
    assert float((sharded - raw).abs()[active].max()) > THRESHOLD  # semantics really differ
    assert float((sharded - batch["logprobs"]).abs()[active].max()) <= THRESHOLD
    assert_within_derived_bounds(
        rollout_rows,
        full_vocab_divergence(rollout_rows, expected),
        full_vocab_divergence(rollout_rows, got),
        expected,
        delta,
    )


def test_fsdp_float32_lm_head_on_a_bf16_body(
    tiny: ResolvedCheckpoint, processed_rollout: tuple[dict[str, Any], Any]
) -> None:
    batch, _ = processed_rollout
    active = batch["active_mask"]
    model = hf_engine.load_model(
        tiny.path, dtype="bfloat16", attn_implementation="sdpa", lm_head_dtype="float32"
    )
    here_rows: list[Any] = []
    here = hf_engine.hf_teacher_forced_score(
        model, batch, batch_size=4, logp_fn=hf_engine.native_selected_logprob, full_vocab=here_rows
    )
    head_rows: list[Any] = []
    compute_rows: list[Any] = []
    with fsdp_scoring.FsdpScorerGroup(
        tiny.path, dtype="bfloat16", attn_implementation="sdpa", world_size=2
    ) as group:
        head, head_ev = group.score(
            batch,
            batch_size=4,
            logp_backend=fsdp_scoring.NATIVE_LOGP,
            lm_head_dtype="float32",
            full_vocab=head_rows,
        )
        _, compute_ev = group.score(
            batch, batch_size=4, logp_backend=fsdp_scoring.NATIVE_LOGP, full_vocab=compute_rows
        )
        assert head_ev["param_dtype"] == "bfloat16"
        assert head_ev["state_digests_before"] == compute_ev["state_digests_after"]
    assert (head_ev["lm_head_dtype"], compute_ev["lm_head_dtype"]) == ("float32", "bfloat16")
    (got,), (compute,) = head_rows, compute_rows
    expected = torch.cat(here_rows)
    assert expected.dtype == torch.float32  # the in-process float32 head
    assert not torch.equal(got, compute)  # compute rows are bf16 values (sent as float32)
    assert torch.equal(compute, compute.bfloat16().float())
    delta = sup_delta(expected, got)
    assert delta <= THRESHOLD
    assert float((head - here).abs()[active].max()) <= delta + 8 * F32_EPS


# --------------------------------------------------------------------------- end to end


def fsdp_config(path: Path) -> str:
    document: dict[str, Any] = json.loads(S0_HF.read_text())
    document["experiment_id"] = "hf-fsdp-full-vocab"
    document["identity"]["sampling"]["top_p"] = 0.9
    document["diagnostics"] = {"full_vocabulary": {"top_k": 4, "worst_positions": 3}}
    document["baseline"]["rollout"]["logprobs_mode"] = "processed_logprobs"
    document["baseline"]["training"]["logprob_semantics"] = "processed"
    document["interventions"] = [{"path": "training.sharding", "values": ["fsdp"]}]
    path.write_text(json.dumps(document))
    return str(path)


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("hf-fsdp-full-vocab")
    plan = plan_file(fsdp_config(work / "config.json"))
    results = run_by_label(plan, runtime="hf", artifacts=work / "runs")
    yield {"results": results, "run_dir": work / "runs" / "hf-fsdp-full-vocab"}


def _sealed(result: Any, name: str) -> dict[str, Any]:
    seal = check_attempt(result.attempt_dir, expected_key=None).seal
    return load_sealed_tensors(result.attempt_dir, name, seal)


def test_fsdp_case_seals_full_vocab_divergence_that_agrees_with_the_unsharded_trainer(
    fsdp_run: dict[str, Any],
) -> None:
    results = fsdp_run["results"]
    base, fsdp = results["baseline"], results["training.sharding=fsdp"]
    for result in (base, fsdp):
        assert result.outcome is Outcome.PASS, result.reason
        full = result.comparison.to_json()["diagnostics"]["full_vocabulary"]
        assert "unavailable" not in full, full
        assert result.comparison.to_json()["diagnostics"]["semantic_offset"]["fires"] is False
    records = {r["knob"]: r for r in fsdp.comparison.to_json()["records"]}
    assert {r["status"] for r in records.values()} == {"applied"}, records
    actual = json.loads((fsdp.attempt_dir / "actual.json").read_text())["knobs"]
    assert actual["training.sharding"]["actual"] == "fsdp"
    assert actual["training.logprob_semantics"]["actual"] == "processed"
    assert {s.status for s in verify_run(fsdp_run["run_dir"])} == {"ok"}

    # Same rollout in both cases; the two trainers agree within the contract threshold, which
    # bounds how far the sealed reductions may move (module docstring).
    r_base, r_fsdp = _sealed(base, "score_rollout.pt"), _sealed(fsdp, "score_rollout.pt")
    assert torch.equal(r_base["token_ids"], r_fsdp["token_ids"])
    assert torch.equal(r_base["logprobs"], r_fsdp["logprobs"])
    active = r_base["active_mask"]
    t_base, t_fsdp = _sealed(base, "score_training.pt"), _sealed(fsdp, "score_training.pt")
    assert float((t_base["logprobs"] - t_fsdp["logprobs"]).abs()[active].max()) <= THRESHOLD
    d_base, d_fsdp = _sealed(base, "divergence.pt"), _sealed(fsdp, "divergence.pt")
    delta, grow = THRESHOLD, math.expm1(THRESHOLD)
    kl_tr = d_base["kl_training_rollout"][active]
    bounds = {
        "kl_rollout_training": torch.full_like(kl_tr, delta),
        "total_variation": torch.full_like(kl_tr, grow / 2),
        # sum q |log q - log p| = KL(q||p) + 2 sum_{q<p} q log(p/q) <= KL(q||p) + 2 TV,
        # since q log(p/q) <= p - q.
        "kl_training_rollout": delta * math.exp(delta)
        + grow * (kl_tr + 2 * d_base["total_variation"][active]),
    }
    for name, bound in bounds.items():
        a, b = d_base[name][active], d_fsdp[name][active]
        assert torch.equal(torch.isinf(a), torch.isinf(b)), name
        finite = torch.isfinite(a)
        gap = (a - b).abs()[finite]
        assert bool((gap <= (bound + 8 * F32_EPS * (1 + a.abs()))[finite]).all()), (
            name,
            float(gap.max()),
        )


def test_fsdp_float32_lm_head_knob_is_applied_and_read_back(tmp_path: Path) -> None:
    """``training.lm_head_dtype=float32`` under ``training.sharding=fsdp`` with a bf16 body:
    applied (no longer refused), and its actual value read back from the logits the ranks'
    LM head produced; ``compute`` reads back as such."""
    document: dict[str, Any] = json.loads(S0_HF.read_text())
    document["experiment_id"] = "hf-fsdp-lm-head"
    document["diagnostics"] = {"full_vocabulary": True}
    document["baseline"]["training"].update(
        {"compute_dtype": "bfloat16", "sharding": "fsdp", "lm_head_dtype": "compute"}
    )
    document["interventions"] = [{"path": "training.lm_head_dtype", "values": ["float32"]}]
    config = tmp_path / "config.json"
    config.write_text(json.dumps(document))
    results = run_by_label(plan_file(str(config)), runtime="hf", artifacts=tmp_path / "runs")
    for label, head in (("baseline", "compute"), ("training.lm_head_dtype=float32", "float32")):
        result = results[label]
        assert result.outcome in (Outcome.PASS, Outcome.MISMATCH), (label, result.reason)
        actual = json.loads((result.attempt_dir / "actual.json").read_text())
        knobs = actual["knobs"]
        assert (
            knobs["training.lm_head_dtype"]["status"],
            knobs["training.lm_head_dtype"]["actual"],
        ) == (
            "applied",
            head,
        )
        assert knobs["training.sharding"]["actual"] == "fsdp"
        assert actual["training_evidence"]["lm_head_dtype"] == (
            "float32" if head == "float32" else "bfloat16"
        )
        assert "unavailable" not in result.comparison.to_json()["diagnostics"]["full_vocabulary"]
