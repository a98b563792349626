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
- slime's released per-rank layout, THUDM/slime at tag v0.3.1 (commit in the fetched mirror;
  the same writer text in radixark/miles ``miles/utils/train_dump_utils.py`` at 263d04d):
  ``slime/utils/train_dump_utils.py`` ``save_debug_train_data`` (``torch.save({"rollout_id",
  "rank", "rollout_data"})`` to ``args.save_debug_train_data.format(rollout_id, rank)``, which
  ``--dump-details DIR`` sets to ``DIR/train_data/{rollout_id}_{rank}.pt``,
  ``slime/utils/arguments.py``), called by ``MegatronTrainRayActor.train_actor`` on every rank
  (``slime/backends/megatron_utils/actor.py``) after training, with ``rollout_data`` as
  ``_get_rollout_data`` left it: ``RolloutManager._convert_samples_to_train_data`` and
  ``_split_train_data_by_dp`` (``slime/ray/rollout.py``: per-sample lists ``tokens``,
  ``response_lengths``, ``rewards``, ``truncated``, ``loss_masks``, ``sample_indices``,
  ``rollout_ids``, ``rollout_mask_sums``, ``rollout_log_probs`` taken at the rank's
  ``partition``; ``raw_reward`` and ``total_lengths`` whole; ``global_batch_sizes``,
  ``num_microbatches``, ``micro_batch_indices``; ``_tensorize_rollout_data_for_training``:
  ``tokens`` long, ``loss_masks`` int, ``rollout_log_probs`` float32, ``rollout_mask_sums`` one
  float32 tensor), ``process_rollout_data`` (``slime/utils/data.py``: pops ``partition``,
  ``total_lengths`` taken at it) and ``compute_log_prob`` (``log_probs``: one float32 tensor of
  ``response_lengths`` values per sample, stored on the last pipeline stage only, and only when
  the trainer recomputes them: ``--get-mismatch-metrics`` among others; by default it reuses
  the training pass and ``rollout_data`` has no ``log_probs``). Not copied: the DP schedule
  (``build_dp_schedule`` packs by length; a longest-first greedy split stands in, the layout is
  the same) and fields the import never reads (``advantages``, ``returns``...).
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
    rollout_id: int | None = None
    """slime's ``Sample.rollout_id`` (several samples of one multi-turn rollout); None: the
    sample is its own rollout."""


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


