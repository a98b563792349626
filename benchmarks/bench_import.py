"""Benchmark: ``logprob-drift import --format nemo-rl`` at the size of a real run.

Writes S synthetic NeMo-RL ``train_data_step<N>.jsonl`` files of B samples of T tokens each, as
NeMo-RL's ``Logger.log_batched_dict_as_jsonl`` writes GRPO's dump (one ``json.dumps`` line per
sample: ``content``, ``rewards``, ``input_lengths``, ``token_ids``, ``token_loss_mask``,
``sample_loss_mask``, ``advantages``, ``generation_logprobs``, ``prev_logprobs`` as ``[[...]]``
/ ``[x]``, ``idx``; float32 logprobs written as Python floats, prompts of T/4 tokens, responses
padded to the batch maximum, a few planted drifts). To keep the set-up short, one step file is
generated and the others are byte copies of it (each is still read, parsed, judged and sealed as
its own step). Then, each in a fresh child process after one warm-up read of every file (so
both read from the page cache):

- baseline: every line of every file through ``json.loads``, nothing kept;
- import:   ``python -m pytest_logprob_drift import --format nemo-rl`` (parse, check, build
            the token grid, judge, the figures and gates, seal every attempt, publish);
- import of the first ``--small`` steps, for the memory's dependence on the step count;
- ``verify`` and ``report --json`` of the imported run (``report`` writes its page too).

With ``--busy N``, N busy loops (``while True: pass`` in child processes) run beside the
baseline and the import, as on a shared machine. Reports seconds (wall, and CPU for the
baseline and the import), peak RSS (``ru_maxrss`` of each child), the ratios and the sealed
run's size against the input's. Goals (issue 58): import at most 1.0x the baseline, with or
without busy loops; sealed run at most 0.6x the input; ``report`` within 1.5x of ``verify``;
peak memory independent of the step count.

    .venv/bin/python benchmarks/bench_import.py [--steps 20] [--small 5] [--samples 512]
        [--tokens 1024] [--busy N] [--dir D] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

THRESHOLD_DRIFT = 2e-4


def write_step_file(path: Path, samples: int, tokens: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    prompt = tokens // 4
    with open(path, "w") as f:
        for i in range(samples):
            length = int(rng.integers(tokens // 2, tokens + 1)) if i else tokens
            ids = rng.integers(0, 151_000, size=length).tolist() + [0] * (tokens - length)
            mask = [0] * prompt + [1] * (length - prompt) + [0] * (tokens - length)
            gen = np.zeros(tokens, dtype=np.float32)
            gen[1:length] = -rng.exponential(1.0, size=length - 1).astype(np.float32)
            prev = gen.copy()
            prev[1:length] += rng.uniform(-THRESHOLD_DRIFT, THRESHOLD_DRIFT, length - 1).astype(
                np.float32
            )
            if i % 64 == 5:
                prev[prompt + 3] += np.float32(0.01)  # a planted mismatch
            sample = {
                "content": [f"prompt {i} ... response {i}"],
                "rewards": [float(i % 2)],
                "input_lengths": [length],
                "token_ids": [ids],
                "token_loss_mask": [mask],
                "sample_loss_mask": [1.0],
                "advantages": [[0.5 if m else 0.0 for m in mask]],
                "generation_logprobs": [gen.tolist()],
                "prev_logprobs": [prev.tolist()],
            }
            f.write(json.dumps({**sample, "idx": i}) + "\n")


def make_inputs(directory: Path, steps: int, samples: int, tokens: int) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    first = directory / "train_data_step1.jsonl"
    write_step_file(first, samples, tokens)
    paths = [first]
    for step in range(2, steps + 1):
        path = directory / f"train_data_step{step}.jsonl"
        shutil.copyfile(first, path)
        paths.append(path)
    return paths


def child(mode: str, paths: list[str]) -> None:
    """The baseline in this process: prints seconds and peak RSS (MiB) as JSON."""
    start = time.perf_counter()
    lines = 0
    for path in paths:
        with open(path, "rb") as f:
            for line in f:
                json.loads(line)
                lines += 1
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cpu = time.process_time()
    print(json.dumps({"seconds": seconds, "cpu": cpu, "peak_mib": peak, "lines": lines}))


def baseline(paths: list[Path]) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", "baseline", *map(str, paths)]
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"baseline failed:\n{out.stderr[-2000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def command(*args: str) -> dict[str, float]:
    """``python -m pytest_logprob_drift ARGS`` in a child: its wall seconds, its own CPU
    seconds and peak RSS (``os.wait4``'s rusage) and the lines it printed."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen(
            [sys.executable, "-m", "pytest_logprob_drift", *args], stdout=out, stderr=err
        )
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        printed, errors = out.read().decode(), err.read().decode()
    if child.returncode not in (0, 1):
        raise SystemExit(f"{args[0]} exited {child.returncode}:\n{errors[-2000:]}")
    return {
        "seconds": seconds,
        "cpu": usage.ru_utime + usage.ru_stime,
        "peak_mib": usage.ru_maxrss / 1024,
        "lines": len(printed.splitlines()),
    }


