"""Benchmark: ``logprob-drift import --format nemo-rl`` against reading the same files with
``json.loads`` line by line.

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
- import:   ``production.importer.import_run`` (the command's work: parse, check, build the
            token grid, judge, the importance-sampling figures, seal every attempt, publish);
- import of the first S/4 steps, for the memory's dependence on the step count.

Reports seconds, tokens per second (S x B x T grid cells), peak RSS (``ru_maxrss``) of each
child and of a child that only imports torch and the importer, and the ratios. Goals: import
within 2x of the baseline's time, peak memory independent of the step count.

    .venv/bin/python benchmarks/bench_import.py [--steps 64] [--samples 256] [--tokens 4096]
        [--dir D] [--keep]
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


def child(mode: str, paths: list[str], artifacts: str) -> None:
    """One measurement in this process: prints seconds and peak RSS (MiB) as JSON."""
    start = time.perf_counter()
    if mode == "baseline":
        lines = 0
        for path in paths:
            with open(path, "rb") as f:
                for line in f:
                    json.loads(line)
                    lines += 1
        extra = {"lines": lines}
    elif mode == "import":
        from pytest_logprob_drift.config.contract import resolve_contract
        from pytest_logprob_drift.production.importer import import_run

        start = time.perf_counter()
        result = import_run(
            "nemo-rl",
            paths,
            artifacts=Path(artifacts),
            contract=resolve_contract("ws1", "current"),
        )
        extra = {
            "steps": len(result.cases),
            "outcomes": sorted({c.outcome.value for c in result.cases}),
            "run_dir": str(result.run_dir),
        }
    else:  # "idle": what importing torch and the importer costs
        from pytest_logprob_drift.production import importer  # noqa: F401

        extra = {}
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "peak_mib": peak, **extra}))


def measure(mode: str, paths: list[Path], artifacts: Path) -> dict[str, object]:
    command = [sys.executable, __file__, "--child", mode, "--artifacts-dir", str(artifacts)]
    command += [str(p) for p in paths]
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{out.stderr[-2000:]}")
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: temp)")
    parser.add_argument("--keep", action="store_true", help="keep the inputs and the runs")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--artifacts-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.paths, args.artifacts_dir)
        return 0
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench-import-"))
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
        idle = measure("idle", [], root / "unused")
        baseline = measure("baseline", paths, root / "unused")
        quarter = max(1, args.steps // 4)
        small = measure("import", paths[:quarter], root / "runs-quarter")
        full = measure("import", paths, root / "runs")
        cells = args.steps * args.samples * args.tokens
        b_s, i_s = float(baseline["seconds"]), float(full["seconds"])  # type: ignore[arg-type]
        print(
            f"json.loads line by line: {b_s:.2f} s, {cells / b_s / 1e6:.2f} M tokens/s, "
            f"peak RSS {baseline['peak_mib']:.0f} MiB"
        )
        print(
            f"import ({args.steps} steps):  {i_s:.2f} s, {cells / i_s / 1e6:.2f} M tokens/s, "
            f"peak RSS {full['peak_mib']:.0f} MiB; outcomes {full['outcomes']}"
        )
        print(
            f"import ({quarter} steps):  {float(small['seconds']):.2f} s, "  # type: ignore[arg-type]
            f"peak RSS {small['peak_mib']:.0f} MiB"
        )
        print(f"torch + importer imported, nothing read: peak RSS {idle['peak_mib']:.0f} MiB")
        print(f"import / json.loads time: {i_s / b_s:.2f}x (goal <= 2x)")
        grow = float(full["peak_mib"]) - float(small["peak_mib"])  # type: ignore[arg-type]
        print(
            f"peak RSS {args.steps} steps - {quarter} steps: {grow:+.0f} MiB "
            "(goal: independent of the step count)"
        )
        sealed = sum(f.stat().st_size for f in Path(str(full["run_dir"])).rglob("*") if f.is_file())
        print(f"sealed run: {sealed / 2**20:.0f} MiB")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept: {root}", file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
