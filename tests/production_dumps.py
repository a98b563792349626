"""Production-run dumps written by hand, as the frameworks write them (not as the importer
reads them), and the drift verdict recomputed from the written numbers in numpy float64.

What each writer follows, read with the search tool (the repositories' stored snapshots):

- NeMo-RL, NVIDIA-NeMo/RL at 7ea279abfbeb698b092856d0dab61e7cf39bc909:
  ``nemo_rl/algorithms/grpo.py`` (the "Log training data" block of ``grpo_train``) builds
  ``log_data`` with ``content``, ``rewards`` (``filtered_rewards`` under dynamic sampling),
  ``input_lengths``, ``token_ids`` (``train_data["input_ids"]``), ``token_loss_mask``,
  ``sample_loss_mask`` (``loss_multiplier``), ``advantages``, ``generation_logprobs`` and
  ``prev_logprobs``, each ``.tolist()`` of a ``[B, ...]`` tensor, and calls
  ``logger.log_batched_dict_as_jsonl(log_data, f"train_data_step{total_steps + 1}.jsonl")``;
  ``nemo_rl/utils/logger.py`` ``Logger.log_batched_dict_as_jsonl`` (same text at
  0275e75840b11fd622e58886ae3f462dc334c1fa) writes, for each ``sample`` of
  ``BatchedDataDict(to_log).make_microbatch_iterator(1)``, ``json.dumps({**sample, "idx": i},
  default=str)`` on its own line; ``nemo_rl/distributed/batched_data_dict.py`` ``slice`` cuts a
  list field ``[i:i+1]``, so a 2-D field is ``[[...]]`` and a 1-D one ``[x]``. ``json.dumps``
  writes NaN and infinity as the bare words ``NaN``/``Infinity``. Not confirmed here: which
  NeMo-RL release first logged ``token_ids``/``token_loss_mask``/``sample_loss_mask`` (the
  "older NeMo-RL" file below is the current row without them), and the content of
  ``content`` (only its presence matters: it is skipped).
- slime, THUDM/slime at 624b824a898ab0ec1fcb4d373004c7f3852bf515:
  ``slime/observability/train_data_utils.py`` ``_build_dump_payload`` (the dict
  ``save_debug_train_data`` hands ``torch.save``: ``format_version`` 2, ``rollout_id``,
  ``rank``, ``samples`` sorted by ``rollout_position``/``sample_index``, each with
  ``data_parallel_rank``, ``sample_index``, ``rollout_position`` and every per-sample field of
  the shard, and ``dp_shards``), its test ``tests/test_train_data_utils.py`` (loads it with
  ``weights_only=True``), ``slime/observability/rollout_data_utils.py`` (``tokens`` long,
  ``loss_masks`` int, ``rollout_log_probs`` float32), ``slime/utils/arguments.py``
  (``--dump-details DIR`` -> ``DIR/train_data/{rollout_id}.pt``) and
  ``slime/backends/megatron_utils/loss.py`` ``get_log_probs_and_entropy`` ("per-token
  log-probabilities ... on responses": ``log_probs`` has ``response_lengths`` values, the
  logprobs of ``tokens[total_lengths - response_lengths:]``). Not confirmed: the dtype of
  ``log_probs`` on every backend (float32 written here).
- the neutral format: ``docs/PRODUCTION_RUNS.md`` of this project.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

THRESHOLD = 1e-3
"""ws1's current threshold (nats), written here independently of the package."""


@dataclass
class Sample:
    """One sample as a test plans it: the full token sequence, where its response starts,
    both sides' logprobs of the response tokens (float32 values, as engines log them), the
    response-aligned loss mask, and whether the sample counts (NeMo-RL's sample mask)."""

    tokens: list[int]
    prompt: int
    rollout: list[float]
    training: list[float]
    mask: list[int]
    counts: bool = True
    sample_id: int = 0


@dataclass
class Expected:
    """A step's verdict, recomputed in numpy float64 from the written numbers."""

    outcome: str
    active: int
    mismatches: int
    ess: float | None
    extra: dict[str, Any] = field(default_factory=dict)


def make_samples(
    rng: np.random.Generator,
    count: int,
    *,
    drift: float = 1e-5,
    planted: Sequence[tuple[int, int, float]] = (),
    lengths: tuple[int, int] = (6, 14),
    prompt: int = 4,
) -> list[Sample]:
    """``count`` samples with |training - rollout| about ``drift`` and ``planted`` extra
    differences ``(sample, response position, delta)``."""
    samples = []
    for i in range(count):
        response = int(rng.integers(lengths[0], lengths[1]))
        tokens = rng.integers(1, 30000, size=prompt + response).tolist()
        rollout = (-rng.exponential(1.0, size=response)).astype(np.float32)
        training = (rollout + rng.uniform(-drift, drift, size=response)).astype(np.float32)
        for s, pos, delta in planted:
            if s == i and pos < response:
                training[pos] = np.float32(rollout[pos] + delta)
        mask = [1] * response
        mask[-1] = 0  # an end-of-turn token the loss leaves out
        samples.append(
            Sample(
                tokens=tokens,
                prompt=prompt,
                rollout=rollout.tolist(),
                training=training.tolist(),
                mask=mask,
                sample_id=i,
            )
        )
    return samples


