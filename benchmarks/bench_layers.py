"""Benchmark of the opt-in layer diagnostics (``diagnostics.layers``).

Owns the targets of issue 23 and how they are measured; knows nothing else of the framework.

1. ``tiny``: the experiment (default: the shipped deep-model bf16 experiment with layers on)
   runs once through ``logprob-drift run --runtime hf`` in this process. Per case, timers
   wrapped around the rollout's ``generate`` and the trainer's ``score`` (the case's scoring;
   engine construction is outside them) and around ``execute.case.layer_diagnostics`` (both
   sides' capture forwards, the reductions in the hooks and the figures) give the scoring and
   layer seconds. Target: layers <= 1x scoring per case.
2. ``s3``: the reduction alone (``numerics.layer_reduction.reduce_states``) on synthetic
   S3-shaped states: ``--states`` (default 37: embeddings + 36 layers) of ``--positions``
   (default 8 x 2048) x ``--hidden`` (default 4096) bfloat16, one state at a time as a hook
   sees it, the reductions kept and stacked as a capture keeps them. Reports the time, the
   peak extra resident memory over the input state (``ru_maxrss`` after minus before; the
   input buffer is allocated first and reused; the kept reductions count), and the
   bytes a side's reduction hands out of the process holding the states (what is sealed)
   against the float32 states it avoids. Target: peak extra <= 1/16 of those states.

Usage:
    python benchmarks/bench_layers.py tiny
    python benchmarks/bench_layers.py s3 [--positions 16384 --hidden 4096 --states 37]

Prints one JSON document. Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

DEFAULT_CONFIG = REPO_ROOT / "experiments" / "cross_config_s0_hf_deep_layers_bf16.json"


def _timed(store: list[float], fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            store.append(time.perf_counter() - start)

    return wrapper


def tiny(config: Path) -> dict[str, Any]:
    import torch

    from pytest_logprob_drift.cli import main as cli_main
    from pytest_logprob_drift.execute import case as case_module
    from pytest_logprob_drift.runtimes.transformers import adapter

    torch.set_num_threads(1)
    generate: list[float] = []
    score: list[float] = []
    layers: list[float] = []
    adapter.HfRollout.generate = _timed(generate, adapter.HfRollout.generate)  # type: ignore[method-assign]
    adapter.HfTrainingScorer.score = _timed(score, adapter.HfTrainingScorer.score)  # type: ignore[method-assign]
    case_module.layer_diagnostics = _timed(layers, case_module.layer_diagnostics)  # type: ignore[attr-defined]
    with tempfile.TemporaryDirectory() as artifacts:
        start = time.perf_counter()
        code = cli_main(
            ["run", str(config), "--runtime", "hf", "--artifacts", artifacts],
            out=io.StringIO(),
            err=io.StringIO(),
        )
        wall = time.perf_counter() - start
    cases = [
        {"scoring_s": g + s, "layers_s": lay, "ratio": lay / (g + s)}
        for g, s, lay in zip(generate, score, layers, strict=True)
    ]
    return {
        "config": str(config),
        "exit_code": code,
        "wall_s": wall,
        "cases": cases,
        "target": "layers_s <= 1.0 x scoring_s per case",
        "met": bool(cases) and all(c["ratio"] <= 1.0 for c in cases),
    }


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def s3(positions: int, hidden: int, states: int) -> dict[str, Any]:
    import torch

    from pytest_logprob_drift.numerics.layer_reduction import (
        DIGEST_BYTES,
        PROJECTION_DIM,
        projection_matrix,
        reduce_states,
        stack_reductions,
    )

    torch.set_num_threads(1)
    buffer = torch.randn((positions, hidden), dtype=torch.float32).to(torch.bfloat16)
    matrix = projection_matrix(hidden)
    where = torch.stack([torch.zeros(positions, dtype=torch.long), torch.arange(positions)], 1)
    before = _rss_bytes()
    start = time.perf_counter()
    kept = []
    for k in range(states):
        buffer[k % positions, 0] += 1  # another state, in the same buffer
        kept.append([reduce_states(buffer, matrix)])  # kept, as the hooks keep them
    side = stack_reductions(kept, where)  # what is sealed (and moved) per side
    elapsed = time.perf_counter() - start
    extra = _rss_bytes() - before
    avoided = states * positions * hidden * 4
    sealed = sum(t.numel() * t.element_size() for t in side.values())
    return {
        "shape": {"states": states, "positions": positions, "hidden": hidden},
        "seconds": elapsed,
        "peak_extra_bytes": extra,
        "float32_states_bytes": avoided,
        "sealed_bytes_per_side": sealed,
        "bytes_per_state_position": DIGEST_BYTES + 8 * PROJECTION_DIM + 8,
        "target": "peak_extra_bytes <= float32_states_bytes / 16",
        "met": extra <= avoided / 16,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="which", required=True)
    t = sub.add_parser("tiny")
    t.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    s = sub.add_parser("s3")
    s.add_argument("--positions", type=int, default=8 * 2048)
    s.add_argument("--hidden", type=int, default=4096)
    s.add_argument("--states", type=int, default=37)
    args = parser.parse_args(argv)
    result = (
        tiny(args.config) if args.which == "tiny" else s3(args.positions, args.hidden, args.states)
    )
    print(json.dumps(result, indent=2))
    return 0 if result["met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
