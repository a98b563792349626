"""Benchmark: attributing a 256-case x 100k-active-token run, against verifying the same run.

Builds a synthetic sealed run with ``synthetic_run.py`` (not timed), then, each in a fresh
interpreter so peak memory is the step's own, best of R rounds:

- verify:      ``check.verify.verify_run`` (every seal, every tensor file loaded, every verdict
               recomputed, and since issue 24 every case's importance-sampling figures
               recomputed and compared), what ``logprob-drift verify`` does for the attempts;
- attribution: loading every attempt's sealed scores and computing the attribution document
               (alignment, per-side movement, paired bootstrap of mean and p99 with 1,000
               resamples, each case's ESS, ranking), what the end of ``run`` does before
               sealing it;
- importance:  loading every attempt's ``token_diffs.pt`` and computing its importance-sampling
               figures (``numerics.importance_sampling``, issue 24), what ``verify`` and the
               report will add per case; ``compute_seconds`` is the figures alone.

Reports wall times, peak RSS (ru_maxrss of the child), attribution/verify (goal: <= 1x) and
importance/verify (goal: <= 0.25x).

    .venv/bin/python benchmarks/bench_attribution.py [--cases 256] [--samples 64]
        [--response 1600] [--rounds 2] [--dir D]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

STEP = r"""
import json, resource, sys, time
from pathlib import Path
run_dir, step = Path(sys.argv[1]), sys.argv[2]
import torch  # imported before timing: both steps need it, neither should pay for it
from pytest_logprob_drift.check.verify import verify_run
from pytest_logprob_drift.attribution.sealed import attribute_attempts
from pytest_logprob_drift.store.run import iter_attempt_dirs
from pytest_logprob_drift.numerics.importance_sampling import importance_sampling
from pytest_logprob_drift.store.layout import TOKEN_DIFFS
from pytest_logprob_drift.tensorio import tensors_from_bytes
compute = 0.0
start = time.perf_counter()
if step == "importance":
    detail = 0
    for attempt in iter_attempt_dirs(run_dir):
        diffs = tensors_from_bytes((attempt / TOKEN_DIFFS).read_bytes())
        began = time.perf_counter()
        importance_sampling(
            diffs["training_logprobs"], diffs["rollout_logprobs"], diffs["active_mask"]
        ).to_json()
        compute += time.perf_counter() - began
        detail += 1
elif step == "verify":
    statuses = verify_run(run_dir)
    assert all(s.status == "ok" for s in statuses), statuses[:3]
    detail = len(statuses)
else:
    attempts = list(iter_attempt_dirs(run_dir))
    baseline = next(a for a in attempts if json.loads(
        (a / "requested.json").read_text())["label"] == "baseline")
    document = attribute_attempts("bench", baseline, [], [a for a in attempts if a != baseline])
    detail = len(document["cases"])
elapsed = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(
    {"seconds": elapsed, "peak_mib": peak, "items": detail, "compute_seconds": compute}
))
"""


def measure(run_dir: Path, step: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", STEP, str(run_dir), step], check=True, capture_output=True, text=True
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=256)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--response", type=int, default=1600)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where to build the run (default: a temporary directory, on /dev/shm when it exists)",
    )
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from synthetic_run import build

    base = args.dir or Path(
        tempfile.mkdtemp(
            prefix="bench-attribution-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None
        )
    )
    try:
        run_dir = build(base, cases=args.cases, samples=args.samples, response=args.response)
        print(f"run: {args.cases} cases x {args.samples * args.response} active tokens ({run_dir})")
        best: dict[str, dict[str, float]] = {}
        for _ in range(args.rounds):
            for step in ("verify", "attribution", "importance"):
                result = measure(run_dir, step)
                if step not in best or result["seconds"] < best[step]["seconds"]:
                    best[step] = result
        for step, result in best.items():
            print(
                f"{step:12s} {result['seconds']:8.2f} s   peak RSS {result['peak_mib']:8.0f} "
                f"MiB   ({int(result['items'])} items)"
            )
        ratio = best["attribution"]["seconds"] / best["verify"]["seconds"]
        print(f"attribution / verify: {ratio:.2f}x (goal <= 1x)")
        importance = best["importance"]["seconds"] / best["verify"]["seconds"]
        figures_only = best["importance"]["compute_seconds"] / best["verify"]["seconds"]
        print(
            f"importance / verify: {importance:.2f}x with loading, {figures_only:.2f}x the "
            "figures alone (goal <= 0.25x)"
        )
        return 0 if ratio <= 1.0 and importance <= 0.25 else 1
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