def expected(samples: Sequence[Sample]) -> Expected:
    """The contract's verdict and the normalized ESS, in numpy float64, from the samples."""
    train, roll = [], []
    for s in samples:
        if not s.counts:
            continue
        for t, r, m in zip(s.training, s.rollout, s.mask, strict=True):
            if m == 1:
                train.append(t)
                roll.append(r)
    training = np.asarray(train, dtype=np.float64)
    rollout = np.asarray(roll, dtype=np.float64)
    if training.size == 0:
        return Expected(outcome="ZERO_ACTIVE_TOKENS", active=0, mismatches=0, ess=None)
    finite = np.isfinite(training) & np.isfinite(rollout)
    if not finite.all():
        return Expected(
            outcome="INVALID_ARTIFACT",
            active=int(training.size),
            mismatches=0,
            ess=None,
            extra={"nonfinite_tokens": int((~finite).sum())},
        )
    diff = np.abs(training - rollout)
    mismatches = int((diff > THRESHOLD).sum())
    weights = np.exp(training - rollout)
    ess = float(weights.mean() ** 2 / (weights**2).mean())  # 1 / mean((w / mean w)^2)
    return Expected(
        outcome="MISMATCH" if mismatches else "PASS",
        active=int(training.size),
        mismatches=mismatches,
        ess=ess,
        extra={"max_abs_diff": float(diff.max())},
    )


# --------------------------------------------------------------------------- NeMo-RL


def nemo_rl_log_data(samples: Sequence[Sample]) -> dict[str, Any]:
    """GRPO's ``log_data`` for one step: batched lists, full sequences padded to the batch's
    longest (pad id 0, logprob 0.0, mask 0), position 0's logprob 0.0."""
    width = max(len(s.tokens) for s in samples)
    log_data: dict[str, Any] = {
        "content": [],
        "rewards": [],
        "input_lengths": [],
        "token_ids": [],
        "token_loss_mask": [],
        "sample_loss_mask": [],
        "advantages": [],
        "generation_logprobs": [],
        "prev_logprobs": [],
    }
    for s in samples:
        n = len(s.tokens)
        pad = width - n
        log_data["content"].append([{"role": "user", "content": "q"}, {"role": "assistant"}])
        log_data["rewards"].append(1.0)
        log_data["input_lengths"].append(n)
        log_data["token_ids"].append(s.tokens + [0] * pad)
        log_data["token_loss_mask"].append([0] * s.prompt + s.mask + [0] * pad)
        log_data["sample_loss_mask"].append(1.0 if s.counts else 0.0)
        log_data["advantages"].append([0.5] * width)
        # the logprob at t is that of token_ids[t]; position 0 is 0 by convention
        log_data["generation_logprobs"].append([0.0] * s.prompt + s.rollout + [0.0] * pad)
        log_data["prev_logprobs"].append([0.0] * s.prompt + s.training + [0.0] * pad)
    return log_data


def log_batched_dict_as_jsonl(to_log: dict[str, Any], path: Path) -> None:
    """NeMo-RL's ``Logger.log_batched_dict_as_jsonl``: one line per microbatch of one,
    every field sliced ``[i:i+1]``, plus the logger's ``idx``."""
    size = len(next(iter(to_log.values())))
    with open(path, "w") as f:
        for i in range(size):
            sample = {key: value[i : i + 1] for key, value in to_log.items()}
            f.write(json.dumps({**sample, "idx": i}, default=str) + "\n")


def write_nemo_rl_step(directory: Path, step: int, samples: Sequence[Sample]) -> Path:
    path = directory / f"train_data_step{step}.jsonl"
    log_batched_dict_as_jsonl(nemo_rl_log_data(samples), path)
    return path


# --------------------------------------------------------------------------- slime


def slime_payload(rollout_id: int, samples: Sequence[Sample], dp_size: int = 2) -> dict[str, Any]:
    """``_build_dump_payload`` of ``dp_size`` DP shards (round-robin), samples sorted back into
    rollout order."""
    shards: list[dict[str, Any]] = []
    flat: list[dict[str, Any]] = []
    for rank in range(dp_size):
        mine = [(i, s) for i, s in enumerate(samples) if i % dp_size == rank]
        shards.append(
            {
                "rank": rank,
                "data_parallel_rank": rank,
                "sample_indices": [s.sample_id for _, s in mine],
                "partition": [i for i, _ in mine],
                "micro_batch_indices": [[[j for j in range(len(mine))]]],
                "num_microbatches": [1],
                "global_batch_sizes": [len(samples)],
            }
        )
        for i, s in mine:
            response = len(s.tokens) - s.prompt
            flat.append(
                {
                    "data_parallel_rank": rank,
                    "sample_index": s.sample_id,
                    "rollout_position": i,
                    "tokens": torch.tensor(s.tokens, dtype=torch.long),
                    "response_lengths": response,
                    "total_lengths": len(s.tokens),
                    "rewards": 1.0,
                    "truncated": 0,
                    "loss_masks": torch.tensor(s.mask, dtype=torch.int),
                    "rollout_log_probs": torch.tensor(s.rollout, dtype=torch.float32),
                    "log_probs": torch.tensor(s.training, dtype=torch.float32),
                    "advantages": torch.full((response,), 0.5),
                }
            )
    flat.sort(key=lambda sample: sample["rollout_position"])
    return {
        "format_version": 2,
        "rollout_id": rollout_id,
        "rank": 0,
        "samples": flat,
        "dp_shards": shards,
    }


def write_slime_dump(directory: Path, rollout_id: int, samples: Sequence[Sample]) -> Path:
    """``--dump-details DIR``'s ``DIR/train_data/{rollout_id}.pt``."""
    path = directory / "train_data" / f"{rollout_id}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(slime_payload(rollout_id, samples), path)
    return path


# --------------------------------------------------------------------------- neutral


def neutral_rows(step: int, samples: Sequence[Sample]) -> list[dict[str, Any]]:
    return [
        {
            "step": step,
            "sample": s.sample_id,
            "token_ids": s.tokens,
            "prompt_length": s.prompt,
            "rollout_logprobs": s.rollout,
            "training_logprobs": s.training,
            "mask": s.mask if s.counts else [0] * len(s.mask),
        }
        for s in samples
    ]


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
