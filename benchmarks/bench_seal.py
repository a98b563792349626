"""Benchmark: sealing and verifying large tensor artifacts against plain SHA-256.

Serializes N float32 tensors of S MiB each (``torch.save`` to bytes, as the runner does; not
timed), then times, best of R rounds, in a fresh attempt directory each round:

- seal:   ``AttemptWriter.write_bytes`` for every file (exclusive temporary, write with each
          byte hashed once while it is written, hard link, unlink; the file fsynced in the
          background while the next is written) and ``seal()`` (wait for every fsync, fsync the
          directory, then COMPLETE, fsynced);
- verify: ``read_seal`` (parse COMPLETE, list the directory, refuse links and non-regular
          files, re-hash every sealed file from disk, each byte read and hashed once), as
          resume and ``verify`` do first for every attempt;
- plain:  ``hashlib.sha256`` over the same in-memory bytes, each byte hashed once.

and reports the times, throughputs and the ratios seal/plain (goal <= 1.5x), verify/plain
(goal <= 1.1x) and (seal+verify)/plain. Just-written files are read back from the page cache,
as an immediate resume or ``verify`` would. Exits nonzero if a seal fails to verify.

    .venv/bin/python benchmarks/bench_seal.py [--tensors 4] [--mib 64] [--rounds 3] [--dir D]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from pytest_logprob_drift.store.attempt import AttemptWriter, read_seal


def serialized_tensors(count: int, mib: int) -> dict[str, bytes]:
    generator = torch.Generator().manual_seed(0)
    elements = mib * (1 << 20) // 4
    payloads = {}
    for i in range(count):
        buffer = io.BytesIO()
        torch.save({"logprobs": torch.randn(elements, generator=generator)}, buffer)
        payloads[f"tensor_{i}.pt"] = buffer.getvalue()
    return payloads


def time_plain(payloads: dict[str, bytes]) -> float:
    start = time.perf_counter()
    digests = [hashlib.sha256(data).hexdigest() for data in payloads.values()]
    elapsed = time.perf_counter() - start
    assert len(digests) == len(payloads)
    return elapsed


def time_seal_and_verify(
    payloads: dict[str, bytes], root: Path, round_index: int
) -> tuple[float, float]:
    case_dir = root / f"round-{round_index}" / "case"
    start = time.perf_counter()
    writer = AttemptWriter(case_dir, "case", "bench-execution-key")
    for name, data in payloads.items():
        writer.write_bytes(name, data)
    seal = writer.seal()
    sealed = time.perf_counter()
    checked = read_seal(writer.directory)
    verified = time.perf_counter()
    if checked.files != seal.files or set(seal.files) != set(payloads):
        raise SystemExit("seal does not verify")
    expected = {name: hashlib.sha256(data).hexdigest() for name, data in payloads.items()}
    if dict(checked.files) != expected:
        raise SystemExit("sealed digests differ from plain SHA-256 of the same bytes")
    return sealed - start, verified - sealed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensors", type=int, default=4)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--dir", default=None, help="where attempts are written (default: a temporary directory)"
    )
    args = parser.parse_args(argv)

    payloads = serialized_tensors(args.tensors, args.mib)
    total = sum(len(d) for d in payloads.values())
    root = Path(tempfile.mkdtemp(prefix="bench-seal-", dir=args.dir))
    try:
        plain, seal, verify = [], [], []
        for r in range(args.rounds):
            plain.append(time_plain(payloads))
            s, v = time_seal_and_verify(payloads, root, r)
            seal.append(s)
            verify.append(v)
            shutil.rmtree(root / f"round-{r}")
    finally:
        shutil.rmtree(root, ignore_errors=True)

    best_plain, best_seal, best_verify = min(plain), min(seal), min(verify)
    best_both = min(s + v for s, v in zip(seal, verify, strict=True))
    mib = total / (1 << 20)
    print(
        f"{args.tensors} x {args.mib} MiB float32 tensors, {mib:.1f} MiB serialized, "
        f"best of {args.rounds}, attempts under {root.parent}"
    )
    print(f"  plain sha256 (each byte once): {best_plain:8.3f} s  {mib / best_plain:8.0f} MiB/s")
    print(f"  seal (write+fsync+sha256):     {best_seal:8.3f} s  {mib / best_seal:8.0f} MiB/s")
    print(f"  verify (read_seal re-hash):    {best_verify:8.3f} s  {mib / best_verify:8.0f} MiB/s")
    print(f"  seal + verify:                 {best_both:8.3f} s")
    print(
        f"  ratio (seal+verify)/plain: {best_both / best_plain:.2f}x   "
        f"seal/plain: {best_seal / best_plain:.2f}x   "
        f"verify/plain: {best_verify / best_plain:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
