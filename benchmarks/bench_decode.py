"""Benchmark: decoding every sealed JSON document of a 256-case run, and `verify` / `report` on it.

Builds (not timed) the synthetic run of ``bench_report`` (256 cases through the real store,
with its sealed attribution), then times, best of R rounds, in this process:

- decode: every sealed JSON document of the run decoded into what its readers use: each
  attempt's ``COMPLETE``, ``comparison.json``, ``requested.json``, ``materialized.json``,
  ``actual.json`` and ``identity.json``, the run's ``experiment.json``, ``plan.jsonl`` and run
  seals, and ``attribution.json``. The bytes are read once before timing; only decoding is
  timed. On a tree with ``store.decode`` (the msgspec read model) through it; on an older tree
  through what it had (``store.files.json_document`` + ``read_comparison`` +
  ``shape_problem``), so the same script measures the commit before the change from a git
  worktree of it (``PYTHONPATH=WORKTREE python benchmarks/bench_decode.py``).

and, as the user runs them (a fresh interpreter), ``verify RUN --json`` and ``report RUN
--json``, and ``plan`` of the shipped S3 experiment against ``python -c pass``.

    .venv/bin/python benchmarks/bench_decode.py [--cases 256] [--samples 8] [--response 64]
        [--rounds 3] [--decode-only]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_report import build

from pytest_logprob_drift.store import layout

S3 = (
    Path(__file__).resolve().parent.parent
    / "experiments"
    / "cross_config_s3_qwen3_8b_tp4_cp4_bf16.json"
)


def _documents(run_dir: Path) -> dict[str, list[bytes]]:
    """The bytes of every sealed JSON document of the run, by kind."""
    found: dict[str, list[bytes]] = {}
    for attempt in sorted((run_dir / layout.CASES).glob("*/*")):
        for name in (
            layout.COMPLETE,
            layout.COMPARISON,
            layout.REQUESTED,
            layout.MATERIALIZED,
            layout.ACTUAL,
            layout.IDENTITY,
        ):
            found.setdefault(name, []).append((attempt / name).read_bytes())
    found["experiment"] = [(run_dir / layout.EXPERIMENT).read_bytes()]
    found["plan"] = [(run_dir / layout.PLAN).read_bytes()]
    found["run seals"] = [p.read_bytes() for p in sorted((run_dir / layout.SEALS).iterdir())]
    found["attribution"] = [
        p.read_bytes() for p in sorted(run_dir.glob(f"{layout.ATTRIBUTIONS}/*/attribution.json"))
    ]
    return found


def _new_decoders() -> dict[str, Callable[[bytes], object]]:
    from pytest_logprob_drift.attribution.document import read_attribution_bytes
    from pytest_logprob_drift.store import documents
    from pytest_logprob_drift.store.attempt import ATTEMPT_SEAL as SEAL
    from pytest_logprob_drift.store.comparison import parse_comparison
    from pytest_logprob_drift.store.decode import decode
    from pytest_logprob_drift.store.run import RUN_SEAL, parse_plan_log
    from pytest_logprob_drift.store.seal import parse_manifest

    return {
        layout.COMPLETE: lambda data: parse_manifest(data, SEAL, layout.COMPLETE),
        layout.COMPARISON: parse_comparison,
        **{name: _decoder(kind) for name, kind in documents.ATTEMPT_DOCUMENTS.items()},
        "experiment": lambda data: decode(data, documents.ExperimentDocument),
        "plan": parse_plan_log,
        "run seals": lambda data: parse_manifest(data, RUN_SEAL, "run seal"),
        "attribution": read_attribution_bytes,
    }


def _decoder(kind: type) -> Callable[[bytes], object]:
    from pytest_logprob_drift.store.decode import decode

    return lambda data: decode(data, kind)


def _old_decoders() -> dict[str, Callable[[bytes], object]]:
    from pytest_logprob_drift.attribution import sealed
    from pytest_logprob_drift.store.attempt import ATTEMPT_SEAL as SEAL
    from pytest_logprob_drift.store.comparison import parse_comparison
    from pytest_logprob_drift.store.documents import (  # type: ignore[attr-defined]
        DOCUMENT_SHAPES,
        EXPERIMENT_SHAPE,
        shape_problem,
    )
    from pytest_logprob_drift.store.files import json_document  # type: ignore[attr-defined]
    from pytest_logprob_drift.store.run import RUN_SEAL, parse_plan_log
    from pytest_logprob_drift.store.seal import parse_manifest

    def shaped(name: str) -> Callable[[bytes], object]:
        return lambda data: shape_problem(json_document(data), DOCUMENT_SHAPES[name])

    return {
        layout.COMPLETE: lambda data: parse_manifest(data, SEAL, layout.COMPLETE),
        layout.COMPARISON: lambda data: parse_comparison(json_document(data)),
        **{name: shaped(name) for name in DOCUMENT_SHAPES},
        "experiment": lambda data: shape_problem(json_document(data), EXPERIMENT_SHAPE),
        "plan": parse_plan_log,
        "run seals": lambda data: parse_manifest(data, RUN_SEAL, "run seal"),
        "attribution": lambda data: sealed._document_problem(json_document(data)),  # type: ignore[attr-defined]
    }


def _best(rounds: int, action: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - start)
    return best


def _command(*args: str | Path) -> Callable[[], object]:
    command = [sys.executable, "-m", "pytest_logprob_drift", *map(str, args)]
    return lambda: subprocess.run(command, capture_output=True, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=256)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--response", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--decode-only", action="store_true", help="skip the verify, report and plan timings"
    )
    args = parser.parse_args()
    new = importlib.util.find_spec("pytest_logprob_drift.store.decode") is not None
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = build(
            Path(scratch), cases=args.cases, samples=args.samples, response=args.response
        )
        documents = _documents(run_dir)
        decoders = _new_decoders() if new else _old_decoders()
        total = sum(len(d) for kind in documents.values() for d in kind)
        count = sum(len(kind) for kind in documents.values())

        def decode_all() -> None:
            for kind, items in documents.items():
                decoder = decoders[kind]
                for data in items:
                    decoder(data)

        seconds = _best(args.rounds, decode_all)
        print(f"read model: {'msgspec (store.decode)' if new else 'hand-written readers'}")
        print(f"decode: {count} documents, {total:,} bytes, best of {args.rounds}: {seconds:.4f} s")
        for kind, items in documents.items():
            decoder = decoders[kind]
            part = _best(args.rounds, lambda d=decoder, i=items: [d(x) for x in i])
            print(f"  {kind:18} {len(items):4} docs {part:.4f} s")
        if args.decode_only:
            return
        verify = _best(args.rounds, _command("verify", run_dir, "--json"))
        report = _best(args.rounds, _command("report", run_dir, "--json"))
        print(f"verify: {verify:.2f} s; report --json: {report:.2f} s")
    python = _best(args.rounds, lambda: subprocess.run([sys.executable, "-c", "pass"], check=True))
    plan = _best(args.rounds, _command("plan", S3))
    print(f"plan: {plan:.3f} s; python -c pass: {python:.3f} s; ratio {plan / python:.2f}")


if __name__ == "__main__":
    main()
