"""Benchmark of the ``selected_logprob`` backends against naive PyTorch and the logsumexp floor.

Owns the performance and memory targets of the production backends (see ``TARGETS`` below)
and how they are measured; knows nothing of the drift framework. Every (dtype, method) pair
runs in a fresh subprocess that builds the same deterministic inputs block by block and puts
them on ``--device`` (default: cuda when torch sees a GPU, else cpu), records its memory
baseline, runs one warm-up and ``--repeats`` timed calls (best reported; on cuda each call is
bracketed by ``torch.cuda.synchronize``) and reports the peak memory above the baseline: on
cuda ``torch.cuda.max_memory_allocated`` (after ``reset_peak_memory_stats``), on cpu the
resident-set high-water mark (reset through ``/proc/self/clear_refs``). Accuracy is max |diff|
against a float64 reference of the same (already rounded) inputs, computed on the device in row
blocks so it never needs a float64 [tokens, V] tensor. The vocabulary-parallel run uses NCCL
on cuda (two GPUs, one per rank) and gloo on cpu.

Usage:
    python benchmarks/bench_selected_logprob.py                      # N=4096, V=151,936
    python benchmarks/bench_selected_logprob.py --tokens 256 --vocab 32000   # quick run
    python benchmarks/bench_selected_logprob.py --device cpu         # the CPU on a GPU machine

Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "logprob_drift_operators"
METHODS = ("naive", "reference", "chunked", "logsumexp")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
LOGIT_SCALE = 3.0
GEN_ROWS = 128
FLAT_BOUND = 4e-6


def ensure_operators_importable() -> None:
    """Load ``operators/`` as ``logprob_drift_operators`` when the project is not installed."""
    if PACKAGE in sys.modules or importlib.util.find_spec(PACKAGE) is not None:
        return
    folder = REPO_ROOT / "operators"
    spec = importlib.util.spec_from_file_location(
        PACKAGE, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {PACKAGE} from {folder}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    spec.loader.exec_module(module)


# --------------------------------------------------------------------------- inputs


def make_inputs(
    tokens: int, vocab: int, dtype: torch.dtype, seed: int, columns: tuple[int, int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic logits (3 * N(0,1), row-block seeded) and token ids.

    ``columns`` keeps only a vocabulary slice, with values identical to the full tensor's.
    Built block by block, so the only large allocation is the result itself.
    """
    start, end = columns if columns is not None else (0, vocab)
    logits = torch.empty((tokens, end - start), dtype=dtype)
    for r0 in range(0, tokens, GEN_ROWS):
        r1 = min(r0 + GEN_ROWS, tokens)
        gen = torch.Generator().manual_seed(seed * 1_000_003 + r0)
        block = torch.randn((r1 - r0, vocab), generator=gen, dtype=torch.float32)
        logits[r0:r1] = block[:, start:end].mul_(LOGIT_SCALE)
    token_ids = torch.randint(0, vocab, (tokens,), generator=torch.Generator().manual_seed(seed))
    return logits, token_ids