def compute_and_apply_seq_logprob_error_masking(
    train_data: dict[str, torch.Tensor], seq_logprob_error_threshold: float | None
) -> int:
    """NeMo-RL's ``compute_and_apply_seq_logprob_error_masking`` (``nemo_rl/algorithms/
    grpo.py``, v0.6.0 l.1218, main 7ea279a l.2513; the rewards statistics left out): the
    per-sequence mult-prob error over ``token_mask * sample_mask`` from column 1, and
    ``train_data["sample_mask"]`` overwritten with 0 where it exceeds the threshold. Returns
    how many sequences it masked."""
    token_mask = train_data["token_mask"][:, 1:]
    sample_mask = train_data["sample_mask"]
    prev_logprobs = train_data["prev_logprobs"][:, 1:]
    generation_logprobs = train_data["generation_logprobs"][:, 1:]
    lp_error = torch.abs(generation_logprobs - prev_logprobs)
    mask = token_mask * sample_mask.unsqueeze(-1)
    seq_mult_prob_error = (torch.exp(lp_error * mask) * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(
        min=1
    )
    if seq_logprob_error_threshold is None:
        return 0
    original_sample_mask = sample_mask.clone()
    seq_error_mask = (
        seq_mult_prob_error <= seq_logprob_error_threshold
    ).float() * original_sample_mask
    train_data["sample_mask"] = seq_error_mask
    return int((original_sample_mask - seq_error_mask).sum().item())


def write_nemo_rl_step_with_seq_threshold(
    directory: Path, step: int, samples: Sequence[Sample], threshold: float
) -> tuple[Path, list[bool]]:
    """A GRPO step with ``grpo.seq_logprob_error_threshold`` set: ``train_data``'s padded
    float32 tensors, masked by NeMo-RL's function (``grpo.py`` main l.3275) before the step is
    logged with the overwritten ``sample_mask`` (l.3644). Returns the file and each sample's
    logged sample mask."""
    log_data = nemo_rl_log_data(samples)
    train_data = {
        "token_mask": torch.tensor(log_data["token_loss_mask"], dtype=torch.float32),
        "sample_mask": torch.tensor(log_data["sample_loss_mask"], dtype=torch.float32),
        "prev_logprobs": torch.tensor(log_data["prev_logprobs"], dtype=torch.float32),
        "generation_logprobs": torch.tensor(log_data["generation_logprobs"], dtype=torch.float32),
    }
    compute_and_apply_seq_logprob_error_masking(train_data, threshold)
    log_data["sample_loss_mask"] = train_data["sample_mask"].tolist()
    path = directory / f"train_data_step{step}.jsonl"
    log_batched_dict_as_jsonl(log_data, path)
    return path, [bool(m) for m in log_data["sample_loss_mask"]]


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


def slime_train_data(samples: Sequence[Sample]) -> dict[str, Any]:
    """``_convert_samples_to_train_data`` (v0.3.1): per-sample lists, ``rollout_ids`` (a
    sample's own id when it has none, numbered past the ids in use) and ``rollout_mask_sums``
    (each sample's rollout's loss-mask total)."""
    rollout_ids = [s.rollout_id for s in samples]
    used = {r for r in rollout_ids if r is not None}
    tmp = 0
    for i, rid in enumerate(rollout_ids):
        if rid is None:
            while tmp in used:
                tmp += 1
            rollout_ids[i] = tmp
            used.add(tmp)
    loss_masks = [list(s.mask) for s in samples]
    totals: dict[int, int] = {}
    for rid, mask in zip(rollout_ids, loss_masks, strict=True):
        assert rid is not None
        totals[rid] = totals.get(rid, 0) + sum(mask)
    return {
        "tokens": [list(s.tokens) for s in samples],
        "response_lengths": [len(s.tokens) - s.prompt for s in samples],
        "rewards": [1.0] * len(samples),
        "raw_reward": [1.0] * len(samples),
        "truncated": [0] * len(samples),
        "sample_indices": [s.sample_id for s in samples],
        "rollout_ids": rollout_ids,
        "loss_masks": loss_masks,
        "rollout_mask_sums": [totals[rid] for rid in rollout_ids if rid is not None],
        "rollout_log_probs": [list(s.rollout) for s in samples],
    }


def slime_rank_rollout_data(
    samples: Sequence[Sample], dp_size: int, *, log_probs: bool
) -> list[dict[str, Any]]:
    """Each data-parallel rank's ``rollout_data`` as ``save_debug_train_data`` gets it:
    ``_split_train_data_by_dp`` (longest-first greedy partition standing in for the schedule),
    ``process_rollout_data`` and, with ``log_probs``, ``compute_log_prob``'s result."""
    data = slime_train_data(samples)
    total_lengths = [len(t) for t in data["tokens"]]
    data["total_lengths"] = total_lengths
    partitions: list[list[int]] = [[] for _ in range(dp_size)]
    loads = [0] * dp_size
    for j in sorted(range(len(samples)), key=lambda j: (-total_lengths[j], j)):
        r = loads.index(min(loads))
        partitions[r].append(j)
        loads[r] += total_lengths[j]
    rollouts = len(set(data["rollout_ids"]))
    ranks = []
    for r in range(dp_size):
        partition = partitions[r]
        rollout_data: dict[str, Any] = {"partition": partition}
        for key in (
            "tokens", "response_lengths", "rewards", "truncated", "loss_masks",
            "sample_indices", "rollout_ids", "rollout_mask_sums", "rollout_log_probs",
        ):  # fmt: skip
            rollout_data[key] = [data[key][j] for j in partition]
        for key in ("raw_reward", "total_lengths"):
            rollout_data[key] = data[key]
        rollout_data["global_batch_sizes"] = [rollouts]
        rollout_data["num_microbatches"] = [1]
        rollout_data["micro_batch_indices"] = [list(range(len(partition)))]
        # _tensorize_rollout_data_for_training
        rollout_data["tokens"] = [torch.tensor(t, dtype=torch.long) for t in rollout_data["tokens"]]
        rollout_data["loss_masks"] = [
            torch.tensor(m, dtype=torch.int) for m in rollout_data["loss_masks"]
        ]
        rollout_data["rollout_log_probs"] = [
            torch.tensor(lp, dtype=torch.float32) for lp in rollout_data["rollout_log_probs"]
        ]
        rollout_data["rollout_mask_sums"] = torch.tensor(
            rollout_data["rollout_mask_sums"], dtype=torch.float32
        )
        # process_rollout_data
        popped = rollout_data.pop("partition")
        rollout_data["total_lengths"] = [total_lengths[i] for i in popped]
        if log_probs:  # compute_log_prob, stored under store_prefix ""
            rollout_data["log_probs"] = [
                torch.tensor(samples[j].training, dtype=torch.float32) for j in popped
            ]
        ranks.append(rollout_data)
    return ranks


def save_debug_train_data(
    path_template: str, *, rollout_id: int, rank: int, rollout_data: Any
) -> Path:
    """slime v0.3.1 ``save_debug_train_data`` with the rank passed in (no process group)."""
    path = Path(path_template.format(rollout_id=rollout_id, rank=rank))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"rollout_id": rollout_id, "rank": rank, "rollout_data": rollout_data}, path)
    return path


