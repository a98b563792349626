"""Regenerate the example production-run dumps under ``experiments/production/``.

The dumps are made by the tool itself from a real run: ``logprob-drift run`` on the ``hf``
runtime (transformers KV-cache generation vs transformers teacher-forced scoring) with the
embedded tiny Qwen3 (``tiny://qwen3-h64-v1``), 24 prompts, two cases: the baseline (float32 on
both sides: every token within the contract) and ``rollout.dtype=bfloat16`` (the rollout side
in bfloat16: MISMATCH). Its sealed tensors (read back through the store's digest-checked
loaders after ``verify`` passed) are regrouped into six "training steps" of four samples,
step ``s`` taking prompts ``4(s-1)`` to ``4s-1``, the first ``BF16_SAMPLES[s-1]`` of them from
the bfloat16 case and the others from the baseline, so drift rises over the steps as a run
whose rollout engine slowly moves to bfloat16 would. Each step is written in the three
formats ``logprob-drift import`` reads, laid out as each framework writes them:

- ``nemo-rl/train_data_step<N>.jsonl`` (NeMo-RL GRPO's dump: one line per sample, 2-D fields
  ``[[...]]``, 1-D fields ``[x]``, full sequences padded to the step's longest, the logprob at
  ``t`` that of ``token_ids[t]``, position 0 is 0, plus the logger's ``idx``);
- ``slime/train_data/<N>.pt`` (slime's ``--dump-details`` train dump, ``format_version`` 2,
  loadable with ``torch.load(weights_only=True)``);
- ``jsonl/drift.jsonl`` (the neutral format, every step in one file).

Deterministic: the same installed torch/transformers give byte-identical files (the tiny
checkpoint is built deterministically; sampling is seeded). Run from the repository root:

    python scripts/make_example_dumps.py [--out experiments/production]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = 24
SAMPLES_PER_STEP = 4
BF16_SAMPLES = (0, 0, 1, 2, 3, 4)
"""How many of each step's four samples come from the bfloat16-rollout case."""
MAX_NEW_TOKENS = 12
SEED = 20261211


def prompts() -> list[list[int]]:
    """24 prompts of 3 to 8 token ids of the tiny vocabulary (fixed, from a seeded RNG)."""
    rng = torch.Generator().manual_seed(SEED)
    rows = []
    for _ in range(PROMPTS):
        length = int(torch.randint(3, 9, (1,), generator=rng))
        rows.append(torch.randint(10, 1000, (length,), generator=rng).tolist())
    return rows


def config() -> dict[str, Any]:
    return {
        "schema_version": "cross_config.experiment_config.v1",
        "experiment_id": "example-production-source",
        "scenario_id": "example-production-source-tiny-qwen3-cpu",
        "description": "The run the example production dumps are made from: the tiny Qwen3 "
        "in float32 on both sides, and with the rollout side in bfloat16.",
        "contract_source": "ws1",
        "contract_version": "current",
        "strategy": "one_at_a_time",
        "strict_fallback": True,
        "identity": {
            "checkpoint": {"uri": "tiny://qwen3-h64-v1", "model_version": "tiny-qwen3-h64-v1"},
            "tokenizer": {"id": "tiny-qwen3-h64-v1", "add_special_tokens": False},
            "prompts": {"token_ids": prompts()},
            "sampling": {"seed": SEED, "max_new_tokens": MAX_NEW_TOKENS, "temperature": 1.0},
            "mask_policy": "response_through_eos",
            "training_kv_cache": False,
            "packing": "padded",
            "positions": "from_attention_mask",
        },
        "baseline": {
            "batch": {"size": 8},
            "rollout": {"dtype": "float32"},
            "training": {
                "compute_dtype": "float32",
                "attention_backend": "sdpa",
                "sharding": "none",
            },
            "logp": {"backend": "native"},
        },
        "interventions": [{"path": "rollout.dtype", "values": ["bfloat16"]}],
        "scenario": {"level": "S0", "device": "cpu"},
    }


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_logprob_drift", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def _samples(attempt: Path) -> list[dict[str, Any]]:
    """Each sample of a sealed attempt: prompt, response, response-aligned mask and both
    sides' logprobs, read through the store's digest-checked loaders."""
    from pytest_logprob_drift.check.resume import load_sealed_tensors
    from pytest_logprob_drift.store import layout
    from pytest_logprob_drift.store.attempt import read_seal

    seal = read_seal(attempt)
    batch = load_sealed_tensors(attempt, layout.SCORE_ROLLOUT, seal)
    diffs = load_sealed_tensors(attempt, layout.TOKEN_DIFFS, seal)
    out = []
    for i in range(int(batch["token_ids"].shape[0])):
        length = int(batch["attention_mask"][i].sum())
        start = int(batch["prompt_lengths"][i])
        ids = batch["token_ids"][i, :length].tolist()
        response = slice(start, length)
        out.append(
            {
                "prompt": ids[:start],
                "response": ids[start:],
                "mask": [int(v) for v in diffs["active_mask"][i, response].tolist()],
                "rollout": diffs["rollout_logprobs"][i, response].to(torch.float32).tolist(),
                "training": diffs["training_logprobs"][i, response].to(torch.float32).tolist(),
            }
        )
    return out