def float64_reference(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    out = torch.empty(token_ids.shape, dtype=torch.float64, device=logits.device)
    for r0 in range(0, logits.shape[0], 64):
        block = torch.log_softmax(logits[r0 : r0 + 64].double(), dim=-1)
        out[r0 : r0 + 64] = block.gather(-1, token_ids[r0 : r0 + 64, None])[:, 0]
    return out


# --------------------------------------------------------------------------- memory probes


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued kernels (a no-op on cpu), so a wall time covers them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PeakMemory:
    """Peak memory above the baseline taken at ``start``: the CUDA caching allocator's
    ``max_memory_allocated`` on cuda, the process's RSS high-water mark on cpu."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.exact = True
        self.baseline = 0

    def start(self) -> None:
        if self.device.type == "cuda":
            synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = torch.cuda.memory_allocated(self.device)
            return
        self.baseline = _status_kib("VmRSS") * 1024
        self.exact = _reset_peak()
        if not self.exact:
            self.baseline = _status_kib("VmHWM") * 1024

    def extra_kib(self) -> int:
        if self.device.type == "cuda":
            synchronize(self.device)
            return (torch.cuda.max_memory_allocated(self.device) - self.baseline) // 1024
        return _status_kib("VmHWM") - self.baseline // 1024


# --------------------------------------------------------------------------- worker


def _method(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    ensure_operators_importable()
    from logprob_drift_operators.selected_logprob import (
        chunked_selected_logprob,
        reference_selected_logprob,
    )

    def naive(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits.float(), dim=-1).gather(-1, token_ids[:, None])[:, 0]

    def logsumexp(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(logits.float(), dim=-1)

    table: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
        "naive": naive,
        "reference": reference_selected_logprob,
        "chunked": chunked_selected_logprob,
        "logsumexp": logsumexp,
    }
    return table[name]


def _cpu_jiffies() -> tuple[int, int]:
    """(total, idle) jiffies of the whole machine from /proc/stat."""
    with open("/proc/stat") as handle:
        fields = [int(v) for v in handle.readline().split()[1:]]
    return sum(fields), fields[3] + fields[4]


def wait_for_quiet(max_wait_s: float, idle_fraction: float = 0.9) -> None:
    """Wait (bounded) until the machine was >= ``idle_fraction`` idle over one second."""
    deadline = time.monotonic() + max_wait_s
    while time.monotonic() < deadline:
        before = _cpu_jiffies()
        time.sleep(1.0)
        after = _cpu_jiffies()
        if (after[1] - before[1]) >= idle_fraction * max(1, after[0] - before[0]):
            return


def run_worker(args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    logits, token_ids = make_inputs(args.tokens, args.vocab, DTYPES[args.dtype], args.seed)
    logits, token_ids = logits.to(device), token_ids.to(device)
    if args.worker == "float64":
        torch.save(float64_reference(logits, token_ids).cpu(), args.out)
        return
    fn = _method(args.worker)
    result: torch.Tensor | None = fn(logits, token_ids)  # warm-up: code, threads, arenas
    synchronize(device)
    result = None
    memory = PeakMemory(device)
    memory.start()
    hz = os.sysconf("SC_CLK_TCK")
    timings: list[tuple[float, float]] = []  # (wall seconds, other processes' load in cores)
    for _ in range(args.repeats):
        result = None  # free the previous output before the next call
        wait_for_quiet(args.quiet_wait)
        jiffies, cpu = _cpu_jiffies(), time.process_time()
        synchronize(device)
        start = time.perf_counter()
        result = fn(logits, token_ids)
        synchronize(device)
        wall = time.perf_counter() - start
        after = _cpu_jiffies()
        busy = ((after[0] - jiffies[0]) - (after[1] - jiffies[1])) / hz
        timings.append((wall, max(0.0, busy - (time.process_time() - cpu)) / wall))
    peak_kib = memory.extra_kib()
    assert result is not None
    torch.save(result.cpu(), args.out)
    best = min(timings)
    print(
        json.dumps(
            {
                "best_s": best[0],
                "other_load": best[1],
                "times": timings,
                "peak_extra_kib": peak_kib,
                "exact_peak": memory.exact,
                "device": str(device),
            }
        )
    )


# --------------------------------------------------------------------------- vocab parallel


def _vp_rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    ensure_operators_importable()
    import torch.distributed as dist
    from logprob_drift_operators.selected_logprob.vocab_parallel import (
        shard_vocab,
        vocab_parallel_selected_logprob,
    )

    torch.set_num_threads(1)
    device = torch.device(args.device, rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=300),
    )
    try:
        start, end = shard_vocab(args.vocab, world, rank)
        local, token_ids = make_inputs(
            args.tokens, args.vocab, torch.float32, args.seed, columns=(start, end)
        )
        local, token_ids = local.to(device), token_ids.to(device)
        dist.barrier()
        synchronize(device)
        began = time.perf_counter()
        result = vocab_parallel_selected_logprob(local, token_ids, vocab_start=start)
        synchronize(device)
        elapsed = time.perf_counter() - began
        if rank == 0:
            torch.save(
                {
                    "result": result.cpu(),
                    "seconds": elapsed,
                    "backend": str(dist.get_backend()),
                    "shards": [shard_vocab(args.vocab, world, r) for r in range(world)],
                },
                out,
            )
    finally:
        dist.destroy_process_group()


def run_vocab_parallel(args: argparse.Namespace, out: str) -> None:
    import torch.multiprocessing as mp

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    mp.spawn(_vp_rank, args=(2, port, args, out), nprocs=2, join=True)


# --------------------------------------------------------------------------- driver


def _subprocess(args: argparse.Namespace, worker: str, dtype: str, out: str) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        worker,
        "--dtype",
        dtype,
        "--out",
        out,
        "--tokens",
        str(args.tokens),
        "--vocab",
        str(args.vocab),
        "--seed",
        str(args.seed),
        "--repeats",
        str(args.repeats),
        "--quiet-wait",
        str(args.quiet_wait),
        "--device",
        args.device,
    ]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=30.0,
        help="max seconds to wait for an idle machine before each timed call",
    )
    parser.add_argument("--skip-vocab-parallel", action="store_true")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=default_device(),
        help="where inputs live and kernels run (default: cuda when torch sees a GPU)",
    )
    parser.add_argument("--worker", choices=[*METHODS, "float64"], help=argparse.SUPPRESS)
    parser.add_argument("--dtype", choices=sorted(DTYPES), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        run_worker(args)
        return 0

    rows: dict[tuple[str, str], dict[str, Any]] = {}
    references: dict[str, torch.Tensor] = {}
    with tempfile.TemporaryDirectory(prefix="bench_slp_") as tmp:
        for dtype in DTYPES:
            ref_path = os.path.join(tmp, f"{dtype}-float64.pt")
            _subprocess(args, "float64", dtype, ref_path)
            references[dtype] = torch.load(ref_path, weights_only=True)
            for method in METHODS:
                out = os.path.join(tmp, f"{dtype}-{method}.pt")
                stats = _subprocess(args, method, dtype, out)
                result = torch.load(out, weights_only=True)
                if method != "logsumexp":
                    stats["max_diff"] = (result.double() - references[dtype]).abs().max().item()
                rows[(dtype, method)] = stats
                print(f"  measured {dtype:8s} {method:9s} {stats['best_s']:.3f}s", file=sys.stderr)
        vp: dict[str, Any] | None = None
        if args.device == "cuda" and torch.cuda.device_count() < 2 and not args.skip_vocab_parallel:
            print("  vocab_parallel skipped: NCCL with 2 ranks needs 2 GPUs", file=sys.stderr)
            args.skip_vocab_parallel = True
        if not args.skip_vocab_parallel:
            vp_path = os.path.join(tmp, "vocab-parallel.pt")
            run_vocab_parallel(args, vp_path)
            vp = torch.load(vp_path, weights_only=True)
            vp["max_diff"] = (vp["result"].double() - references["float32"]).abs().max().item()

    print(
        f"\nselected_logprob, N={args.tokens} tokens, V={args.vocab}, "
        f"logits {LOGIT_SCALE}*N(0,1); device {args.device}; {torch.get_num_threads()} threads; "
        "warm best of "
        f"{args.repeats}; other load = other processes' CPU use (cores) during the best call\n"
    )
    print(
        "| dtype | method | time (s) | x logsumexp | other load | peak extra (MiB) "
        "| max abs diff vs fp64 |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for (dtype, method), stats in rows.items():
        floor = rows[(dtype, "logsumexp")]["best_s"]
        diff = f"{stats['max_diff']:.2e}" if "max_diff" in stats else "n/a (floor)"
        print(
            f"| {dtype} | {method} | {stats['best_s']:.3f} | {stats['best_s'] / floor:.2f} | "
            f"{stats['other_load']:.2f} | {stats['peak_extra_kib'] / 1024:.1f} | {diff} |"
        )
    if vp is not None:
        print(
            f"\nvocab_parallel (2 {vp['backend']} ranks, 1 thread each, shards {vp['shards']}, "
            "float32): "
            f"max abs diff vs fp64 {vp['max_diff']:.2e}, rank-0 wall {vp['seconds']:.3f} s"
        )

    checks: list[tuple[str, bool]] = []
    for dtype in DTYPES:
        chunked, naive = rows[(dtype, "chunked")], rows[(dtype, "naive")]
        floor = rows[(dtype, "logsumexp")]
        checks += [
            (
                f"{dtype}: chunked peak extra <= naive/16 ({chunked['peak_extra_kib'] / 1024:.1f} "
                f"<= {naive['peak_extra_kib'] / 1024 / 16:.1f} MiB)",
                chunked["peak_extra_kib"] * 16 <= naive["peak_extra_kib"],
            ),
            (
                f"{dtype}: chunked time <= naive "
                f"({chunked['best_s']:.3f} <= {naive['best_s']:.3f} s)",
                chunked["best_s"] <= naive["best_s"],
            ),
            (
                f"{dtype}: chunked time <= 1.5x logsumexp "
                f"({chunked['best_s']:.3f} <= {1.5 * floor['best_s']:.3f} s)",
                chunked["best_s"] <= 1.5 * floor["best_s"],
            ),
            (
                f"{dtype}: chunked max|diff| <= {FLAT_BOUND:g} ({chunked['max_diff']:.2e})",
                chunked["max_diff"] <= FLAT_BOUND,
            ),
        ]
    fp32_chunked, fp32_naive = rows[("float32", "chunked")], rows[("float32", "naive")]
    checks.append(
        (
            f"float32: chunked max|diff| <= 2x naive's ({fp32_chunked['max_diff']:.2e} <= "
            f"{2 * fp32_naive['max_diff']:.2e})",
            fp32_chunked["max_diff"] <= 2 * fp32_naive["max_diff"],
        )
    )
    if vp is not None:
        checks.append(
            (
                f"vocab_parallel max|diff| <= {FLAT_BOUND:g} ({vp['max_diff']:.2e})",
                vp["max_diff"] <= FLAT_BOUND,
            )
        )
    print("\nTargets:")
    for text, ok in checks:
        print(f"- [{'PASS' if ok else 'FAIL'}] {text}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
