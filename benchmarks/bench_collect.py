"""Benchmark: ``pytest --collect-only`` of a 256-case config, and engine constructions.

1. Collection: writes the 256-case config of ``bench_plan.py`` (same folder) and times, in an
   empty test directory, interleaved, ``python -m pytest --collect-only -q --drift-config X``
   and ``python -m pytest --collect-only -q`` (the plugin installed, no config: what every
   test run of a repository that installs the plugin pays) against the baseline ``python -m
   pytest -p no:logprob_drift --collect-only -q`` (pytest without the plugin): best and median
   of N runs each, and their ratios to the baseline. Fails if the collection does not list 256
   items.
2. Engine lifecycle: runs a small one-at-a-time plan on the ``cpu-smoke`` runtime through the
   plugin and compares the engine constructions it reports with the number of distinct
   rollout / training construction fingerprints of the plan (the minimum). Fails if they
   differ.

    .venv/bin/python benchmarks/bench_collect.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_plan import EXPECTED_CASES, config_document

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.execute.protocol import bind_case

ROOT = Path(__file__).resolve().parents[1]
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]


def timed(cmd: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=cwd)
    return time.perf_counter() - start, result


def oat_document() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(
        (ROOT / "experiments" / "cross_config_s0_cpu_smoke.json").read_text(encoding="utf-8")
    )
    document["experiment_id"] = "bench-oat-lifecycle"
    document["interventions"] = [
        {"path": "batch.size", "values": [1, 2, 3]},
        {"path": "rollout.dtype", "values": ["bfloat16", "float16"]},
        {"path": "training.compute_dtype", "values": ["bfloat16"]},
        {"path": "logp.backend", "values": ["smoke_only.logp_offset"]},
    ]
    return document


def bench_collection(tmp: Path, runs: int) -> int:
    config = tmp / "bench_256.json"
    config.write_text(json.dumps(config_document(), indent=2), encoding="utf-8")
    empty = tmp / "empty"
    empty.mkdir()
    drift_cmd = [*PYTEST, "--collect-only", "-q", "--drift-config", str(config)]
    idle_cmd = [*PYTEST, "--collect-only", "-q"]
    plain_cmd = [*PYTEST, "-p", "no:logprob_drift", "--collect-only", "-q"]

    _, check = timed(drift_cmd, empty)
    if check.returncode != 0 or f"{EXPECTED_CASES} tests collected" not in check.stdout:
        print(
            f"collection failed (exit {check.returncode}):\n{check.stdout[-2000:]}"
            f"{check.stderr[-2000:]}",
            file=sys.stderr,
        )
        return 1
    timed(idle_cmd, empty)  # warm the file cache for all three before measuring
    timed(plain_cmd, empty)
    drift_times: list[float] = []
    idle_times: list[float] = []
    plain_times: list[float] = []
    for _ in range(runs):  # interleaved, so machine load affects all alike
        elapsed, result = timed(drift_cmd, empty)
        if result.returncode != 0:
            print(f"collection failed (exit {result.returncode})", file=sys.stderr)
            return 1
        drift_times.append(elapsed)
        idle_times.append(timed(idle_cmd, empty)[0])
        plain_times.append(timed(plain_cmd, empty)[0])

    drift_best, drift_median = min(drift_times), statistics.median(drift_times)
    idle_best, idle_median = min(idle_times), statistics.median(idle_times)
    plain_best, plain_median = min(plain_times), statistics.median(plain_times)
    print(
        f"collection: {EXPECTED_CASES} drift items; runs: {runs}; python {sys.version.split()[0]}"
    )
    for name, best, median in (
        ("pytest --collect-only --drift-config (256)", drift_best, drift_median),
        ("pytest --collect-only (plugin, no config)", idle_best, idle_median),
        ("pytest -p no:logprob_drift --collect-only", plain_best, plain_median),
    ):
        print(f"{name:<44}best {best * 1000:8.1f} ms   median {median * 1000:8.1f} ms")
    for name, best, median in (
        ("ratio drift/no plugin", drift_best, drift_median),
        ("ratio plugin without config/no plugin", idle_best, idle_median),
    ):
        print(f"{name:<44}best {best / plain_best:8.2f}x     median {median / plain_median:8.2f}x")
    print(
        f"per item above pytest without the plugin    best "
        f"{(drift_best - plain_best) / EXPECTED_CASES * 1000:8.2f} ms"
    )
    return 0


def bench_constructions(tmp: Path) -> int:
    config = tmp / "oat.json"
    config.write_text(json.dumps(oat_document(), indent=2), encoding="utf-8")
    execution_plan = plan_file(str(config))
    identity = execution_plan.plan.identity
    bindings = [
        bind_case(ec, runtime_kind="cpu-smoke", identity=identity, device="cpu")
        for ec in execution_plan.cases
    ]
    distinct = (
        len({b.rollout_construction_fingerprint for b in bindings}),
        len({b.training_construction_fingerprint for b in bindings}),
    )
    elapsed, result = timed(
        [
            *PYTEST,
            "-q",
            "--drift-config",
            str(config),
            "--drift-runtime",
            "cpu-smoke",
            "--drift-allow-smoke-operators",
            "--drift-artifacts",
            str(tmp / "runs"),
        ],
        tmp,
    )
    match = re.search(r"engine constructions: rollout (\d+), training (\d+)", result.stdout)
    summary = re.search(r"^(\d+ PASS.*)$", result.stdout, re.MULTILINE)
    if match is None:
        print(
            f"no engine construction line (exit {result.returncode}):\n"
            f"{result.stdout[-2000:]}{result.stderr[-2000:]}",
            file=sys.stderr,
        )
        return 1
    built = (int(match.group(1)), int(match.group(2)))
    print(
        f"engine lifecycle: one-at-a-time plan, {len(bindings)} cases on cpu-smoke "
        f"({elapsed:.1f} s; outcomes: {summary.group(1) if summary else '?'})"
    )
    print(f"engine constructions     rollout {built[0]:3d}   training {built[1]:3d}")
    print(
        f"distinct fingerprints    rollout {distinct[0]:3d}   training {distinct[1]:3d}"
        f"   -> {'equal (minimum)' if built == distinct else 'DIFFERENT'}"
    )
    return 0 if built == distinct else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-collect-") as name:
        tmp = Path(name)
        return bench_collection(tmp, args.runs) or bench_constructions(tmp)


if __name__ == "__main__":
    raise SystemExit(main())
