"""The ``hf`` runtime end to end on the real tiny Qwen3: verdicts, FSDP ranks, read-only guard.

Runs experiments/cross_config_s0_hf_tiny.json through the same Runner the CLI and the plugin
use, then checks the sealed artifacts, and recomputes one case's training logprobs with plain
transformers code written here.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from drift_testing import S0_HF, make_runner  # noqa: E402

from pytest_logprob_drift import plan_file  # noqa: E402
from pytest_logprob_drift.execute.runner import CaseResult  # noqa: E402
from pytest_logprob_drift.outcomes import Outcome  # noqa: E402
from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint  # noqa: E402
from pytest_logprob_drift.runtimes.transformers.adapter import HfAdapter, HfTrainingScorer  # noqa: E402

pytestmark = pytest.mark.slow  # every test here runs the real transformers runtime

CONFIG = S0_HF

EOS = 1  # the tiny checkpoint's special ids: pad 0, eos 1, bos 2 (tiny_model.SPECIAL_TOKENS)
# Prompts and seed chosen so that samples 1 and 3 stop at EOS within 16 sampled tokens on the
# tiny Qwen3 (each sample draws from its own seeded generator); the test asserts that at least
# one did, so it cannot pass without an EOS-terminated response.
EOS_PROMPTS = [
    [300, 417, 529, 640, 950],
    [301, 700, 7, 983],
    [455, 556, 657, 758, 859, 960, 950],
    [333, 444, 935],
]
EOS_SEED = 14


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    artifacts = tmp_path_factory.mktemp("hf-runs")
    execution_plan = plan_file(str(CONFIG))
    with make_runner(execution_plan, runtime="hf", artifacts=artifacts) as runner:
        results = runner.run()
        counts = (runner.pool.rollout_constructions, runner.pool.training_constructions)
        bindings = [runner.binding(ec) for ec in execution_plan.cases]
    yield {
        "results": {r.label: r for r in results},
        "counts": counts,
        "bindings": bindings,
        "artifacts": artifacts,
    }


def _load(attempt: Path, name: str) -> dict[str, Any]:
    return torch.load(io.BytesIO((attempt / name).read_bytes()), weights_only=True)


def _baseline_with_mask_policy(tmp_path: Path, mask_policy: str) -> CaseResult:
    """The fp32 baseline case of the hf config, on ``EOS_PROMPTS`` under ``mask_policy``."""
    document = json.loads(CONFIG.read_text())
    identity = document["identity"]
    identity["mask_policy"] = mask_policy
    identity["prompts"] = {"token_ids": EOS_PROMPTS}
    identity["sampling"]["seed"] = EOS_SEED
    config = tmp_path / f"{mask_policy}.json"
    config.write_text(json.dumps(document))
    execution_plan = plan_file(str(config))
    baseline = [ec for ec in execution_plan.cases if ec.case.label == "baseline"]
    with make_runner(execution_plan, runtime="hf", artifacts=tmp_path / mask_policy) as runner:
        (result,) = runner.run(baseline)
    return result


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_fp32_cases_pass_and_bf16_cases_mismatch(hf_run: dict[str, Any]) -> None:
    results: dict[str, CaseResult] = hf_run["results"]
    outcomes = {label: r.outcome for label, r in results.items()}
    assert outcomes == {
        "baseline": Outcome.PASS,
        "rollout.dtype=bfloat16": Outcome.MISMATCH,
        "training.compute_dtype=bfloat16": Outcome.MISMATCH,
        "training.attention_backend=eager": Outcome.PASS,
        "batch.size=1": Outcome.PASS,
        "training.sharding=fsdp": Outcome.PASS,
    }
    baseline = results["baseline"].comparison.to_json()
    assert baseline["active_tokens"] > 0
    assert baseline["diagnostics"]["max_abs_diff"] < 1e-4
    bf16 = results["rollout.dtype=bfloat16"].comparison.to_json()
    assert bf16["diagnostics"]["max_abs_diff"] > 1e-2


def test_actual_values_are_read_back_from_live_models(hf_run: dict[str, Any]) -> None:
    results: dict[str, CaseResult] = hf_run["results"]
    attempt = results["rollout.dtype=bfloat16"].attempt_dir
    assert attempt is not None
    actual = json.loads((attempt / "actual.json").read_text())
    assert actual["knobs"]["rollout.dtype"]["actual"] == "bfloat16"
    assert actual["knobs"]["rollout.dtype"]["status"] == "applied"
    eager = results["training.attention_backend=eager"].attempt_dir
    assert eager is not None
    knobs = json.loads((eager / "actual.json").read_text())["knobs"]
    assert knobs["training.attention_backend"]["actual"] == "eager"


def test_fsdp_case_ran_in_two_real_ranks_that_are_gone(hf_run: dict[str, Any]) -> None:
    attempt = hf_run["results"]["training.sharding=fsdp"].attempt_dir
    assert attempt is not None
    actual = json.loads((attempt / "actual.json").read_text())
    evidence = actual["training_evidence"]
    assert evidence["world_size"] == 2
    assert evidence["backend"] == "gloo"
    assert actual["knobs"]["training.sharding"]["actual"] == "fsdp"
    pids = [int(p) for p in str(evidence["rank_pids"]).strip("[]").split(",")]
    assert len(pids) == 2 and os.getpid() not in pids
    assert not any(_alive(pid) for pid in pids)


def test_engine_constructions_equal_distinct_fingerprints(hf_run: dict[str, Any]) -> None:
    bindings = hf_run["bindings"]
    rollout = {b.rollout_construction_fingerprint for b in bindings}
    training = {b.training_construction_fingerprint for b in bindings}
    assert hf_run["counts"] == (len(rollout), len(training))


def test_plain_transformers_recomputes_sealed_training_logprobs(hf_run: dict[str, Any]) -> None:
    """Independent check: no project code between the sealed token ids and the logprobs."""
    attempt = hf_run["results"]["baseline"].attempt_dir
    assert attempt is not None
    identity = json.loads((attempt / "identity.json").read_text())
    digest = identity["training"]["checkpoint_digest"]
    model_dir = resolve_checkpoint("tiny://qwen3-h64-v1", expected_digest=digest).path
    rollout = _load(attempt, "score_rollout.pt")
    training = _load(attempt, "score_training.pt")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager", local_files_only=True
    )
    model.eval()
    ids, mask = rollout["token_ids"], rollout["attention_mask"]
    with torch.no_grad():
        logits = model(
            input_ids=ids,
            attention_mask=mask.long(),
            position_ids=rollout["position_ids"],
            use_cache=False,
        ).logits
    expected = (
        torch.log_softmax(logits[:, :-1].float(), -1)
        .gather(-1, ids[:, 1:].unsqueeze(-1))
        .squeeze(-1)
    )
    active = rollout["active_mask"][:, 1:]
    got = training["logprobs"][:, 1:]
    assert int(active.sum()) > 0
    assert float((expected[active] - got[active]).abs().max()) < 1e-5


class _MutatingScorer(HfTrainingScorer):
    fault = "mutate_buffer"

    def _forward(self, batch: Any, batch_size: int, logp: Any) -> Any:
        result = super()._forward(batch, batch_size, logp)
        if self.fault == "mutate_buffer":
            _, buffer = next(iter(self.model.named_buffers()))
            with torch.no_grad():
                buffer.mul_(1.0001)
        elif self.fault == "leave_train_mode":
            self.model.train()
        return result


class _FaultyAdapter(HfAdapter):
    def __init__(self, fault: str) -> None:
        super().__init__()
        self.fault = fault

    def build_training(self, binding: Any, identity: Any) -> HfTrainingScorer:
        scorer = _MutatingScorer(binding, self.checkpoint(identity))
        scorer.fault = self.fault
        return scorer


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ("mutate_buffer", "parameters/buffers changed"),
        ("leave_train_mode", "mode not restored"),
    ],
)
def test_scorer_that_breaks_read_only_is_invalid_identity(
    tmp_path: Path, fault: str, words: str
) -> None:
    execution_plan = plan_file(str(CONFIG))
    baseline = [ec for ec in execution_plan.cases if ec.case.label == "baseline"]
    with make_runner(
        execution_plan, runtime="hf", artifacts=tmp_path, adapter=_FaultyAdapter(fault)
    ) as runner:
        (result,) = runner.run(baseline)
    assert result.outcome is Outcome.INVALID_IDENTITY
    assert words in result.reason
    assert any(words in v for v in result.comparison.to_json()["identity_violations"])


def test_response_before_eos_keeps_final_eos_in_tokens_but_does_not_score_it(
    tmp_path: Path,
) -> None:
    through = _baseline_with_mask_policy(tmp_path, "response_through_eos")
    before = _baseline_with_mask_policy(tmp_path, "response_before_eos")
    assert through.outcome is Outcome.PASS, through.reason
    assert before.outcome is Outcome.PASS, before.reason
    assert through.attempt_dir is not None and before.attempt_dir is not None
    sealed_through = _load(through.attempt_dir, "score_rollout.pt")
    sealed_before = _load(before.attempt_dir, "score_rollout.pt")
    training_before = _load(before.attempt_dir, "score_training.pt")["logprobs"]
    token_ids = sealed_before["token_ids"]
    assert torch.equal(token_ids, sealed_through["token_ids"])  # same samples, other mask
    lengths = sealed_before["attention_mask"].sum(-1)
    last = lengths - 1
    rows = torch.arange(len(EOS_PROMPTS))
    ends_in_eos = (token_ids[rows, last] == EOS) & (last >= sealed_before["prompt_lengths"])
    assert int(ends_in_eos.sum()) >= 1, "no response ended with EOS: the test would be vacuous"
    eos_rows, eos_cols = rows[ends_in_eos], last[ends_in_eos]
    assert sealed_through["active_mask"][eos_rows, eos_cols].all()
    assert not sealed_before["active_mask"][eos_rows, eos_cols].any()
    assert sealed_before["attention_mask"][eos_rows, eos_cols].all()  # still in the sequence
    assert (training_before[eos_rows, eos_cols] == 0).all()  # and not scored
    expected = sealed_through["active_mask"].clone()
    expected[eos_rows, eos_cols] = False
    assert torch.equal(sealed_before["active_mask"], expected)  # nothing else changed
    assert before.comparison.to_json()["active_tokens"] == (
        through.comparison.to_json()["active_tokens"] - int(ends_in_eos.sum())
    )
    assert before.comparison.to_json()["diagnostics"]["max_abs_diff"] < 1e-4
