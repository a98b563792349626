"""Benchmark: a catalog ``selected_logprob`` backend injected into vLLM's V1 sampler
(``logp.backend`` on the vLLM rollout side) against vLLM's own (``native``), per sampled batch.

What is timed is one call of ``vllm.v1.sample.sampler.Sampler`` on ``[rows, vocab]`` logits,
as the model runner makes it for one decode step of the rollout: temperature 1.0, a seeded
generator per request, ``logprobs=0`` (the sampled token's logprob and rank), ``raw_logprobs``
or ``processed_logprobs``. ``native`` is a plain ``Sampler``; each backend is a ``Sampler``
with ``runtimes.vllm.rollout_logp.install_on_sampler`` applied, exactly what a worker runs.
Every method gets its own copy of the same logits per call (vLLM may write into them), made
outside the timed region; the methods are interleaved call by call, and the best of
``--repeats`` calls is reported (the machine is shared: the minimum is the least disturbed
call), with the median beside it. The sampled tokens of every method are checked equal to
native's on every call.

Goal: an injected backend takes at most ``GOAL`` (1.2) times native's time per sampled batch.
Exits 1 when a backend misses it (``--no-goal``: report only).

Usage:
    python benchmarks/bench_rollout_backend.py                       # both shapes, fp32+bf16
    python benchmarks/bench_rollout_backend.py --shapes 256x151936 --dtypes float32
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

GOAL = 1.2
BACKENDS = {
    "rlkernel.reference_logp": "logprob_drift_operators.selected_logprob.reference:"
    "reference_selected_logprob",
    "rlkernel.chunked_logp": "logprob_drift_operators.selected_logprob.chunked:"
    "chunked_selected_logprob",
}
SHAPES = ("4x1024", "256x151936")
"""The tiny model's vocabulary (the S1 experiment's batch of 4 prompts) and a real one
(Qwen's 151,936) at 256 rows."""


def metadata(rows: int, *, seed: int, temperature: float = 1.0) -> Any:
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    return SamplingMetadata(
        temperature=torch.full((rows,), temperature),
        all_greedy=False,
        all_random=True,
        top_p=None,
        top_k=None,
        generators={i: torch.Generator().manual_seed(seed + i) for i in range(rows)},
        max_num_logprobs=0,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(rows),
        presence_penalties=torch.zeros(rows),
        repetition_penalties=torch.ones(rows),
        output_token_ids=[[] for _ in range(rows)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def samplers(mode: str, backends: list[str]) -> dict[str, Any]:
    from vllm.v1.sample.sampler import Sampler

    from pytest_logprob_drift.runtimes.vllm import rollout_logp

    built = {"native": Sampler(logprobs_mode=mode)}  # type: ignore[arg-type]
    for backend in backends:
        sampler = Sampler(logprobs_mode=mode)  # type: ignore[arg-type]
        spec = {"backend": backend, "factory": BACKENDS[backend], "target": "rollout"}
        rollout_logp.install_on_sampler(sampler, spec, rollout_logp.build_kernel(spec))
        built[backend] = sampler
    return built


def measure(
    rows: int, vocab: int, dtype: str, mode: str, backends: list[str], repeats: int
) -> dict[str, dict[str, float]]:
    import torch

    logits = (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(7)) * 3).to(
        getattr(torch, dtype)
    )
    built = samplers(mode, backends)
    times: dict[str, list[float]] = {name: [] for name in built}
    for call in range(repeats + 1):  # call 0 warms up (vLLM's compiled rank count)
        tokens = None
        for name, sampler in built.items():
            copy = logits.clone()
            meta = metadata(rows, seed=call)
            start = time.perf_counter()
            out = sampler(logits=copy, sampling_metadata=meta)
            elapsed = time.perf_counter() - start
            if tokens is None:
                tokens = out.sampled_token_ids
            elif not torch.equal(tokens, out.sampled_token_ids):
                raise SystemExit(f"{name} sampled other tokens than native ({rows}x{vocab})")
            if call:
                times[name].append(elapsed)
    return {
        name: {"best_ms": min(t) * 1e3, "median_ms": statistics.median(t) * 1e3}
        for name, t in times.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), metavar="ROWSxVOCAB")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--modes", nargs="+", default=["raw_logprobs"])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-goal", action="store_true", help="report only; never exit 1")
    args = parser.parse_args(argv)
    missed = []
    print(
        f"{'shape':>12} {'dtype':>9} {'mode':>19} {'method':>24} {'best ms':>9} "
        f"{'median ms':>10} {'x native':>9}"
    )
    for shape in args.shapes:
        rows, vocab = (int(part) for part in shape.split("x"))
        for dtype in args.dtypes:
            for mode in args.modes:
                result = measure(rows, vocab, dtype, mode, args.backends, args.repeats)
                native = result["native"]["best_ms"]
                for name, figures in result.items():
                    ratio = figures["best_ms"] / native
                    print(
                        f"{shape:>12} {dtype:>9} {mode:>19} {name:>24} "
                        f"{figures['best_ms']:9.2f} {figures['median_ms']:10.2f} {ratio:9.2f}"
                    )
                    if name != "native" and ratio > GOAL:
                        missed.append(f"{name} at {shape} {dtype} {mode}: {ratio:.2f}x")
    if missed:
        print(f"goal <= {GOAL}x native missed: " + "; ".join(missed))
        return 0 if args.no_goal else 1
    print(f"goal <= {GOAL}x native met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
