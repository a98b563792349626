"""Benchmark of the full-vocabulary divergence reductions against one ``torch.logsumexp`` pass.

Owns the targets of ``numerics.full_vocabulary.full_vocab_divergence`` (see ``main``)
and how they are measured; knows nothing of the rest of the framework. Every (dtype, method)
pair runs in a fresh subprocess that builds the same deterministic inputs (two [N, V] sides:
rollout logits 3 * N(0,1), training = rollout + 0.05 * N(0,1), in the benchmarked dtype),
records its resident-set baseline, resets the high-water mark (``/proc/self/clear_refs``), runs
one warm-up and ``--repeats`` timed calls (best reported) and reports the peak RSS above the
baseline. ``logsumexp`` is ``torch.logsumexp(logits.float(), -1)`` over one side (the floor
the issue names), ``logsumexp_both`` the same over both sides, ``naive`` the float64-free
textbook computation with full [N, V] float32 log-softmax tensors (whose peak is the "naive
[N, V] float32 memory"). Accuracy: max |diff| of the streamed KL / TV against a float64
reference on the first ``--check-rows`` rows. On CUDA (``--device cuda``) memory is
``torch.cuda.max_memory_allocated`` above the inputs.

Usage:
    python benchmarks/bench_full_vocab.py                          # N=4096, V=151,936
    python benchmarks/bench_full_vocab.py --tokens 256 --vocab 32000   # quick run

Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from pytest_logprob_drift.numerics.full_vocabulary import full_vocab_divergence  # noqa: E402
from pytest_logprob_drift.numerics.sampling import Truncation  # noqa: E402
from pytest_logprob_drift.numerics.semantic_offset import processed_residual  # noqa: E402

METHODS = ("logsumexp", "logsumexp_both", "naive", "streamed", "offset_residual")
OFFSET_TRUNCATION = Truncation(temperature=0.7, top_p=0.9)
"""The semantic-offset diagnostic's second explanation (``processed_residual``) is measured
at temperature 0.7 with top_p 0.9 (its costliest form: a full sort per row). It is evidence
beside the reductions, with no target of its own."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
LOGIT_SCALE = 3.0
NOISE = 0.05
GEN_ROWS = 128


