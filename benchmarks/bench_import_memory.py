"""Benchmark: peak resident memory of ``logprob-drift import`` at its documented caps (issue 47).

Writes, outside the timed part, neutral-format inputs that sit at a cap:

- line: one sample whose JSONL line is ``--line-mib`` MiB (default: ``MAX_LINE_BYTES``, the
  longest line the importer reads);
- grid: one step of ``--samples`` rows, one of them long enough that the padded token grid
  has just under ``MAX_GRID_CELLS`` cells (the others one response token each: a small input
  that makes the largest grid a step may have);

then imports each in a fresh interpreter (``python -m pytest_logprob_drift import``) and
reports its exit code, its last stderr line and its peak RSS (``ru_maxrss`` of the child), and
the peak as a multiple of the input. With ``--limit-gib G`` the child runs under an address
space limit of G GiB (``RLIMIT_AS``), as the issue's probes did: an allocation that fails
must be one line ("out of memory", exit 3), never "internal error (a bug)".

    .venv/bin/python benchmarks/bench_import_memory.py [--case line|grid|both]
        [--line-mib M] [--samples S] [--limit-gib G] [--dir D]
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
from pathlib import Path

from pytest_logprob_drift.production.importer import MAX_GRID_CELLS
from pytest_logprob_drift.production.sources import MAX_LINE_BYTES


def _write_line(path: Path, target: int) -> None:
    """One neutral-format sample whose line is about ``target`` bytes (at most the cap)."""
    per_token = len(json.dumps([123456, -1.234567, -1.234568, 1])) - 4  # ids, 2 sides, mask
    tokens = max(2, (target - 200) // (per_token + 4))
    while True:
        row = {
            "step": 1,
            "sample": 0,
            "token_ids": [(7 * i) % 151_000 for i in range(tokens + 1)],
            "prompt_length": 1,
            "mask": [1] * tokens,
            "rollout_logprobs": [-1.234567 - (i % 7) * 1e-6 for i in range(tokens)],
            "training_logprobs": [-1.234568 - (i % 7) * 1e-6 for i in range(tokens)],
        }
        text = json.dumps(row)
        if len(text) < MAX_LINE_BYTES:
            break
        tokens = tokens * 95 // 100
    path.write_text(text + "\n")


def _write_grid(path: Path, samples: int) -> int:
    """One step whose padded grid has just under ``MAX_GRID_CELLS`` cells; its cell count."""
    width = MAX_GRID_CELLS // samples
    with path.open("w") as out:
        for sample in range(samples):
            length = width if sample == 0 else 2
            out.write(
                json.dumps(
                    {
                        "step": 1,
                        "sample": sample,
                        "token_ids": [(7 * i) % 151_000 for i in range(length)],
                        "prompt_length": 1,
                        "mask": [1] * (length - 1),
                        "rollout_logprobs": [-1.25] * (length - 1),
                        "training_logprobs": [-1.25] * (length - 1),
                    }
                )
                + "\n"
            )
    return samples * width


def _import(source: Path, artifacts: Path, limit_gib: float | None) -> dict[str, object]:
    def limit() -> None:
        if limit_gib is not None:
            size = int(limit_gib * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (size, size))

    err = artifacts.with_suffix(".stderr")
    with err.open("w") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-m", "pytest_logprob_drift", "import", "--format", "jsonl",
             str(source), "--artifacts", str(artifacts)],
            stdout=subprocess.DEVNULL, stderr=stderr, preexec_fn=limit,
        )  # fmt: skip
        _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage
        child.returncode = os.waitstatus_to_exitcode(status)
    lines = err.read_text().strip().splitlines()
    return {
        "exit": child.returncode,
        "stderr": lines[-1] if lines else "",
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "input_mib": round(source.stat().st_size / 2**20, 1),
        "peak_over_input": round(usage.ru_maxrss * 1024 / source.stat().st_size, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=("line", "grid", "both"), default="both")
    parser.add_argument("--line-mib", type=float, default=MAX_LINE_BYTES / 2**20)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--limit-gib", type=float, default=None)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(dir=args.dir, prefix="bench-import-memory-"))
    results: dict[str, object] = {
        "max_line_bytes": MAX_LINE_BYTES,
        "max_grid_cells": MAX_GRID_CELLS,
        "limit_gib": args.limit_gib,
    }
    try:
        if args.case in ("line", "both"):
            source = work / "line.jsonl"
            _write_line(source, int(args.line_mib * 2**20))
            results["line"] = _import(source, work / "line-out", args.limit_gib)
            source.unlink()
        if args.case in ("grid", "both"):
            source = work / "grid.jsonl"
            cells = _write_grid(source, args.samples)
            results["grid"] = {"cells": cells, **_import(source, work / "grid-out", args.limit_gib)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