def import_run(paths: list[Path], artifacts: Path, name: str) -> dict[str, float]:
    return command(
        "import",
        "--format",
        "nemo-rl",
        "--artifacts",
        str(artifacts),
        "--experiment-id",
        name,
        *map(str, paths),
    )


def size_of(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def busy_loops(count: int) -> list[subprocess.Popen[bytes]]:
    loop = [sys.executable, "-c", "while True: pass"]
    return [subprocess.Popen(loop) for _ in range(count)]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--small", type=int, default=5, help="steps of the smaller import")
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside the timings")
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: temp)")
    parser.add_argument("--keep", action="store_true", help="keep the inputs and the runs")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.paths)
        return 0
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench-import-"))
    loops: list[subprocess.Popen[bytes]] = []
    try:
        start = time.perf_counter()
        paths = make_inputs(root / "logs", args.steps, args.samples, args.tokens)
        made = time.perf_counter() - start
        size = sum(p.stat().st_size for p in paths)
        print(
            f"inputs: {args.steps} steps x {args.samples} samples x {args.tokens} tokens, "
            f"{size / 2**20:.0f} MiB of JSONL (made in {made:.1f} s)"
        )
        for path in paths:  # warm the page cache once for both readers
            with open(path, "rb") as f:
                while f.read(1 << 24):
                    pass
        loops = busy_loops(args.busy)
        base = baseline(paths)
        small_steps = max(1, min(args.small, args.steps))
        small = import_run(paths[:small_steps], root / "runs", "small")
        full = import_run(paths, root / "runs", "full")
        for loop in loops:
            loop.kill()
            loop.wait()
        loops = []
        run = root / "runs" / "full"
        verify = command("verify", str(run))
        report = command("report", "--json", str(run), "--html", str(root / "report.html"))
        text = command("report", str(run), "--html", str(root / "report-text.html"))
        cells = args.steps * args.samples * args.tokens
        b_s, i_s = base["seconds"], full["seconds"]
        sealed = size_of(run)
        busy = f" beside {args.busy} busy loops" if args.busy else ""
        print(
            f"json.loads line by line{busy}: {b_s:.2f} s, {cells / b_s / 1e6:.2f} M tokens/s, "
            f"peak RSS {base['peak_mib']:.0f} MiB"
        )
        print(
            f"import ({args.steps} steps){busy}: {i_s:.2f} s, {cells / i_s / 1e6:.2f} M "
            f"tokens/s, peak RSS {full['peak_mib']:.0f} MiB"
        )
        print(
            f"import ({small_steps} steps){busy}: {small['seconds']:.2f} s, "
            f"peak RSS {small['peak_mib']:.0f} MiB"
        )
        print(f"import / json.loads time: {i_s / b_s:.2f}x (goal <= 1.0x)")
        print(
            f"import / json.loads CPU seconds (user + sys, less sensitive to other jobs): "
            f"{full['cpu']:.2f} s / {base['cpu']:.2f} s = {full['cpu'] / base['cpu']:.2f}x"
        )
        print(
            f"peak RSS {args.steps} steps - {small_steps} steps: "
            f"{full['peak_mib'] - small['peak_mib']:+.0f} MiB (goal: independent of the step count)"
        )
        print(
            f"sealed run: {sealed / 2**20:.0f} MiB, {sealed / size:.2f}x the input (goal <= 0.6x)"
        )
        print(
            f"verify: {verify['seconds']:.2f} s, peak RSS {verify['peak_mib']:.0f} MiB; "
            f"report --json: {report['seconds']:.2f} s, peak RSS {report['peak_mib']:.0f} MiB "
            f"({report['seconds'] / verify['seconds']:.2f}x verify, goal <= 1.5x); "
            f"report (text): {text['seconds']:.2f} s, {text['lines']:.0f} lines"
        )
        return 0
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept: {root}", file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