def write_slime_rank_dumps(
    directory: Path,
    rollout_id: int,
    samples: Sequence[Sample],
    *,
    dp_size: int = 2,
    tp_size: int = 1,
    pp_size: int = 1,
    log_probs: bool = True,
) -> list[Path]:
    """``--dump-details DIR``: every rank's ``DIR/train_data/{rollout_id}_{rank}.pt``; the
    tensor-parallel ranks of a data-parallel rank write its data again, the pipeline stages
    before the last one without ``log_probs`` (Megatron's rank order: tensor, data, pipeline)."""
    template = f"{directory}/train_data/{{rollout_id}}_{{rank}}.pt"
    shards = slime_rank_rollout_data(samples, dp_size, log_probs=log_probs)
    paths = []
    for pp in range(pp_size):
        for dp, shard in enumerate(shards):
            for tp in range(tp_size):
                rank = (pp * dp_size + dp) * tp_size + tp
                data = dict(shard)
                if pp < pp_size - 1:
                    data.pop("log_probs", None)
                paths.append(
                    save_debug_train_data(
                        template, rollout_id=rollout_id, rank=rank, rollout_data=data
                    )
                )
    return paths


def slime_figures_numpy(samples: Sequence[Sample]) -> dict[str, float]:
    """slime's ``train_rollout_logprob_abs_diff`` of a one-step rollout in numpy float64,
    following ``policy_loss_function`` / ``get_sum_of_sample_mean`` /
    ``reduce_train_step_metrics``: default (per-rollout means over ``step_global_batch_size``
    rollouts) and ``--calculate-per-token-loss`` (over the summed clamped mask totals)."""
    data = slime_train_data(samples)
    rollouts = len(set(data["rollout_ids"]))
    per_sample, token_sum, tokens = 0.0, 0.0, 0.0
    for s, denom in zip(samples, data["rollout_mask_sums"], strict=True):
        diff = np.abs(
            np.asarray(s.training, dtype=np.float32).astype(np.float64)
            - np.asarray(s.rollout, dtype=np.float32).astype(np.float64)
        )
        masked = (diff * np.asarray(s.mask, dtype=np.float64)).sum()
        per_sample += masked / max(denom, 1)
        token_sum += masked
        tokens += max(sum(s.mask), 1)
    return {
        "slime_train_rollout_logprob_abs_diff": per_sample / rollouts,
        "slime_train_rollout_logprob_abs_diff_per_token_loss": token_sum / tokens,
    }


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
