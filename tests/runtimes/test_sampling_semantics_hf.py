"""Sampling semantics and full-vocabulary diagnostics on the ``hf`` runtime (real tiny Qwen3).

top_p 0.9 in the identity; the rollout reports raw or processed logprobs
(``rollout.logprobs_mode``), the trainer scores raw or processed (``training.logprob_semantics``).
Verdicts: same semantics on both sides PASS, different semantics MISMATCH explained by the
semantic-offset diagnostic. An independent recompute with plain transformers (the rollout's
KV-cache decode of the sealed token ids, a top-p written here, float64 reductions) reproduces
the sealed KL and TV of an fp32 case within 1e-6.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from drift_testing import S0_HF, run_by_label  # noqa: E402

from pytest_logprob_drift import plan_file  # noqa: E402
from pytest_logprob_drift.check.resume import check_attempt, load_sealed_tensors  # noqa: E402
from pytest_logprob_drift.check.verify import verify_run  # noqa: E402
from pytest_logprob_drift.outcomes import Outcome  # noqa: E402
from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint  # noqa: E402

pytestmark = pytest.mark.slow

TOP_P = 0.9
ROLLOUT = "rollout.logprobs_mode=processed_logprobs"
TRAINING = "training.logprob_semantics=processed"
BOTH = f"{ROLLOUT},{TRAINING}"


def semantics_config(path: Path) -> str:
    document: dict[str, Any] = json.loads(S0_HF.read_text())
    document["experiment_id"] = "hf-sampling-semantics"
    document["identity"]["sampling"]["top_p"] = TOP_P
    document["diagnostics"] = {"full_vocabulary": {"top_k": 4, "worst_positions": 3}}
    document["strategy"] = "pairwise"
    document["baseline"]["rollout"]["logprobs_mode"] = "raw_logprobs"
    document["baseline"]["training"]["logprob_semantics"] = "raw"
    document["interventions"] = [
        {"path": "rollout.logprobs_mode", "values": ["processed_logprobs"]},
        {"path": "training.logprob_semantics", "values": ["processed"]},
    ]
    document["pairs"] = [["rollout.logprobs_mode", "training.logprob_semantics"]]
    path.write_text(json.dumps(document))
    return str(path)


@pytest.fixture(scope="module")
def semantics_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("hf-semantics")
    plan = plan_file(semantics_config(work / "config.json"))
    results = run_by_label(plan, runtime="hf", artifacts=work / "runs")
    yield {"results": results, "run_dir": work / "runs" / "hf-sampling-semantics"}


def test_verdicts_and_the_offset_diagnostic(semantics_run: dict[str, Any]) -> None:
    results = semantics_run["results"]
    assert set(results) == {"baseline", ROLLOUT, TRAINING, BOTH}
    expected = {
        "baseline": Outcome.PASS,
        ROLLOUT: Outcome.MISMATCH,
        TRAINING: Outcome.MISMATCH,
        BOTH: Outcome.PASS,
    }
    for label, outcome in expected.items():
        result = results[label]
        assert result.outcome is outcome, (label, result.reason)
        offset = result.comparison.to_json()["diagnostics"]["semantic_offset"]
        # Fires exactly where the two sides apply different semantics.
        assert offset["fires"] is (outcome is Outcome.MISMATCH), (label, offset)
        records = {r["knob"]: r for r in result.comparison.to_json()["records"]}
        assert {r["status"] for r in records.values()} == {"applied"}, records
    message = results[ROLLOUT].comparison.to_json()["diagnostics"]["semantic_offset"]["message"]
    assert message.startswith("truncation renormalization: |diff| matches log S within 1e-05")
    # The contract's minor version is recorded in every comparison.
    assert all(r.comparison.to_json()["contract"]["minor_version"] == 1 for r in results.values())
    assert {s.status for s in verify_run(semantics_run["run_dir"])} == {"ok"}


def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """float64 processed logprobs, written independently: keep a token while the mass of the
    strictly more likely tokens is below top_p; renormalize."""
    probs = torch.softmax(logits.double(), -1)
    ordered, order = probs.sort(-1, descending=True)
    above = ordered.cumsum(-1) - ordered
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, above < top_p)
    logp = torch.log_softmax(logits.double(), -1).masked_fill(~keep, -math.inf)
    return logp - torch.logsumexp(logp, -1, keepdim=True)


@torch.no_grad()
def _decode_logits(
    model: Any, ids: torch.Tensor, totals: list[int], prompts: list[int], pad: int
) -> torch.Tensor:
    """Plain transformers, the rollout's path: left-padded prompts of one chunk through a
    DynamicCache, then the sealed tokens one step at a time; the step logits of every
    generated position, ``[B, T, V]``."""
    rows, width = len(prompts), max(prompts)
    steps = max(total - length for total, length in zip(totals, prompts, strict=True))
    inputs = torch.full((rows, width), pad, dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.long)
    for i, length in enumerate(prompts):
        inputs[i, width - length :] = ids[i, :length]
        mask[i, width - length :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = transformers.DynamicCache(config=model.config)
    out = model(
        input_ids=inputs,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    logits = [out.logits[:, -1, :]]
    last = positions[:, -1:]
    for t in range(steps - 1):
        token = torch.tensor(
            [
                int(ids[i, length + t]) if length + t < totals[i] else pad
                for i, length in enumerate(prompts)
            ]
        )
        last = last + 1
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        out = model(
            input_ids=token.unsqueeze(1),
            attention_mask=mask,
            position_ids=last,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits.append(out.logits[:, -1, :])
    return torch.stack(logits, dim=1)


def test_plain_transformers_reproduces_the_sealed_divergence(
    semantics_run: dict[str, Any],
) -> None:
    result = semantics_run["results"][ROLLOUT]
    attempt = result.attempt_dir
    seal = check_attempt(attempt, expected_key=None).seal
    scored = load_sealed_tensors(attempt, "score_rollout.pt", seal)
    sealed = load_sealed_tensors(attempt, "divergence.pt", seal)
    ids, active = scored["token_ids"], scored["active_mask"]
    prompt_lengths = scored["prompt_lengths"].tolist()
    checkpoint = resolve_checkpoint("tiny://qwen3-h64-v1", expected_digest=None)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoint.path, dtype=torch.float32, attn_implementation="sdpa", local_files_only=True
    ).eval()
    config = json.loads((checkpoint.path / "config.json").read_text())
    pad = int(config.get("pad_token_id") or 0)
    # The rollout decodes the whole batch (batch.size 4) as one chunk.
    totals = [int(t) for t in scored["attention_mask"].sum(-1).tolist()]
    decoded = _decode_logits(model, ids, totals, prompt_lengths, pad)
    rollout_rows, training_rows = [], []
    with torch.no_grad():
        teacher = model(
            input_ids=ids,
            attention_mask=scored["attention_mask"].long(),
            position_ids=scored["position_ids"],
            use_cache=False,
        ).logits
    for i, length in enumerate(prompt_lengths):
        count = int(active[i].sum())
        rollout_rows.append(_top_p(decoded[i, :count], TOP_P))
        rows = teacher[i, length - 1 : length - 1 + count]
        training_rows.append(torch.log_softmax(rows.double(), -1))
    lp, lq = torch.cat(rollout_rows), torch.cat(training_rows)
    p, q = lp.exp(), lq.exp()
    support = torch.isfinite(lp)
    kl = torch.where(support, p * (lp - lq), 0.0).sum(-1)
    tv = 0.5 * (p - q).abs().sum(-1)
    log_s = torch.logsumexp(lq.masked_fill(~support, -math.inf), -1)
    assert float(kl.max()) > 1e-3  # a real divergence, reproduced
    assert torch.allclose(sealed["kl_rollout_training"][active], kl, atol=1e-6, rtol=0)
    assert torch.allclose(sealed["total_variation"][active], tv, atol=1e-6, rtol=0)
    assert torch.allclose(
        sealed["log_mass_training_on_rollout_support"][active], log_s, atol=1e-6, rtol=0
    )
    assert bool(torch.isinf(sealed["kl_training_rollout"][active]).all())


def test_float32_lm_head_on_a_bf16_trainer() -> None:
    """``training.lm_head_dtype=float32``: the body stays bf16, the head and logits are float32
    (read back from the live model), and the logits are closer to the fp32 model's."""
    from pytest_logprob_drift.runtimes.transformers import engine as hf_engine

    checkpoint = resolve_checkpoint("tiny://qwen3-h64-v1", expected_digest=None)

    def load(dtype: str, head: str) -> Any:
        return hf_engine.load_model(
            checkpoint.path, dtype=dtype, attn_implementation="sdpa", lm_head_dtype=head
        )

    fp32_head = load("bfloat16", "float32")
    back = hf_engine.read_back(fp32_head)
    assert (back["param_dtype"], back["lm_head_dtype"]) == ("bfloat16", "float32")
    compute = load("bfloat16", "compute")
    assert hf_engine.read_back(compute)["lm_head_dtype"] == "bfloat16"
    reference = load("float32", "compute")
    ids = torch.tensor([[300, 417, 529, 640, 950, 12, 77]])
    with torch.no_grad():
        head_logits = fp32_head(input_ids=ids).logits
        plain_logits = compute(input_ids=ids).logits
        exact = reference(input_ids=ids).logits
    assert head_logits.dtype == torch.float32 and plain_logits.dtype == torch.bfloat16
    assert not torch.equal(head_logits, plain_logits.float())
    assert float((head_logits - exact).abs().mean()) <= float(
        (plain_logits.float() - exact).abs().mean()
    )