def _run(work: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The baseline's and the bfloat16 case's samples, in prompt order."""
    path = work / "example-production-source.json"
    path.write_text(json.dumps(config(), indent=2) + "\n")
    artifacts = work / "runs"
    done = _cli("run", str(path), "--runtime", "hf", "--artifacts", str(artifacts), "--json")
    if done.returncode not in (0, 1):
        raise SystemExit(f"the hf run failed (exit {done.returncode}):\n{done.stderr}")
    table = json.loads(done.stdout)
    run_dir = artifacts / "example-production-source"
    verified = _cli("verify", str(run_dir))
    if verified.returncode != 0:
        raise SystemExit(f"verify failed:\n{verified.stdout}{verified.stderr}")
    by_label = {r["label"]: Path(r["attempt_dir"]) for r in table["results"]}
    return _samples(by_label["baseline"]), _samples(by_label["rollout.dtype=bfloat16"])


def steps(
    baseline: list[dict[str, Any]], bf16: list[dict[str, Any]]
) -> list[tuple[int, list[dict[str, Any]]]]:
    grouped = []
    for s, mixed in enumerate(BF16_SAMPLES, start=1):
        first = (s - 1) * SAMPLES_PER_STEP
        rows = [
            {**(bf16 if j < mixed else baseline)[first + j], "sample_id": first + j}
            for j in range(SAMPLES_PER_STEP)
        ]
        grouped.append((s, rows))
    return grouped


def write_nemo_rl(directory: Path, step: int, samples: list[dict[str, Any]]) -> None:
    """GRPO's ``log_data`` for one step through ``Logger.log_batched_dict_as_jsonl``."""
    width = max(len(s["prompt"]) + len(s["response"]) for s in samples)
    with open(directory / f"train_data_step{step}.jsonl", "w") as f:
        for idx, s in enumerate(samples):
            tokens = s["prompt"] + s["response"]
            n, p, pad = len(tokens), len(s["prompt"]), width - len(tokens)
            row = {
                "rewards": [1.0 if idx % 2 == 0 else 0.0],
                "input_lengths": [n],
                "token_ids": [tokens + [0] * pad],
                "token_loss_mask": [[0] * p + s["mask"] + [0] * pad],
                "sample_loss_mask": [1.0],
                "advantages": [[0.0] * width],
                "generation_logprobs": [[0.0] * p + s["rollout"] + [0.0] * pad],
                "prev_logprobs": [[0.0] * p + s["training"] + [0.0] * pad],
                "idx": idx,
            }
            f.write(json.dumps(row) + "\n")


def write_slime(directory: Path, step: int, samples: list[dict[str, Any]]) -> None:
    """``--dump-details DIR``'s ``DIR/train_data/<rollout_id>.pt`` (one DP rank)."""
    flat = []
    for position, s in enumerate(samples):
        tokens = s["prompt"] + s["response"]
        flat.append(
            {
                "data_parallel_rank": 0,
                "sample_index": s["sample_id"],
                "rollout_position": position,
                "tokens": torch.tensor(tokens, dtype=torch.long),
                "response_lengths": len(s["response"]),
                "total_lengths": len(tokens),
                "rewards": 1.0,
                "truncated": 0,
                "loss_masks": torch.tensor(s["mask"], dtype=torch.int),
                "rollout_log_probs": torch.tensor(s["rollout"], dtype=torch.float32),
                "log_probs": torch.tensor(s["training"], dtype=torch.float32),
            }
        )
    payload = {
        "format_version": 2,
        "rollout_id": step,
        "rank": 0,
        "samples": flat,
        "dp_shards": [
            {
                "rank": 0,
                "data_parallel_rank": 0,
                "sample_indices": [s["sample_id"] for s in samples],
                "partition": list(range(len(samples))),
                "micro_batch_indices": [[list(range(len(samples)))]],
                "num_microbatches": [1],
                "global_batch_sizes": [len(samples)],
            }
        ],
    }
    torch.save(payload, directory / f"{step}.pt")


def neutral_lines(step: int, samples: list[dict[str, Any]]) -> list[str]:
    return [
        json.dumps(
            {
                "step": step,
                "sample": s["sample_id"],
                "token_ids": s["prompt"] + s["response"],
                "prompt_length": len(s["prompt"]),
                "rollout_logprobs": s["rollout"],
                "training_logprobs": s["training"],
                "mask": s["mask"],
            }
        )
        for s in samples
    ]


def write_all(out: Path, grouped: list[tuple[int, list[dict[str, Any]]]]) -> None:
    for name in ("nemo-rl", "slime", "jsonl"):
        shutil.rmtree(out / name, ignore_errors=True)
    (out / "nemo-rl").mkdir(parents=True)
    (out / "slime" / "train_data").mkdir(parents=True)
    (out / "jsonl").mkdir(parents=True)
    lines = []
    for step, samples in grouped:
        write_nemo_rl(out / "nemo-rl", step, samples)
        write_slime(out / "slime" / "train_data", step, samples)
        lines += neutral_lines(step, samples)
    (out / "jsonl" / "drift.jsonl").write_text("".join(line + "\n" for line in lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "experiments" / "production"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="example-dumps-") as work:
        baseline, bf16 = _run(Path(work))
    write_all(Path(args.out), steps(baseline, bf16))
    print(f"wrote the example dumps under {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