def make_inputs(
    tokens: int, vocab: int, dtype: torch.dtype, seed: int, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic, row-block seeded; the only large allocations are the results."""
    rollout = torch.empty((tokens, vocab), dtype=dtype, device=device)
    training = torch.empty((tokens, vocab), dtype=dtype, device=device)
    for r0 in range(0, tokens, GEN_ROWS):
        r1 = min(r0 + GEN_ROWS, tokens)
        gen = torch.Generator().manual_seed(seed * 1_000_003 + r0)
        block = torch.randn((r1 - r0, vocab), generator=gen) * LOGIT_SCALE
        rollout[r0:r1] = block.to(device)
        training[r0:r1] = (block + NOISE * torch.randn((r1 - r0, vocab), generator=gen)).to(device)
    return rollout, training


def _naive(rollout: torch.Tensor, training: torch.Tensor) -> torch.Tensor:
    lp = torch.log_softmax(rollout.float(), -1)
    lq = torch.log_softmax(training.float(), -1)
    p, q = lp.exp(), lq.exp()
    kl = (p * (lp - lq)).sum(-1)
    return torch.stack([kl, (q * (lq - lp)).sum(-1), 0.5 * (p - q).abs().sum(-1)])


def _method(name: str) -> Callable[[torch.Tensor, torch.Tensor], Any]:
    table: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
        "logsumexp": lambda r, t: torch.logsumexp(r.float(), -1),
        "logsumexp_both": lambda r, t: (
            torch.logsumexp(r.float(), -1),
            torch.logsumexp(t.float(), -1),
        ),
        "naive": _naive,
        "streamed": lambda r, t: full_vocab_divergence(r, t),
        "offset_residual": lambda r, t: processed_residual(
            torch.zeros(r.shape[0]), t, r.argmax(-1), OFFSET_TRUNCATION
        ),
    }
    return table[name]


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _accuracy(rollout: torch.Tensor, training: torch.Tensor, rows: int) -> float:
    r, t = rollout[:rows], training[:rows]
    got = full_vocab_divergence(r, t)
    lp, lq = torch.log_softmax(r.double(), -1), torch.log_softmax(t.double(), -1)
    p, q = lp.exp(), lq.exp()
    want = {
        "kl_rollout_training": (p * (lp - lq)).sum(-1),
        "kl_training_rollout": (q * (lq - lp)).sum(-1),
        "total_variation": 0.5 * (p - q).abs().sum(-1),
    }
    return max(float((getattr(got, k) - v).abs().max()) for k, v in want.items())


def run_worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads or torch.get_num_threads())
    rollout, training = make_inputs(
        args.tokens, args.vocab, DTYPES[args.dtype], args.seed, args.device
    )
    fn = _method(args.worker)
    result: Any = fn(rollout, training)  # warm-up
    _sync(args.device)
    result = None
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
    else:
        baseline = _status_kib("VmRSS") * 1024
        if not _reset_peak():
            baseline = _status_kib("VmHWM") * 1024
    times: list[float] = []
    for _ in range(args.repeats):
        result = None
        _sync(args.device)
        start = time.perf_counter()
        result = fn(rollout, training)
        _sync(args.device)
        times.append(time.perf_counter() - start)
    if args.device == "cuda":
        peak = torch.cuda.max_memory_allocated() - baseline
    else:
        peak = _status_kib("VmHWM") * 1024 - baseline
    stats: dict[str, Any] = {"best_s": min(times), "times": times, "peak_extra_bytes": peak}
    del result
    if args.worker == "streamed":
        stats["max_abs_diff"] = _accuracy(rollout, training, args.check_rows)
    stats["threads"] = torch.get_num_threads()
    print(json.dumps(stats))


def _subprocess(args: argparse.Namespace, worker: str, dtype: str) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        worker,
        "--dtype",
        dtype,
        "--tokens",
        str(args.tokens),
        "--vocab",
        str(args.vocab),
        "--seed",
        str(args.seed),
        "--repeats",
        str(args.repeats),
        "--device",
        args.device,
        "--check-rows",
        str(args.check_rows),
        "--threads",
        str(args.threads),
    ]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=3600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    stats: dict[str, Any] = json.loads(lines[-1])
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--check-rows", type=int, default=64)
    parser.add_argument("--skip-naive", action="store_true", help="no naive run (saves memory)")
    parser.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--dtype", choices=sorted(DTYPES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        run_worker(args)
        return 0

    naive_bytes = args.tokens * args.vocab * 4
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for dtype in DTYPES:
        for method in METHODS:
            if method == "naive" and args.skip_naive:
                continue
            stats = _subprocess(args, method, dtype)
            rows[(dtype, method)] = stats
            print(f"  measured {dtype:8s} {method:14s} {stats['best_s']:.3f}s", file=sys.stderr)

    print(
        f"\nfull-vocabulary divergence (KL both ways, TV, support masses), N={args.tokens}, "
        f"V={args.vocab}, device {args.device}, {rows[('float32', 'streamed')]['threads']} "
        f"threads, warm best of {args.repeats}; naive [N, V] float32 = "
        f"{naive_bytes / 2**20:.0f} MiB\n"
    )
    print("| dtype | method | time (s) | x logsumexp | peak extra (MiB) | x naive [N,V] f32 |")
    print("|---|---|---:|---:|---:|---:|")
    for (dtype, method), stats in rows.items():
        floor = rows[(dtype, "logsumexp")]["best_s"]
        print(
            f"| {dtype} | {method} | {stats['best_s']:.3f} | {stats['best_s'] / floor:.2f} | "
            f"{stats['peak_extra_bytes'] / 2**20:.1f} | "
            f"{stats['peak_extra_bytes'] / naive_bytes:.4f} |"
        )
    checks: list[tuple[str, bool]] = []
    for dtype in DTYPES:
        streamed, floor = rows[(dtype, "streamed")], rows[(dtype, "logsumexp")]
        checks += [
            (
                f"{dtype}: time <= 2x logsumexp ({streamed['best_s']:.3f} <= "
                f"{2 * floor['best_s']:.3f} s)",
                streamed["best_s"] <= 2 * floor["best_s"],
            ),
            (
                f"{dtype}: peak extra <= naive [N, V] float32 / 16 "
                f"({streamed['peak_extra_bytes'] / 2**20:.1f} <= "
                f"{naive_bytes / 16 / 2**20:.1f} MiB)",
                streamed["peak_extra_bytes"] * 16 <= naive_bytes,
            ),
            (
                f"{dtype}: max |diff| of KL/TV vs float64 <= 1e-5 ({streamed['max_abs_diff']:.2e})",
                streamed["max_abs_diff"] <= 1e-5,
            ),
        ]
    print(
        "\noffset_residual: the semantic-offset diagnostic's processed-logprob recomputation "
        f"(temperature {OFFSET_TRUNCATION.temperature}, top_p {OFFSET_TRUNCATION.top_p}: "
        "a sort per row), one side; no target"
    )
    print("\nTargets:")
    for text, ok in checks:
        print(f"- [{'PASS' if ok else 'FAIL'}] {text}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
