"""A synthetic sealed run for benchmarks: many cases, many active tokens, through the real store.

Writes ``RUN_ROOT/<experiment>/`` exactly as the runner would (every attempt file, a real seal,
an execution key that re-derives from identity.json, a comparison whose numerical verdict
``verify`` recomputes identically), with scores drawn from a fixed seed: a baseline with
bf16-like drift, cases that move the rollout side, the training side, both, or change the
sampled tokens from some position, and cases with no effect. No engine runs.

    python benchmarks/synthetic_run.py DIR [--cases 256] [--samples 64] [--response 1600]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from bench_report import write_case

from pytest_logprob_drift.records import canonical_json, sha256_hex
from pytest_logprob_drift.store.run import ArtifactStore

EXPERIMENT = "synthetic-attribution"
PROMPT = 16
KINDS = ("none", "rollout", "training", "both", "tokens")


def _scores(samples: int, response: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    length = PROMPT + response
    token_ids = torch.randint(2, 1024, (samples, length), generator=generator)
    attention = torch.ones((samples, length), dtype=torch.bool)
    active = torch.zeros((samples, length), dtype=torch.bool)
    active[:, PROMPT:] = True
    logprobs = torch.zeros((samples, length), dtype=torch.float32)
    logprobs[:, PROMPT:] = -torch.rand((samples, response), generator=generator) * 5
    return {
        "token_ids": token_ids,
        "attention_mask": attention,
        "active_mask": active,
        "logprobs": logprobs,
        "prompt_lengths": torch.full((samples,), PROMPT, dtype=torch.long),
        "position_ids": torch.arange(length).expand(samples, length).clone(),
    }


def _write_attempt(
    store: ArtifactStore,
    case_id: str,
    label: str,
    rollout: dict[str, torch.Tensor],
    training: torch.Tensor,
) -> None:
    """One attempt with every file the runner writes (the report benchmark's writer)."""
    changed = [] if label == "baseline" else [label.split("=", 1)[0]]
    write_case(store, case_id, label, {}, changed, rollout, training)


def build(root: Path, *, cases: int, samples: int, response: int) -> Path:
    """Write the run; return its directory. Case 0 is the baseline."""
    generator = torch.Generator().manual_seed(20261129)
    store = ArtifactStore(root, EXPERIMENT)
    store.initialize({"experiment_id": EXPERIMENT}, [])
    base = _scores(samples, response, generator)
    base_training = (
        base["logprobs"] + torch.randn(base["logprobs"].shape, generator=generator) * 2e-3
    )
    base_training = base_training * base["active_mask"]
    for index in range(cases):
        label = "baseline" if index == 0 else f"knob{index}={KINDS[index % len(KINDS)]}"
        case_id = sha256_hex(canonical_json({"synthetic": index}))[:16]
        kind = "baseline" if index == 0 else KINDS[index % len(KINDS)]
        rollout = {k: v.clone() for k, v in base.items()}
        training = base_training.clone()
        noise = torch.randn(training.shape, generator=generator) * 1e-2
        if kind in ("rollout", "both"):
            rollout["logprobs"] = (rollout["logprobs"] + noise) * rollout["active_mask"]
        if kind in ("training", "both"):
            training = (training + noise) * rollout["active_mask"]
        if kind == "tokens":
            start = PROMPT + response // 2
            rollout["token_ids"][:, start:] = torch.randint(
                2, 1024, rollout["token_ids"][:, start:].shape, generator=generator
            )
            rollout["logprobs"][:, start:] += noise[:, start:]
        _write_attempt(store, case_id, label, rollout, training)
    return store.directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--cases", type=int, default=256)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--response", type=int, default=1600)
    args = parser.parse_args()
    print(build(args.root, cases=args.cases, samples=args.samples, response=args.response))


if __name__ == "__main__":
    main()
