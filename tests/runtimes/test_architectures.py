"""Tiny Llama, Qwen2 and Mistral checkpoints on both runtimes, from ``prompts`` + ``init``.

Each architecture (``tiny_model.TINY_ARCHITECTURES``, built here from code) gets its chat
prompts frozen by ``logprob-drift prompts`` and a starter from ``logprob-drift init``. On
``hf``: the tiny Llama's whole ``init`` output runs (no case STRICT_REJECTED, the fp32
baseline PASS, the bf16 rollout MISMATCH); the Qwen2 and Mistral starters are cut to the
baseline and the bf16 rollout. On ``vllm-hf``: each starter cut to its baseline (one vLLM
engine per architecture). Every sealed baseline is recomputed in float64 with plain
transformers code written here: both sides' logprobs lie within the sealed contract threshold
of it; the bf16 rollout's lie beyond it.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from drift_testing import cli, run_by_label  # noqa: E402

from pytest_logprob_drift import plan_file  # noqa: E402
from pytest_logprob_drift.execute.runner import CaseResult  # noqa: E402
from pytest_logprob_drift.outcomes import Outcome  # noqa: E402
from pytest_logprob_drift.runtimes.tiny_model import (  # noqa: E402
    TINY_ARCHITECTURES,
    build_tiny_architecture,
)

pytestmark = pytest.mark.slow  # real transformers models and vLLM engines

ARCHS = [arch.name for arch in TINY_ARCHITECTURES]
CHATS = [
    {"messages": [{"role": "user", "content": "Which change makes the rollout drift?"}]},
    {
        "messages": [
            {"role": "user", "content": "Numbers 1 2 3."},
            {"role": "assistant", "content": "Seen."},
            {"role": "user", "content": "Tensor parallel or prefix caching?"},
        ]
    },
]
BF16 = "rollout.dtype=bfloat16"


@pytest.fixture(scope="module")
def starters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Per architecture: its checkpoint directory and its frozen prompt file."""
    root = tmp_path_factory.mktemp("archs")
    chats = root / "chats.jsonl"
    chats.write_text("".join(json.dumps(c) + "\n" for c in CHATS))
    built = {}
    for arch in TINY_ARCHITECTURES:
        model_dir = root / arch.name
        build_tiny_architecture(arch, model_dir)
        prompts = root / f"{arch.name}.prompts.json"
        code, _, err = cli(
            "prompts", "--checkpoint", model_dir, chats, "--messages-field", "messages",
            "--output", prompts,
        )  # fmt: skip
        assert code == 0, err
        built[arch.name] = (model_dir, prompts)
    return built


def _starter(
    root: Path, model_dir: Path, prompts: Path, runtime: str, keep: set[str] | None
) -> Path:
    """``init``'s output for the checkpoint, its interventions cut to ``keep`` (None: all)."""
    output = root / f"{model_dir.name}-{runtime}.json"
    code, _, err = cli(
        "init", "--checkpoint", model_dir, "--prompts", prompts, "--runtime", runtime,
        "--output", output, "--max-new-tokens", "8",
    )  # fmt: skip
    assert code == 0, err
    if keep is not None:
        document = json.loads(output.read_text())
        document["interventions"] = [i for i in document["interventions"] if i["path"] in keep]
        output.write_text(json.dumps(document))
    return output


@pytest.fixture(scope="module")
def hf_runs(
    starters: dict[str, tuple[Path, Path]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, CaseResult]]:
    root = tmp_path_factory.mktemp("hf")
    runs = {}
    for name, (model_dir, prompts) in starters.items():
        keep = None if name.startswith("llama") else {"rollout.dtype"}
        config = _starter(root, model_dir, prompts, "hf", keep)
        runs[name] = run_by_label(plan_file(str(config)), runtime="hf", artifacts=root / "runs")
    return runs


@pytest.fixture(scope="module")
def vllm_runs(
    starters: dict[str, tuple[Path, Path]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, CaseResult]]:
    root = tmp_path_factory.mktemp("vllm")
    runs = {}
    for name, (model_dir, prompts) in starters.items():
        config = _starter(root, model_dir, prompts, "vllm-hf", set())
        runs[name] = run_by_label(
            plan_file(str(config)), runtime="vllm-hf", artifacts=root / "runs"
        )
    return runs


def _load(attempt: Path, name: str) -> dict[str, Any]:
    return torch.load(io.BytesIO((attempt / name).read_bytes()), weights_only=True)


def _float64_logprobs(model_dir: Path, rollout: dict[str, Any]) -> Any:
    """Teacher-forced logprobs of the sealed tokens, float64 plain transformers (eager)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float64, attn_implementation="eager", local_files_only=True
    )
    model.eval()
    ids = rollout["token_ids"]
    with torch.no_grad():
        logits = model(
            input_ids=ids,
            attention_mask=rollout["attention_mask"].long(),
            position_ids=rollout["position_ids"],
            use_cache=False,
        ).logits
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def _distance_to_float64(model_dir: Path, result: CaseResult) -> tuple[float, float, float]:
    """max |rollout - float64|, max |training - float64| over active tokens, and the sealed
    threshold."""
    assert result.attempt_dir is not None and result.comparison is not None
    rollout = _load(result.attempt_dir, "score_rollout.pt")
    training = _load(result.attempt_dir, "score_training.pt")
    reference = _float64_logprobs(model_dir, rollout)
    active = rollout["active_mask"][:, 1:]
    assert int(active.sum()) > 0
    rollout_gap = (rollout["logprobs"][:, 1:].double() - reference)[active].abs().max()
    training_gap = (training["logprobs"][:, 1:].double() - reference)[active].abs().max()
    return float(rollout_gap), float(training_gap), result.comparison.threshold


def test_init_on_the_tiny_llama_runs_on_hf(hf_runs: dict[str, dict[str, CaseResult]]) -> None:
    results = hf_runs["llama-h64-v1"]
    assert len(results) > 2  # the whole starter: baseline plus every hf trial
    outcomes = {label: r.outcome for label, r in results.items()}
    assert Outcome.STRICT_REJECTED not in outcomes.values(), outcomes
    assert outcomes["baseline"] is Outcome.PASS
    assert outcomes[BF16] is Outcome.MISMATCH


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_fp32_baseline_passes_and_bf16_rollout_mismatches(
    hf_runs: dict[str, dict[str, CaseResult]], starters: dict[str, tuple[Path, Path]], arch: str
) -> None:
    results = hf_runs[arch]
    assert results["baseline"].outcome is Outcome.PASS
    assert results[BF16].outcome is Outcome.MISMATCH
    model_dir = starters[arch][0]
    rollout_gap, training_gap, threshold = _distance_to_float64(model_dir, results["baseline"])
    assert rollout_gap <= threshold and training_gap <= threshold
    bf16_gap, training_gap, threshold = _distance_to_float64(model_dir, results[BF16])
    assert bf16_gap > threshold >= training_gap


@pytest.mark.parametrize("arch", ARCHS)
def test_vllm_fp32_baseline_passes(
    vllm_runs: dict[str, dict[str, CaseResult]], starters: dict[str, tuple[Path, Path]], arch: str
) -> None:
    results = vllm_runs[arch]
    assert set(results) == {"baseline"}
    assert results["baseline"].outcome is Outcome.PASS
    rollout_gap, training_gap, threshold = _distance_to_float64(
        starters[arch][0], results["baseline"]
    )
    assert rollout_gap <= threshold and training_gap <= threshold
